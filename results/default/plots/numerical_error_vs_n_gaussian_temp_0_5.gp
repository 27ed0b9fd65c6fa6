# Restyle freely and rerun: gnuplot numerical_error_vs_n_gaussian_temp_0_5.gp (data in numerical_error_vs_n_gaussian_temp_0_5.dat)
set terminal pngcairo size 1100,800 font ',11'
if (!exists("output")) output = 'numerical_error_vs_n_gaussian_temp_0_5.png'
set output output
set grid
set key below left Left reverse maxcols 2 noenhanced
set logscale x 2
set xlabel 'sequence length N (tokens)'
set logscale y
set format y '10^{%L}'
set ylabel "relative error vs its own fp64 definition (||out - ref||_F / ||ref||_F, dimensionless)"
set title "Numerical error of the variants that are not softmax attention vs N, input gaussian:temp=0.5 (B=1, H=8, D=64, causal none)" noenhanced
plot 'numerical_error_vs_n_gaussian_temp_0_5.dat' index 0 using 1:2 with linespoints lw 2 lc rgb '#1f77b4' pt 7 title "delta", \
     'numerical_error_vs_n_gaussian_temp_0_5.dat' index 1 using 1:2 with linespoints lw 2 lc rgb '#d62728' pt 5 title "retnet", \
     'numerical_error_vs_n_gaussian_temp_0_5.dat' index 2 using 1:2 with linespoints lw 2 lc rgb '#2ca02c' pt 9 title "gla", \
     'numerical_error_vs_n_gaussian_temp_0_5.dat' index 3 using 1:2 with linespoints lw 2 lc rgb '#ff7f0e' pt 13 title "gated-delta", \
     'numerical_error_vs_n_gaussian_temp_0_5.dat' index 4 using 1:2 with linespoints lw 2 lc rgb '#9467bd' pt 11 title "kda", \
     'numerical_error_vs_n_gaussian_temp_0_5.dat' index 5 using 1:2 with linespoints lw 2 lc rgb '#8c564b' pt 15 title "delta-product"
