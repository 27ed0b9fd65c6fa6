# Restyle freely and rerun: gnuplot time_vs_n.gp (data in time_vs_n.dat)
set terminal pngcairo size 1100,800 font ',11'
if (!exists("output")) output = 'time_vs_n.png'
set output output
set grid
set key below left Left reverse maxcols 2 noenhanced
set logscale x 2
set logscale y
set xlabel 'sequence length N'
set ylabel 'seconds per forward call'
set title "Time vs N (B=1, H=8, D=64, causal none, input 'gaussian:temp=0.5')" noenhanced
plot 'time_vs_n.dat' index 0 using 1:2 with linespoints lw 2 pt 7 title "full", \
     'time_vs_n.dat' index 1 using 1:2 with linespoints lw 2 pt 7 title "linear", \
     'time_vs_n.dat' index 2 using 1:2 with linespoints lw 2 pt 7 title "delta", \
     'time_vs_n.dat' index 3 using 1:2 with linespoints lw 2 pt 7 title "retnet", \
     'time_vs_n.dat' index 4 using 1:2 with linespoints lw 2 pt 7 title "gla", \
     'time_vs_n.dat' index 5 using 1:2 with linespoints lw 2 pt 7 title "gated-delta"
