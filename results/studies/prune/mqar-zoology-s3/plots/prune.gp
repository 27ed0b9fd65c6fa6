# Restyle freely and rerun: gnuplot prune.gp (data in prune.dat)
set terminal pngcairo size 1100,800 font ',11'
if (!exists("output")) output = 'prune.png'
set output output
set grid
set key top left Left reverse noenhanced
set xlabel 'heads removed (of 2)'
set ylabel 'held-out bits per target'
set title 'Heads removed from the trained model' noenhanced
plot 'prune.dat' index 0 using 1:2 with linespoints lw 2 pt 7 title "heads removed in increasing order of importance", \
     'prune.dat' index 1 using 1:2 with linespoints lw 2 pt 7 title "unpruned"
