# Restyle freely and rerun: gnuplot error_vs_n_local_width_32.gp (data in error_vs_n_local_width_32.dat)
set terminal pngcairo size 1100,800 font ',11'
if (!exists("output")) output = 'error_vs_n_local_width_32.png'
set output output
set grid
set key below left Left reverse maxcols 2 noenhanced
set logscale x 2
set logscale y
set format y '10^{%L}'
set xlabel 'sequence length N'
set ylabel 'relative Frobenius error vs fp64 exact'
set title "Error vs N, input local:width=32" noenhanced
plot 'error_vs_n_local_width_32.dat' index 0 using 1:2 with linespoints lw 2 pt 7 title "full", \
     'error_vs_n_local_width_32.dat' index 1 using 1:2 with linespoints lw 2 pt 7 title "bigbird", \
     'error_vs_n_local_width_32.dat' index 2 using 1:2 with linespoints lw 2 pt 7 title "linformer:k=128,share=kv,max_len=16384", \
     'error_vs_n_local_width_32.dat' index 3 using 1:2 with linespoints lw 2 pt 7 title "sliding", \
     'error_vs_n_local_width_32.dat' index 4 using 1:2 with linespoints lw 2 pt 7 title "linear", \
     'error_vs_n_local_width_32.dat' index 5 using 1:2 with linespoints lw 2 pt 7 title "peer:numpy", \
     'error_vs_n_local_width_32.dat' index 6 using 1:2 with linespoints lw 2 pt 7 title "peer:torch"
