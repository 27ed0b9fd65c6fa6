# Restyle freely and rerun: gnuplot pareto_n8192.gp (data in pareto_n8192.dat)
set terminal pngcairo size 1100,800 font ',11'
if (!exists("output")) output = 'pareto_n8192.png'
set output output
set grid
set logscale xy
set format y '10^{%L}'
set key below left Left reverse maxcols 2 noenhanced
set offsets graph 0.05, graph 0.35, graph 0.1, graph 0.05
set xlabel 'speed-up over full (time of full / time of the spec, same run)'
set ylabel "relative error vs fp64 softmax attention (||out - ref||_F / ||ref||_F, dimensionless)"
set title "Error vs speed-up of the softmax approximations, N = 8192 (B=1, H=8, D=64, causal none unless a series says otherwise)" noenhanced
plot 'pareto_n8192.dat' index 0 using 1:2 with points ps 1.2 lc rgb '#1f77b4' pt 7 title "all points, input gaussian:temp=0.5", \
     'pareto_n8192.dat' index 1 using 1:2 with linespoints lw 3 ps 1.5 lc rgb '#d62728' pt 5 title "Pareto frontier, input gaussian:temp=0.5", \
     'pareto_n8192.dat' index 1 using 1:2:3 with labels offset char 1,0.6 left font ',8' tc rgb '#d62728' noenhanced notitle, \
     'pareto_n8192.dat' index 2 using 1:2 with points ps 1.2 lc rgb '#2ca02c' pt 9 title "all points, input local:width=32", \
     'pareto_n8192.dat' index 3 using 1:2 with linespoints lw 3 ps 1.5 lc rgb '#ff7f0e' pt 13 title "Pareto frontier, input local:width=32", \
     'pareto_n8192.dat' index 3 using 1:2:3 with labels offset char 1,0.6 left font ',8' tc rgb '#ff7f0e' noenhanced notitle
