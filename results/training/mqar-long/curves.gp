set terminal pngcairo size 1200,480 noenhanced
set output 'curves.png'
set multiplot layout 1,2 title 'mqar-long'
set key bottom right font ',8'
set xlabel 'step'
set ylabel 'held-out accuracy %'
set grid
plot 'curves.dat' index 0 using 1:2 with linespoints title 'full', 'curves.dat' index 2 using 1:2 with linespoints title 'linear:feature=elu1,m=256,nu=1,rule=sum,beta=1,eps=1e-06,seed=1', 'curves.dat' index 4 using 1:2 with linespoints title 'linear:feature=dpfp,m=256,nu=1,rule=sum,beta=1,eps=1e-06,seed=1', 'curves.dat' index 6 using 1:2 with linespoints title 'linear:feature=favor,m=256,nu=1,rule=sum,beta=1,eps=1e-06,seed=1'
set key top right font ',8'
set ylabel 'training loss (mean of 20 steps)'
plot 'curves.dat' index 1 using 1:2 with lines title 'full', 'curves.dat' index 3 using 1:2 with lines title 'linear:feature=elu1,m=256,nu=1,rule=sum,beta=1,eps=1e-06,seed=1', 'curves.dat' index 5 using 1:2 with lines title 'linear:feature=dpfp,m=256,nu=1,rule=sum,beta=1,eps=1e-06,seed=1', 'curves.dat' index 7 using 1:2 with lines title 'linear:feature=favor,m=256,nu=1,rule=sum,beta=1,eps=1e-06,seed=1'
unset multiplot
