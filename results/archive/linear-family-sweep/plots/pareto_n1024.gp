# Restyle freely and rerun: gnuplot pareto_n1024.gp (data in pareto_n1024.dat)
set terminal pngcairo size 1100,800 font ',11'
if (!exists("output")) output = 'pareto_n1024.png'
set output output
set grid
set logscale xy
set format y '10^{%L}'
set key below left Left reverse maxcols 2 noenhanced
set offsets graph 0.05, graph 0.35, graph 0.1, graph 0.05
set xlabel 'speed-up over full (same run)'
set ylabel 'relative Frobenius error'
set title "Error vs speed-up, N = 1024 (B=1, H=8, D=64, causal none)" noenhanced
plot 'pareto_n1024.dat' index 0 using 1:2 with points pt 7 ps 1.2 lc rgb '#b8c4e8' title "all points, gaussian:temp=0.5", \
     'pareto_n1024.dat' index 1 using 1:2 with linespoints lw 3 pt 7 ps 1.5 lc rgb '#1f3a93' title "Pareto frontier, gaussian:temp=0.5", \
     'pareto_n1024.dat' index 1 using 1:2:3 with labels offset char 1,0.6 left font ',8' tc rgb '#1f3a93' noenhanced notitle, \
     'pareto_n1024.dat' index 2 using 1:2 with points pt 7 ps 1.2 lc rgb '#f2c9a8' title "all points, local:width=32", \
     'pareto_n1024.dat' index 3 using 1:2 with linespoints lw 3 pt 7 ps 1.5 lc rgb '#c0561b' title "Pareto frontier, local:width=32", \
     'pareto_n1024.dat' index 3 using 1:2:3 with labels offset char 1,0.6 left font ',8' tc rgb '#c0561b' noenhanced notitle
