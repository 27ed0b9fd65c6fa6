# Restyle freely and rerun: gnuplot swap_error_vs_n.gp (data in swap_error_vs_n.dat)
set terminal pngcairo size 1100,800 font ',11'
set output 'swap_error_vs_n.png'
set grid
set key below left Left reverse maxcols 2 noenhanced
set logscale xy
set format y '10^{%L}'
set xlabel 'sequence length N'
set ylabel 'rel. Frobenius distance from full, last layer'
set title 'Each variant in the same model (6 layers, d_model 512): output error by N' noenhanced
plot 'swap_error_vs_n.dat' index 0 using 1:2 with linespoints lw 2 pt 7 title "sliding:left=128,right=128,dilation=1,global=0", \
     'swap_error_vs_n.dat' index 1 using 1:2 with linespoints lw 2 pt 7 title "linformer:k=256,share=kv,init=gaussian,max_len=4096,seed=0", \
     'swap_error_vs_n.dat' index 2 using 1:2 with linespoints lw 2 pt 7 title "bigbird:block=64,window=3,global=2,random=3,seed=0", \
     'swap_error_vs_n.dat' index 3 using 1:2 with linespoints lw 2 pt 7 title "linear:feature=elu1,m=256,nu=1,rule=sum,beta=1,eps=1e-06,seed=1", \
     'swap_error_vs_n.dat' index 4 using 1:2 with linespoints lw 2 pt 7 title "linear:feature=favor,m=256,nu=1,rule=sum,beta=1,eps=1e-06,seed=1"
