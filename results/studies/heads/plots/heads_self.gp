# Restyle freely and rerun: gnuplot heads_self.gp (data in heads_self.dat)
set terminal pngcairo size 1100,800 font ',11'
set output 'heads_self.png'
set grid
set key below left Left reverse noenhanced
set logscale x 2
set xtics (1, 2, 4, 8, 16)
set xrange [0.8:20]
set logscale y
set xlabel 'heads h (d_model = 512, d_k = d_model / h)' noenhanced
set ylabel 'attention weight on itself'
set title 'attention weight on itself per head (bars: range over heads), N = 512' noenhanced
plot 'heads_self.dat' index 0 using 1:2:3:4 with yerrorlines lw 2 pt 7 title "separate W_Q, W_K", \
     'heads_self.dat' index 1 using 1:2:3:4 with yerrorlines lw 2 pt 7 title "W_Q = W_K (tied)", \
     0.001953125 with lines dt 2 lw 2 title 'uniform attention'
