# Restyle freely and rerun: gnuplot time_vs_n.gp (data in time_vs_n.dat)
set terminal pngcairo size 1100,800 font ',11'
if (!exists("output")) output = 'time_vs_n.png'
set output output
set grid
set key below left Left reverse maxcols 2 noenhanced
set logscale x 2
set xlabel 'sequence length N (tokens)'
set logscale y
set ylabel 'time per forward call (s)'
set title "Time vs N (B=1, H=8, D=64, causal none, input 'gaussian:temp=0.5')" noenhanced
plot 'time_vs_n.dat' index 0 using 1:2 with linespoints lw 2 lc rgb '#1f77b4' pt 7 title "full", \
     'time_vs_n.dat' index 1 using 1:2 with linespoints lw 2 lc rgb '#d62728' pt 5 title "bigbird", \
     'time_vs_n.dat' index 2 using 1:2 with linespoints lw 2 lc rgb '#2ca02c' pt 9 title "linformer:k=128,share=kv,max_len=16384", \
     'time_vs_n.dat' index 3 using 1:2 with linespoints lw 2 lc rgb '#ff7f0e' pt 13 title "sliding", \
     'time_vs_n.dat' index 4 using 1:2 with linespoints lw 2 lc rgb '#9467bd' pt 11 title "moba", \
     'time_vs_n.dat' index 5 using 1:2 with linespoints lw 2 lc rgb '#8c564b' pt 15 title "linear", \
     'time_vs_n.dat' index 6 using 1:2 with linespoints lw 2 lc rgb '#e377c2' pt 6 title "delta", \
     'time_vs_n.dat' index 7 using 1:2 with linespoints lw 2 lc rgb '#17becf' pt 4 title "retnet", \
     'time_vs_n.dat' index 8 using 1:2 with linespoints lw 2 lc rgb '#bcbd22' pt 8 title "gla", \
     'time_vs_n.dat' index 9 using 1:2 with linespoints lw 2 lc rgb '#7f7f7f' pt 12 title "gated-delta", \
     'time_vs_n.dat' index 10 using 1:2 with linespoints lw 2 lc rgb '#000080' pt 10 title "kda", \
     'time_vs_n.dat' index 11 using 1:2 with linespoints lw 2 lc rgb '#800000' pt 14 title "delta-product", \
     'time_vs_n.dat' index 12 using 1:2 with linespoints lw 2 lc rgb '#008080' pt 1 title "peer:numpy", \
     'time_vs_n.dat' index 13 using 1:2 with linespoints lw 2 lc rgb '#ff1493' pt 2 title "peer:torch"
