# Restyle freely and rerun: gnuplot spectrum.gp (data in spectrum.dat)
set terminal pngcairo size 1100,800 font ',11'
set output 'spectrum.png'
set grid
set key below left Left reverse maxcols 3 noenhanced
set logscale x 2
set yrange [0:1.02]
set xlabel 'singular value index k'
set ylabel 'normalised cumulative singular value'
set title 'Spectrum of P = softmax(QK^T/sqrt(d)), N = 512' noenhanced
set arrow from 128, graph 0 to 128, graph 1 nohead dt 2 lw 2
set label 'Linformer: k = 128' at 128, graph 0.97 offset 1,0
plot 'spectrum.dat' index 0 using 1:2 with lines lw 2 title "gaussian:temp=1 (input)", \
     'spectrum.dat' index 1 using 1:2 with lines lw 2 title "gaussian:temp=0.5 (input)", \
     'spectrum.dat' index 2 using 1:2 with lines lw 2 title "lowrank:r=8 (input)", \
     'spectrum.dat' index 3 using 1:2 with lines lw 2 title "local:width=32 (input)", \
     'spectrum.dat' index 4 using 1:2 with lines lw 2 title "layer 1 (model)", \
     'spectrum.dat' index 5 using 1:2 with lines lw 2 title "layer 2 (model)", \
     'spectrum.dat' index 6 using 1:2 with lines lw 2 title "layer 3 (model)", \
     'spectrum.dat' index 7 using 1:2 with lines lw 2 title "layer 4 (model)", \
     'spectrum.dat' index 8 using 1:2 with lines lw 2 title "layer 5 (model)", \
     'spectrum.dat' index 9 using 1:2 with lines lw 2 title "layer 6 (model)"
