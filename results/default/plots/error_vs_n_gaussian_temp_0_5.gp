# Restyle freely and rerun: gnuplot error_vs_n_gaussian_temp_0_5.gp (data in error_vs_n_gaussian_temp_0_5.dat)
set terminal pngcairo size 1100,800 font ',11'
if (!exists("output")) output = 'error_vs_n_gaussian_temp_0_5.png'
set output output
set grid
set key below left Left reverse maxcols 2 noenhanced
set logscale x 2
set xlabel 'sequence length N (tokens)'
set logscale y
set format y '10^{%L}'
set ylabel "relative error vs fp64 softmax attention (||out - ref||_F / ||ref||_F, dimensionless)"
set title "Error of the softmax approximations vs N, input gaussian:temp=0.5 (B=1, H=8, D=64, causal none)" noenhanced
plot 'error_vs_n_gaussian_temp_0_5.dat' index 0 using 1:2 with linespoints lw 2 lc rgb '#1f77b4' pt 7 title "full", \
     'error_vs_n_gaussian_temp_0_5.dat' index 1 using 1:2 with linespoints lw 2 lc rgb '#d62728' pt 5 title "bigbird", \
     'error_vs_n_gaussian_temp_0_5.dat' index 2 using 1:2 with linespoints lw 2 lc rgb '#2ca02c' pt 9 title "linformer:k=128,share=kv,max_len=16384", \
     'error_vs_n_gaussian_temp_0_5.dat' index 3 using 1:2 with linespoints lw 2 lc rgb '#ff7f0e' pt 13 title "sliding", \
     'error_vs_n_gaussian_temp_0_5.dat' index 4 using 1:2 with linespoints lw 2 lc rgb '#9467bd' pt 11 title "moba", \
     'error_vs_n_gaussian_temp_0_5.dat' index 5 using 1:2 with linespoints lw 2 lc rgb '#8c564b' pt 15 title "linear", \
     'error_vs_n_gaussian_temp_0_5.dat' index 6 using 1:2 with linespoints lw 2 lc rgb '#e377c2' pt 6 title "peer:numpy", \
     'error_vs_n_gaussian_temp_0_5.dat' index 7 using 1:2 with linespoints lw 2 lc rgb '#17becf' pt 4 title "peer:torch"
