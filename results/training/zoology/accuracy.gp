set terminal pngcairo noenhanced size 1260,520
set output 'accuracy.png'
set multiplot layout 1,3
set logscale x 2
set xrange [24.615384615384613:166.4]
set xtics (32, 64, 128)
set yrange [0:1.05]
set xlabel 'd_model'
set ylabel 'held-out accuracy'
set grid
set bmargin 10
set key at screen 0.5, 0.02 center bottom vertical maxrows 3
set title 'N = 64, 4 pairs'
plot 'variant-0.dat' index 0 using 1:2:3 with yerrorlines title 'full', 'variant-1.dat' index 0 using 1:2:3 with yerrorlines title 'linear', 'variant-2.dat' index 0 using 1:2:3 with yerrorlines title 'gated-delta', 'variant-3.dat' index 0 using 1:2:3 with yerrorlines title 'sliding:left=16,right=0', 'variant-4.dat' index 0 using 1:2:3 with yerrorlines title 'linear+short-conv', 'variant-5.dat' index 0 using 1:2:3 with yerrorlines title 'gated-delta+short-conv', 'variant-6.dat' index 0 using 1:2:3 with yerrorlines title 'gated-delta+short-conv+head-norm', 'variant-7.dat' index 0 using 1:2:3 with yerrorlines title 'linear:feature=dpfp'
unset key
set title 'N = 128, 8 pairs'
plot 'variant-0.dat' index 1 using 1:2:3 with yerrorlines title 'full', 'variant-1.dat' index 1 using 1:2:3 with yerrorlines title 'linear', 'variant-2.dat' index 1 using 1:2:3 with yerrorlines title 'gated-delta', 'variant-3.dat' index 1 using 1:2:3 with yerrorlines title 'sliding:left=16,right=0', 'variant-4.dat' index 1 using 1:2:3 with yerrorlines title 'linear+short-conv', 'variant-5.dat' index 1 using 1:2:3 with yerrorlines title 'gated-delta+short-conv', 'variant-6.dat' index 1 using 1:2:3 with yerrorlines title 'gated-delta+short-conv+head-norm', 'variant-7.dat' index 1 using 1:2:3 with yerrorlines title 'linear:feature=dpfp'
unset key
set title 'N = 256, 16 pairs'
plot 'variant-0.dat' index 2 using 1:2:3 with yerrorlines title 'full', 'variant-1.dat' index 2 using 1:2:3 with yerrorlines title 'linear', 'variant-2.dat' index 2 using 1:2:3 with yerrorlines title 'gated-delta', 'variant-3.dat' index 2 using 1:2:3 with yerrorlines title 'sliding:left=16,right=0', 'variant-4.dat' index 2 using 1:2:3 with yerrorlines title 'linear+short-conv', 'variant-5.dat' index 2 using 1:2:3 with yerrorlines title 'gated-delta+short-conv', 'variant-6.dat' index 2 using 1:2:3 with yerrorlines title 'gated-delta+short-conv+head-norm', 'variant-7.dat' index 2 using 1:2:3 with yerrorlines title 'linear:feature=dpfp'
unset key
unset multiplot
