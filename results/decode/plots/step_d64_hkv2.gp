# Restyle freely and rerun: gnuplot step_d64_hkv2.gp (data in step_d64_hkv2.dat)
set terminal pngcairo size 1100,800 font ',11'
if (!exists("output")) output = 'step_d64_hkv2.png'
set output output
set grid
set key below left Left reverse maxcols 2 noenhanced
set logscale x 2
set logscale y
set xlabel 'context (tokens held)'
set ylabel 'seconds per decoded token'
set title "Step time vs context (D = 64, Hkv = 2)" noenhanced
plot 'step_d64_hkv2.dat' index 0 using 1:2 with linespoints lw 2 lc rgb '#1f77b4' pt 7 title "full", \
     'step_d64_hkv2.dat' index 1 using 1:2 with linespoints lw 2 lc rgb '#d62728' pt 5 title "bigbird:block=64,window=3,global=2,random=3,seed=0", \
     'step_d64_hkv2.dat' index 2 using 1:2 with linespoints lw 2 lc rgb '#2ca02c' pt 9 title "sliding:left=128,right=128,dilation=1,global=0", \
     'step_d64_hkv2.dat' index 3 using 1:2 with linespoints lw 2 lc rgb '#ff7f0e' pt 13 title "linear:feature=elu1,m=256,nu=1,rule=sum,beta=1,eps=1e-06,seed=1", \
     'step_d64_hkv2.dat' index 4 using 1:2 with linespoints lw 2 lc rgb '#9467bd' pt 11 title "delta:beta=1", \
     'step_d64_hkv2.dat' index 5 using 1:2 with linespoints lw 2 lc rgb '#8c564b' pt 15 title "retnet:schedule=retnet", \
     'step_d64_hkv2.dat' index 6 using 1:2 with linespoints lw 2 lc rgb '#e377c2' pt 6 title "gla", \
     'step_d64_hkv2.dat' index 7 using 1:2 with linespoints lw 2 lc rgb '#17becf' pt 4 title "gated-delta:beta=1", \
     'step_d64_hkv2.dat' index 8 using 1:2 with linespoints lw 2 lc rgb '#bcbd22' pt 8 title "kda:beta=1", \
     'step_d64_hkv2.dat' index 9 using 1:2 with linespoints lw 2 lc rgb '#7f7f7f' pt 12 title "delta-product:steps=1,beta=1"
