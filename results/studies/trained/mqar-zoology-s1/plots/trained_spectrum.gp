# Restyle freely and rerun: gnuplot trained_spectrum.gp (data in trained_spectrum.dat)
set terminal pngcairo size 1100,800 font ',11'
if (!exists("output")) output = 'trained_spectrum.png'
set output output
set grid
set key below left Left reverse maxcols 2 noenhanced
set logscale x 2
set yrange [0:1.02]
set xlabel 'singular value index k'
set ylabel 'normalised cumulative singular value'
set title 'Spectrum of P, trained and untrained, N = 64' noenhanced
plot 'trained_spectrum.dat' index 0 using 1:2 with lines lw 2 title "trained, layer 1 (mean of heads)", \
     'trained_spectrum.dat' index 1 using 1:2 with lines lw 2 title "trained, layer 2 (mean of heads)", \
     'trained_spectrum.dat' index 2 using 1:2 with lines lw 2 title "untrained, layer 1 (mean of heads)", \
     'trained_spectrum.dat' index 3 using 1:2 with lines lw 2 title "untrained, layer 2 (mean of heads)", \
     'trained_spectrum.dat' index 4 using 1:2 with lines lw 2 title "uniform attention, same mask"
