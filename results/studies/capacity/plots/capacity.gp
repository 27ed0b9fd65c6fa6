# Restyle freely and rerun: gnuplot capacity.gp (data in capacity.dat)
set terminal pngcairo size 1100,800 font ',11'
set output 'capacity.png'
set grid
set key below left Left reverse maxcols 3 noenhanced font ',9'
set logscale x 2
set yrange [0:1.05]
set xlabel 'stored pairs S (d_key = 64)' noenhanced
set ylabel 'retrieval error (scale-free, median over seeds)'
set title 'Fast-weight memory capacity: sum rule (solid), delta rule (dash-dot), feature-space bound (dashed); dotted: the paper' noenhanced
set arrow from 60, graph 0 to 60, graph 1 nohead dt 3 lw 2 lc rgb 'grey30'
set label "paper: elu+1 ~60" at 60, graph 0.03 rotate by 90 offset -0.8,0 font ',9' noenhanced
set arrow from 128, graph 0 to 128, graph 1 nohead dt 3 lw 2 lc rgb 'grey30'
set label "DPFP 1: 128" at 128, graph 0.03 rotate by 90 offset -0.8,0 font ',9' noenhanced
set arrow from 256, graph 0 to 256, graph 1 nohead dt 3 lw 2 lc rgb 'grey30'
set label "DPFP 2: 256" at 256, graph 0.03 rotate by 90 offset -0.8,0 font ',9' noenhanced
set arrow from 384, graph 0 to 384, graph 1 nohead dt 3 lw 2 lc rgb 'grey30'
set label "DPFP 3: 384" at 384, graph 0.03 rotate by 90 offset -0.8,0 font ',9' noenhanced
plot 'capacity.dat' index 0 using 1:2 with linespoints lw 2 pt 7 ps 0.6 lc rgb '#000000' title "softmax", \
     'capacity.dat' index 1 using 1:2 with linespoints lw 2 pt 7 ps 0.6 lc rgb '#d62728' title "linear elu+1, sum", \
     'capacity.dat' index 2 using 1:2 with linespoints lw 2 pt 7 ps 0.6 lc rgb '#1f77b4' title "DPFP nu=1, sum", \
     'capacity.dat' index 3 using 1:2 with linespoints lw 2 pt 7 ps 0.6 lc rgb '#2ca02c' title "DPFP nu=2, sum", \
     'capacity.dat' index 4 using 1:2 with linespoints lw 2 pt 7 ps 0.6 lc rgb '#9467bd' title "DPFP nu=3, sum", \
     'capacity.dat' index 5 using 1:2 with linespoints lw 2 pt 7 ps 0.6 lc rgb '#ff7f0e' title "FAVOR+ m=256, sum", \
     'capacity.dat' index 6 using 1:2 with linespoints dt 4 lw 2 pt 5 ps 0.6 lc rgb '#d62728' title "linear elu+1, delta", \
     'capacity.dat' index 7 using 1:2 with linespoints dt 4 lw 2 pt 5 ps 0.6 lc rgb '#1f77b4' title "DPFP nu=1, delta", \
     'capacity.dat' index 8 using 1:2 with linespoints dt 4 lw 2 pt 5 ps 0.6 lc rgb '#2ca02c' title "DPFP nu=2, delta", \
     'capacity.dat' index 9 using 1:2 with linespoints dt 4 lw 2 pt 5 ps 0.6 lc rgb '#9467bd' title "DPFP nu=3, delta", \
     'capacity.dat' index 10 using 1:2 with linespoints dt 4 lw 2 pt 5 ps 0.6 lc rgb '#ff7f0e' title "FAVOR+ m=256, delta", \
     'capacity.dat' index 11 using 1:2 with lines dt 2 lw 2 lc rgb '#d62728' title "elu+1: bound", \
     'capacity.dat' index 12 using 1:2 with lines dt 2 lw 2 lc rgb '#1f77b4' title "DPFP nu=1: bound", \
     'capacity.dat' index 13 using 1:2 with lines dt 2 lw 2 lc rgb '#2ca02c' title "DPFP nu=2: bound", \
     'capacity.dat' index 14 using 1:2 with lines dt 2 lw 2 lc rgb '#9467bd' title "DPFP nu=3: bound", \
     'capacity.dat' index 15 using 1:2 with lines dt 2 lw 2 lc rgb '#ff7f0e' title "FAVOR+ m=256: bound"
