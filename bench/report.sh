#!/usr/bin/env bash
# One benchmark report (`make bench`, as root): runs bench-pack.sh,
# bench-mount.sh and bench-write.sh on generated GPT-2-shaped bf16
# checkpoints of each --sizes, side by side with native ext4 (or whatever
# file system WORKDIR is on), squashfuse and gocryptfs, and writes
#
#   bench/report.md   the machine, each figure beside its target (MISSED
#                     where missed), then tables of MB/s, ratios to native
#                     and to the peers, compression ratios and peak RSS
#   README.md         its performance table, between the bench-table
#                     markers, rewritten by bench/readme_table.sh from the
#                     same figures (full runs with the default --out only)
#   bench/report.png  the chart: thread scaling and size scaling
#   bench/report.tsv  every figure, as bench/dtype/bytes/system/threads/
#                     metric/value lines
#
# The checkpoint of --scale-size is measured at every thread count of
# --threads (pack, mksquashfs, ckptfs decode workers), the others at nproc
# threads. Compression ratios by dtype come from checkpoints of the smallest
# size in each of --dtypes. Installs what it needs (scripts/deps.sh bench).
#
# Usage: bench/report.sh [options] [WORKDIR]
#   --quick           sizes 100M and 300M, 1 run each, the thread scaling at
#                     100M; writes bench/out/report-quick.{md,png,tsv}
#                     (a smoke run: about 3 minutes on 2 cores), labelled
#                     "quick run" in every heading and chart title
#   --sizes LIST      checkpoint sizes (default 100M,1G,4G)
#   --scale-size SIZE the size measured at every thread count (default 1G)
#   --threads LIST    thread counts for it, e.g. 1,2,4 (default "scale":
#                     1, 2, 4, ... and nproc; at least 1, 2, 3, 4, so on
#                     fewer than 4 cores some oversubscribe, which the
#                     report says)
#   --dtypes LIST     dtypes of the compression table (default bf16,f16,f32)
#   --runs N          runs per read and write figure, the median kept
#                     (default 3 up to 1 GB, 1 above)
#   --out PREFIX      write PREFIX.md, PREFIX.png, PREFIX.tsv (default
#                     bench/report)
#   --keep            keep the scratch directory (default: removed when done)
#   WORKDIR           where to make the scratch directory for checkpoints,
#                     packs and copies (default /tmp); needs about 8x the
#                     largest size free
#
# The full run (100M, 1G, 4G; 2 cores) takes about 30 minutes, most of it
# reading and squashing the 4 GB checkpoint; the report's "How long" section
# gives the time of each step.
set -euo pipefail
BENCH_NAME=bench-report
# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
here=$BENCH_ROOT/bench
sizes_arg=
scale_size=
runs=
out=
keep=0
while [ $# -gt 0 ]; do
    case $1 in
    --sizes) sizes_arg=${2:?--sizes needs a list}; shift 2 ;;
    --scale-size) scale_size=${2:?--scale-size needs a size}; shift 2 ;;
    --runs) runs=${2:?--runs needs a number}; shift 2 ;;
    --out) out=${2:?--out needs a path prefix}; shift 2 ;;
    --keep) keep=1; shift ;;
    *) bench_common_opt "$@" || break; shift "$BENCH_SHIFT" ;;
    esac
done
if [ "$quick" = 1 ]; then
    : "${sizes_arg:=100M,300M}" "${scale_size:=100M}" "${runs:=1}" "${out:=$here/out/report-quick}"
fi
: "${sizes_arg:=100M,1G,4G}" "${scale_size:=1G}" "${out:=$here/report}"
IFS=, read -r -a sizes <<<"$sizes_arg"
[ ${#dtypes[@]} -gt 0 ] || dtypes=(bf16 f16 f32)
[ ${#threads_list[@]} -gt 0 ] || mapfile -t threads_list < <(thread_counts scale)
N=$(nproc)
case ",$sizes_arg," in *",$scale_size,"*) ;; *) sizes+=("$scale_size") ;; esac
# Small to large.
for s in "${sizes[@]}"; do bytes_of "$s" >/dev/null || bench_die "bad size '$s' (want e.g. 100M, 1G, 4G)"; done
mapfile -t sizes < <(for s in "${sizes[@]}"; do echo "$(bytes_of "$s") $s"; done | sort -n -u | cut -d' ' -f2)

"$BENCH_ROOT/scripts/deps.sh" bench || bench_die "missing packages: install them as printed above"
need_root "drop_caches, mounts"
need_bins "$bin/ckptfs"

mkdir -p "${1:-/tmp}" "$(dirname "$out")"
work=$(mktemp -d "$(cd "${1:-/tmp}" && pwd)/ckptfs-report.XXXXXX")
[ "$keep" = 1 ] || trap 'stop_all_mounts; rm -rf --one-file-system "$work"' EXIT
largest=$(bytes_of "${sizes[-1]}")
avail=$(df -B1 --output=avail "$work" | tail -n 1)
[ "$avail" -gt $((largest * 8)) ] ||
    bench_die "$work has $((avail / 1000000000)) GB free; the $((largest / 1000000000)) GB checkpoint needs about $((largest * 8 / 1000000000)) GB"

tsv=$work/results.tsv
logs=$work/logs
mkdir -p "$logs"
: >"$tsv"
steps=()
t_begin=$(now)
load_begin=$(cut -d' ' -f1-3 /proc/loadavg)

# step NAME CMD...: runs one benchmark script, its table to the terminal and
# to the log, and notes how long it took.
step() {
    local name=$1 t0 t1
    shift
    echo "== $name ($(date +%T))" >&2
    t0=$(now)
    "$@" 2>&1 | tee "$logs/$name.txt"
    t1=$(now)
    steps+=("$name $(elapsed "$t0" "$t1")")
}

# ---------------------------------------------------------------- runs

declare -A bytes_of_src=()
checkpoint() { # SIZE DTYPE: generates it once; sets ck to its directory
    ck=$work/src-$2-$1
    size=$1 gen_ckpt "$ck" "$2"
    bytes_of_src[$2-$1]=$(du -sb "$ck" | cut -f1)
}

for s in "${sizes[@]}"; do
    checkpoint "$s" bf16
    if [ "$s" = "$scale_size" ]; then
        tl=$(IFS=,; echo "${threads_list[*]}")
    else
        tl=$N
    fi
    r=${runs:-$([ "$(bytes_of "$s")" -le 1000000000 ] && echo 3 || echo 1)}
    step "pack-$s" "$here/bench-pack.sh" --src "$ck" --threads "$tl" --tsv "$tsv" "$work/pack-$s"
    step "mount-$s" "$here/bench-mount.sh" --src "$ck" --threads "$tl" --runs "$r" --tsv "$tsv" "$work/mount-$s"
    rm -rf "$work/mount-$s"
    step "write-$s" "$here/bench-write.sh" --src "$ck" --threads "$tl" --runs "$r" --tsv "$tsv" "$work/write-$s"
    rm -rf "$work/pack-$s" "$work/write-$s"
    [ "$s" = "${sizes[0]}" ] || rm -rf "$ck"
done
for d in "${dtypes[@]}"; do
    [ "$d" = bf16 ] && continue
    checkpoint "${sizes[0]}" "$d"
    step "pack-${sizes[0]}-$d" "$here/bench-pack.sh" --src "$ck" --threads "$N" --tsv "$tsv" "$work/pack-$d"
    rm -rf "$work/pack-$d" "$ck"
done
step "threads" "$here/bench-threads.sh" $([ "$quick" = 1 ] && echo --quick) --threads "$N" "$work/threads"
rm -rf "$work/threads"
# The same tensors in every container format (its own section).
step formats "$here/bench-formats.sh" $([ "$quick" = 1 ] && echo --quick) --tsv "$tsv" --md "$work/formats.md" "$work"
t_end=$(now)

# -------------------------------------------------------------- report

pairs() { # DTYPE SIZE...: "SIZE=BYTES ..." of the checkpoints made
    local d=$1 s
    shift
    for s in "$@"; do printf '%s=%s ' "$s" "${bytes_of_src[$d-$s]}"; done
}
dtype_pairs=
for d in "${dtypes[@]}"; do dtype_pairs+="$d=${bytes_of_src[$d-${sizes[0]}]} "; done

mib_total=$(awk '/^MemTotal:/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo)
cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -n 1)
tpc=$(lscpu | sed -n 's/^Thread(s) per core: *//p')
virt=$(systemd-detect-virt 2>/dev/null || lscpu | sed -n 's/^Hypervisor vendor: *//p')
read -r dev fstype < <(findmnt -n -o SOURCE,FSTYPE -T "$work")
disk=
if read -r dsize drota dmodel < <(lsblk -dn -o SIZE,ROTA,MODEL "$dev" 2>/dev/null); then
    disk="${dmodel:+$dmodel, }$dsize, rotational: $([ "$drota" = 1 ] && echo yes || echo no)"
fi
commit=$(git -C "$BENCH_ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
[ -z "$(git -C "$BENCH_ROOT" status --porcelain --untracked-files=no 2>/dev/null)" ] || commit+=" + uncommitted changes"
version() { "$@" 2>&1 | head -n 1 || true; }
minutes() { awk -v s="$1" 'BEGIN { printf "%d min %02d s", s / 60, s % 60 }'; }
sizes_txt=$(for s in "${sizes[@]}"; do printf '%s (%s MB), ' "$s" "$((bytes_of_src[bf16-$s] / 1000000))"; done)
datdir=$work/plot
mkdir -p "$datdir"

{
    echo "# ckptfs benchmark report"
    echo
    if [ "$quick" = 1 ]; then
        echo "**Quick smoke run (\`--quick\`): small checkpoints, 1 run per figure. Not the report: run \`make bench\`.**"
        echo
    fi
    echo "Made by \`bench/report.sh$([ "$quick" = 1 ] && echo ' --quick')\` (\`make bench\`) on $(date -u '+%Y-%m-%d %H:%M UTC'), git $commit."
    echo "Checkpoints: GPT-2-shaped, N(0, 0.02) weights, from \`ckpt-gen\` (\`bench/lib.sh\` picks the shape for a size); bf16 at ${sizes_txt%, }."
    echo "Runs per read and write figure: ${runs:-3 up to 1 GB, 1 above} (the median); pack figures are one run."
    echo
    echo "![thread and size scaling](./$(basename "$out").png)"
    echo
    echo "## Machine"
    echo
    echo "| | |"
    echo "|---|---|"
    echo "| CPU | $cpu |"
    echo "| cores | $N online, threads per core: $tpc${virt:+; virtualization: $virt} |"
    echo "| RAM | $mib_total |"
    echo "| kernel | $(uname -srm) |"
    echo "| OS | $(. /etc/os-release && echo "$PRETTY_NAME") |"
    echo "| disk and file system | $dev${disk:+ ($disk)}, $fstype (the \"native\" file system and the backing directory of every mount) |"
    echo "| load average (1, 5, 15 min) | $load_begin at the start, $(cut -d' ' -f1-3 /proc/loadavg) at the end |"
    echo "| peers | $(version gocryptfs -version); squashfuse $(squashfuse --version 2>&1 | sed -n 's/^squashfuse \([0-9.]*\).*/\1/p' | head -n 1); $(version mksquashfs -version); fuse3 $(version fusermount3 -V | sed 's/.*version: *//') |"
    echo
    echo "## Targets"
    echo
    echo "Each figure beside its target (the ones \`bench-mount.sh\` and \`bench-write.sh\` check); the README's performance table is this table, written by the same script (\`bench/readme_table.sh\`)."
    echo
    "$here/readme_table.sh" --threads "$N" $([ "$quick" = 1 ] && echo --quick) "$tsv"
    echo
    # What bounds the warm re-read: the kernel keeps a FUSE file's page
    # cache in 4 KiB pages where ext4 uses large folios.
    if grep -q '^page cache of' "$logs/mount-${sizes[-1]}.txt" 2>/dev/null; then
        echo "Warm re-reads are served by the kernel's page cache without a trip to the daemon (keep_cache); what differs from native is how the kernel holds those pages:"
        echo
        echo '```'
        sed -n '/^page cache of/,/^$/p' "$logs/mount-${sizes[-1]}.txt"
        echo '```'
        echo
    fi
    awk -F'\t' -v N="$N" -v sizes="$(pairs bf16 "${sizes[@]}")" -v scale="$scale_size=${bytes_of_src[bf16-$scale_size]}" \
        -v dtypes="$dtype_pairs" -v datdir="$datdir" -f "$here/report.awk" "$tsv"
    echo "## Scaling (bench/bench-threads.sh: per-thread CPU from /proc, Amdahl from the serial thread's share)"
    echo
    echo '```'
    grep -v '^    threads by' "$logs/threads.txt" || true
    echo '```'
    echo
    cat "$work/formats.md"
    echo "## How long"
    echo
    echo "| step | time |"
    echo "|---|---|"
    for st in "${steps[@]}"; do echo "| ${st% *} | $(minutes "${st##* }") |"; done
    echo "| all (with generating the checkpoints) | $(minutes "$(elapsed "$t_begin" "$t_end")") |"
    echo
    echo "## Method"
    echo
    echo "- **Read** (\`bench/bench-mount.sh\`): the tensor files of the checkpoint as raw files on the local disk (native), in a \`mksquashfs -comp gzip -b 1M\` image under squashfuse, in a gocryptfs directory, and as \`tensors/\` of a ckptfs mount over packs stored, compressed, encrypted and both. Cold: every FUSE daemon restarted and \`echo 3 > /proc/sys/vm/drop_caches\` before each run. Every system's bytes are checked against native first."
    echo "- **Write** (\`bench/bench-write.sh\`): \`cp -r\` of the checkpoint, warm in the page cache, into each file system on the same disk. ckptfs packs in the background with \`-o threads\` workers (all cores unless the row says otherwise)."
    echo "- **Formats** (\`bench/bench-formats.sh\`): the same tensors saved seven ways by the real clients, packed with \`ckpt pack\` and through the writable mount, against safetensors and the issue-13 targets, and the mount's packing against \`ckpt pack\` (issue 15, >= 0.9x), medians of 3 runs; gzip, zstd and ZipNN on the same bytes, one core each."
    echo "- **Pack** (\`bench/bench-pack.sh\`): \`ckpt pack\`/\`unpack\` and \`mksquashfs\`/\`unsquashfs\` of the whole checkpoint, source warm in the page cache; peak RSS from \`/usr/bin/time -f %M\`. Daemon RSS is VmHWM from \`/proc/PID/status\` when it unmounts."
    echo "- Other work on the machine skews the figures; the load averages above tell how busy it was."
    echo "- Every figure, as tab-separated bench/dtype/bytes/system/threads/metric/value lines: [$(basename "$out").tsv](./$(basename "$out").tsv)."
    echo
    echo "<details><summary>Output of each benchmark script</summary>"
    echo
    for st in "${steps[@]}"; do
        echo "### ${st% *}"
        echo
        echo '```'
        cat "$logs/${st% *}.txt"
        echo '```'
        echo
    done
    echo "</details>"
} >"$out.md.tmp"
# A quick run says so in every heading, not only at the top.
if [ "$quick" = 1 ]; then
    sed -i -E 's/^(##+ .*)$/\1 (quick run)/' "$out.md.tmp"
fi

cp "$tsv" "$out.tsv"
info="$cpu, $N cores, $mib_total RAM, $fstype; $(date -u +%Y-%m-%d); git $commit"
gnuplot -e "dat='$datdir'; out='$out.png.tmp'; N=$N; scale='$scale_size'; info='${info//\'/}'; quick=$quick" "$here/report.gp"
mv "$out.png.tmp" "$out.png"
mv "$out.md.tmp" "$out.md"
# The full report is what the README quotes: its table, rewritten from the
# same figures (a quick run or another --out never touches the README).
if [ "$quick" = 0 ] && [ "$out" = "$here/report" ]; then
    "$here/readme_table.sh" --threads "$N" --date "$(date -u +%Y-%m-%d)" --readme "$BENCH_ROOT/README.md" "$out.tsv"
fi
echo "wrote $out.md, $out.png and $out.tsv in $(minutes "$(elapsed "$t_begin" "$(now)")")" >&2
[ "$keep" = 0 ] || echo "data kept in $work" >&2
