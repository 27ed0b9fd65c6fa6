# Restyle freely and rerun: gnuplot symmetry.gp (data in symmetry.dat)
set terminal pngcairo size 1100,800 font ',11'
set output 'symmetry.png'
set grid
set key below left Left reverse noenhanced
set logscale y
set xtics 1
set xlabel 'layer'
set ylabel 'mean attention weight a token pays itself'
set title 'Self-attention weight, tied and separate W_Q, W_K (mean over heads), N = 512' noenhanced
plot 'symmetry.dat' index 0 using 1:2 with linespoints lw 2 pt 7 title "separate W_Q, W_K", \
     'symmetry.dat' index 1 using 1:2 with linespoints lw 2 pt 7 title "W_Q = W_K (tied)", \
     'symmetry.dat' index 2 using 1:2 with linespoints lw 2 pt 7 title "uniform attention (1/N)"
