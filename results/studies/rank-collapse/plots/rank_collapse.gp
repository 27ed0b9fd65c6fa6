# Restyle freely and rerun: gnuplot rank_collapse.gp (data in rank_collapse.dat)
set terminal pngcairo size 1100,800 font ',11'
set output 'rank_collapse.png'
set grid
set key below left Left reverse maxcols 3 noenhanced
set logscale y
set format y '10^{%L}'
set xlabel 'depth (layers)'
set ylabel '||X - X_1||_F / ||X||_F (X_1: best rank-1 approximation)'
set title 'Rank collapse with depth (median over seeds)' noenhanced
plot 'rank_collapse.dat' index 0 using 1:2 with linespoints lw 2 pt 7 title "pure attention", \
     'rank_collapse.dat' index 1 using 1:2 with linespoints lw 2 pt 7 title "+ skip", \
     'rank_collapse.dat' index 2 using 1:2 with linespoints lw 2 pt 7 title "+ FFN", \
     'rank_collapse.dat' index 3 using 1:2 with linespoints lw 2 pt 7 title "+ LayerNorm", \
     'rank_collapse.dat' index 4 using 1:2 with linespoints lw 2 pt 7 title "Transformer (all three, post-LN)", \
     'rank_collapse.dat' index 5 using 1:2 with linespoints lw 2 pt 7 title "pure attention, X_0 std 1"
