# The chart of bench/report.md (bench/report.png), from the data files
# bench/report.awk writes. Run by bench/report.sh:
#   gnuplot -e "dat='DIR'; out='report.png'; N=2; scale='1G'; info='...'; quick=0" report.gp
# Top row: at the scaling size, against the thread count. Bottom row: at N
# threads, against the checkpoint size.

if (!exists("dat")) dat = '.'
if (!exists("out")) out = 'report.png'
if (!exists("N")) N = 1
if (!exists("scale")) scale = '?'
if (!exists("info")) info = ''
# quick=1: a smoke run (report.sh --quick), said in every title.
if (!exists("quick")) quick = 0
Q = quick ? 'QUICK RUN (smoke test, not the report): ' : ''

set terminal pngcairo size 1800,1200 font 'DejaVu Sans,10' noenhanced
set output out
set datafile missing '?'
set key below maxcols 2 Left reverse samplen 4 width 2 font ',9'
set grid
set offsets 0, 0, graph 0.08, 0
set multiplot layout 2,3 title Q.'ckptfs benchmark: '.info font ',13'

# One colour per system, the same in every panel: solid lines and filled
# points for ckptfs and ckpt, dashed lines and open points for the others.
set style line 1 lc rgb '#000000' dt 2 lw 2 pt 6                 # native ext4
set style line 2 lc rgb '#e69f00' dt 2 lw 2 pt 4                 # squashfuse, mksquashfs
set style line 3 lc rgb '#d55e00' dt 2 lw 2 pt 8                 # gocryptfs
set style line 4 lc rgb '#0072b2' dt 1 lw 2 pt 7                 # ckptfs stored
set style line 5 lc rgb '#009e73' dt 1 lw 2 pt 7                 # ckptfs compressed
set style line 6 lc rgb '#cc79a7' dt 1 lw 2 pt 7                 # ckptfs encrypted
set style line 7 lc rgb '#56b4e9' dt 1 lw 2 pt 5                 # ckptfs compressed+encrypted

T = dat.'/threads.dat'
S = dat.'/sizes.dat'
D = dat.'/dtypes.dat'

# ------------------------------------------------ top: thread scaling
stats T using 1 nooutput
set xrange [STATS_min - 0.2:STATS_max + 0.2]
set xtics 1
# Counts above N oversubscribe the N cores.
OVER = STATS_max > N ? sprintf(' (>%d threads oversubscribe %d cores)', N, N) : ''
set xlabel 'threads'.OVER
set ylabel 'MB/s'
set yrange [0:*]

set title Q.'Cold sequential read vs threads ('.scale.' checkpoint)'
plot T using 1:6 with linespoints ls 4 title 'ckptfs stored', \
     T using 1:7 with linespoints ls 5 title 'ckptfs compressed', \
     T using 1:8 with linespoints ls 6 title 'ckptfs encrypted', \
     T using 1:9 with linespoints ls 7 title 'ckptfs compressed+encrypted', \
     T using 1:10 with lines ls 1 title 'native ext4 (no thread setting)', \
     T using 1:11 with lines ls 2 title 'squashfuse (no thread setting)', \
     T using 1:12 with lines ls 3 title 'gocryptfs (no thread setting)'

set title Q.'Pack vs threads ('.scale.' checkpoint)'
plot T using 1:2 with linespoints ls 5 title 'ckpt pack compressed', \
     T using 1:3 with linespoints ls 7 title 'ckpt pack compressed+encrypted', \
     T using 1:4 with linespoints ls 4 title 'ckpt pack stored', \
     T using 1:5 with linespoints ls 2 title 'mksquashfs -comp gzip -b 1M'

set title Q.'Compression ratio by dtype (smallest checkpoint)'
set xrange [*:*]
set xtics auto
unset xlabel
set ylabel 'logical / stored bytes'
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set boxwidth 0.9
plot D using 2:xtic(1) with histograms lc rgb '#009e73' title 'ckpt pack', \
     D using 3 with histograms lc rgb '#e69f00' title 'mksquashfs gzip'

# ------------------------------------------------- bottom: size scaling
stats S using 1 nooutput
set logscale x
set xrange [STATS_min / 1.5:STATS_max * 1.5]
set xtics ()
do for [i = 0:STATS_records - 1] {
    stats S every ::i::i using 1 nooutput
    set xtics add (sprintf('%.0f', STATS_min) STATS_min)
}
set xlabel 'checkpoint size (MB)' offset 0,0.3
set ylabel 'MB/s'

set title Q.sprintf('Cold sequential read vs size (%d threads)', N)
plot S using 1:5 with linespoints ls 4 title 'ckptfs stored', \
     S using 1:6 with linespoints ls 5 title 'ckptfs compressed', \
     S using 1:7 with linespoints ls 6 title 'ckptfs encrypted', \
     S using 1:8 with linespoints ls 7 title 'ckptfs compressed+encrypted', \
     S using 1:2 with linespoints ls 1 title 'native ext4', \
     S using 1:3 with linespoints ls 2 title 'squashfuse', \
     S using 1:4 with linespoints ls 3 title 'gocryptfs'

set title Q.sprintf('Write until durable, and pack, vs size (%d threads)', N)
plot S using 1:11 with linespoints ls 5 title 'ckptfs cp -r + packing', \
     S using 1:12 with linespoints ls 7 title 'ckptfs with key cp -r + packing', \
     S using 1:13 with linespoints ls 5 dt 3 pt 9 title 'ckpt pack compressed', \
     S using 1:9 with linespoints ls 1 title 'native cp -r + sync', \
     S using 1:10 with linespoints ls 3 title 'gocryptfs cp -r + sync', \
     S using 1:15 with linespoints ls 2 title 'mksquashfs gzip'

set title Q.sprintf('Peak RSS vs size (%d threads)', N)
set ylabel 'MiB'
plot S using 1:16 with linespoints ls 7 title 'ckptfs read daemon', \
     S using 1:17 with linespoints ls 6 title 'ckptfs write daemon (key)', \
     S using 1:18 with linespoints ls 5 dt 3 pt 9 title 'ckpt pack', \
     S using 1:19 with linespoints ls 2 title 'mksquashfs', \
     S using 1:20 with linespoints ls 2 dt 3 pt 12 title 'squashfuse', \
     S using 1:21 with linespoints ls 3 title 'gocryptfs (read)'

unset multiplot
