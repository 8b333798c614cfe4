#!/usr/bin/env bash
# Formats benchmark (run by `make bench-formats` and by bench/report.sh, as
# root). The same GPT-2-shaped N(0, 0.02) tensors (from ckpt-gen), in bf16 and
# in fp32, saved seven ways by the real clients (bench/formats.py, pinned
# venv of scripts/venv.sh): safetensors, one torch.save state_dict, one
# torch.save per tensor, a DCP directory (dcp.save), a tensorizer file, GGUF
# (BF16 or F32) and a raw blob. For each:
#
#   ckpt pack     ratio (bytes in / pack size) and MB/s (default level, no
#                 key, all cores), source warm in the page cache
#   mount         cp -r into a checkpoint of a writable ckptfs mount, then
#                 `ckpt commit --wait`, timed: the packing; its ratio
#
# MB/s are medians of --runs runs, the two ways taking turns. Each format is
# set against safetensors, with the issue-13 targets marked MET or MISSED:
# ratio within 2% of safetensors' (3% for the raw blob; a higher ratio
# meets it), packing MB/s at least 90% of safetensors' (both ways); and its
# mount packing against its own `ckpt pack` (issue 15: background packing
# keeps up, at least 0.9x). Then, on
# the same tensor bytes (the raw blob), one core each: ckpt pack --threads 1
# (and ckpt unpack under taskset), gzip -6, zstd -3 and ZipNN (PyPI zipnn,
# its Python API, dtype-aware) with ratio, compress and decompress MB/s.
#
# DCP rows say "pending DCP parser" while the pack shows no DCP tensor and
# DCP_REQUIRED is 0 (the default until formats/dcp.c lands); with
# DCP_REQUIRED=1 they are measured against the targets like the others.
#
# Usage: bench/bench-formats.sh [options] [WORKDIR]
#   --quick           64 MB of tensors per dtype instead of 600 MB
#   --size SIZE       about SIZE bytes of tensors per dtype (100M, 1G)
#   --dtypes LIST     bf16,f32 (default both)
#   --runs N          runs of each timing, median shown (default 3)
#   --md FILE         also write the markdown section to FILE (bench/report.sh
#                     puts it in the report; default when run alone at full
#                     size: bench/report-formats.md)
#   --tsv FILE        also append the results to FILE as tab-separated
#                     bench/dtype/bytes/system/threads/metric/value lines
#   --keep            keep WORKDIR's files (default: removed)
#   WORKDIR           where to make the scratch directory (default /tmp);
#                     needs about 12x the size free
set -euo pipefail
BENCH_NAME=bench-formats
# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
DCP_REQUIRED=${DCP_REQUIRED:-0}
md_out=
keep=0
runs=3
while [ $# -gt 0 ]; do
    case $1 in
    --md) md_out=${2:?--md needs a file}; shift 2 ;;
    --keep) keep=1; shift ;;
    --runs) runs=${2:?--runs needs a count}; shift 2 ;;
    *) bench_common_opt "$@" || break; shift "$BENCH_SHIFT" ;;
    esac
done
[ -n "$size" ] || size=$([ "$quick" = 1 ] && echo 64M || echo 600M)
[ ${#dtypes[@]} -gt 0 ] || dtypes=(bf16 f32)
[[ $runs =~ ^[1-9][0-9]?$ ]] || bench_die "bad --runs '$runs' (want 1 to 99)"
if [ -z "$md_out" ] && [ "$quick" = 0 ] && [ "$size" = 600M ]; then md_out=$BENCH_ROOT/bench/report-formats.md; fi

need_root "mounts, drop_caches"
need_bins "$bin/ckptfs"
for t in gzip zstd taskset; do command -v $t >/dev/null || bench_die "$t is missing (apt-get install gzip zstd util-linux)"; done
VPY=$(cd "$BENCH_ROOT" && B=${B:-build} scripts/venv.sh) || bench_die "scripts/venv.sh could not make the pinned venv"
case $VPY in /*) ;; *) VPY=$BENCH_ROOT/$VPY ;; esac
mkdir -p "${1:-/tmp}"
use_workdir "$(cd "${1:-/tmp}" && pwd)/ckptfs-formats.XXXXXX" "${1:+}"
[ "$keep" = 1 ] || trap 'stop_all_mounts; rm -rf --one-file-system "$work"' EXIT
mnt=$work/mnt
back=$work/back
mkdir -p "$back"
start_daemon "$mnt" "$bin/ckptfs" -f -o commit_delay=0 "$back" "$mnt"

FORMATS=(safetensors torch_sd torch_per dcp tensorizer gguf raw)
declare -A LABEL=([safetensors]="safetensors" [torch_sd]="torch.save state_dict" [torch_per]="torch.save per tensor"
    [dcp]="DCP (dcp.save)" [tensorizer]="tensorizer" [gguf]="GGUF" [raw]="raw blob")
declare -A R=()   # R[dtype,format,metric]
t_begin=$(now)
load_begin=$(cut -d' ' -f1-3 /proc/loadavg)

ratio3() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.3f", a / b; else print "-" }'; }
warm() { find "$1" -type f -exec cat {} + >/dev/null; }
# tensors_in PACK: how many tensors the pack shows
tensors_in() { "$bin/ckpt" ls "$1" --json | "$VPY" -c 'import json,sys; print(len(json.load(sys.stdin)["tensors"]))'; }
# timed VAR CMD...: runs CMD, VAR = seconds it took
timed() {
    local __v=$1 t0
    shift
    t0=$(now)
    "$@"
    printf -v "$__v" '%s' "$(elapsed "$t0" "$(now)")"
}

for dt in "${dtypes[@]}"; do
    gen=$work/gen-$dt
    args=$(gen_args "$size" "$dt")
    echo "$BENCH_NAME: $dt: ckpt-gen $args, then the seven formats" >&2
    # shellcheck disable=SC2086 # $args is a list of options
    "$bin/ckpt-gen" "$gen" $args --format safetensors >/dev/null
    st=$(find "$gen" -name '*.safetensors' | head -n 1)
    "$VPY" "$BENCH_ROOT/bench/formats.py" make "$st" "$work/$dt" || bench_die "formats.py make failed"
    rm -rf "$gen"
    # The formats were just written: left dirty, their writeback would take
    # the disk from whichever timing comes first.
    sync
    for f in "${FORMATS[@]}"; do
        d=$work/$dt/$f
        bytes=$(du -sb "$d" | cut -f1)
        R[$dt,$f,bytes]=$bytes
        pack_mbps=() mount_mbps=()
        for ((run = 1; run <= runs; run++)); do
            # ckpt pack, source warm
            warm "$d"
            timed secs "$bin/ckpt" pack "$d" -o "$work/p.tpack" 2>"$work/pack.err" >/dev/null ||
                bench_die "ckpt pack of $f failed: $(cat "$work/pack.err")"
            stored=$(stat -c %s "$work/p.tpack")
            R[$dt,$f,ratio]=$(ratio3 "$bytes" "$stored")
            pack_mbps+=("$(mbps "$bytes" "$secs")")
            R[$dt,$f,tensors]=$(tensors_in "$work/p.tpack")
            R[$dt,$f,warn]=$(grep -c '^warning: ' "$work/pack.err" || true)
            rm -f "$work/p.tpack"
            # through the writable mount: cp -r, then the packing of commit --wait
            warm "$d"
            mkdir "$mnt/$f-$dt"
            cp -r "$d/." "$mnt/$f-$dt/"
            timed secs "$bin/ckpt" commit --wait "$mnt/$f-$dt" >/dev/null || bench_die "commit of $f failed"
            stored=$(stat -c %s "$back/$f-$dt.tpack")
            R[$dt,$f,mratio]=$(ratio3 "$bytes" "$stored")
            mount_mbps+=("$(mbps "$bytes" "$secs")")
            rm -rf "$mnt/$f-$dt"
        done
        R[$dt,$f,mbps]=$(printf '%s\n' "${pack_mbps[@]}" | median)
        R[$dt,$f,mmbps]=$(printf '%s\n' "${mount_mbps[@]}" | median)
        R[$dt,$f,keep]=$(ratio3 "${R[$dt,$f,mmbps]}" "${R[$dt,$f,mbps]}")
        for m in ratio mbps mratio mmbps keep tensors; do tsv_row formats "$dt" "$bytes" "ckpt-$f" "$(nproc)" "$m" "${R[$dt,$f,$m]}"; done
        echo "$BENCH_NAME: $dt $f: ratio ${R[$dt,$f,ratio]}, ${R[$dt,$f,mbps]} MB/s (${pack_mbps[*]}); mount ratio ${R[$dt,$f,mratio]}, ${R[$dt,$f,mmbps]} MB/s (${mount_mbps[*]}), ${R[$dt,$f,keep]}x of ckpt pack" >&2
    done
    # One core, the same tensor bytes: the raw blob.
    blob=$work/$dt/raw/weights.bin
    n=$(stat -c %s "$blob")
    R[$dt,blob]=$n
    warm "$work/$dt/raw"
    timed secs "$bin/ckpt" pack "$work/$dt/raw" -o "$work/c.tpack" --threads 1 >/dev/null 2>&1
    R[$dt,c-ckpt,ratio]=$(ratio3 "$n" "$(stat -c %s "$work/c.tpack")")
    R[$dt,c-ckpt,c]=$(mbps "$n" "$secs")
    timed secs taskset -c 0 "$bin/ckpt" unpack "$work/c.tpack" -o "$work/unpacked" >/dev/null 2>&1
    R[$dt,c-ckpt,d]=$(mbps "$n" "$secs")
    rm -rf "$work/unpacked" "$work/c.tpack"
    timed secs "$bin/ckpt" pack "$work/$dt/safetensors" -o "$work/c.tpack" --threads 1 >/dev/null 2>&1
    R[$dt,c-ckpt-st,ratio]=$(ratio3 "${R[$dt,safetensors,bytes]}" "$(stat -c %s "$work/c.tpack")")
    R[$dt,c-ckpt-st,c]=$(mbps "${R[$dt,safetensors,bytes]}" "$secs")
    timed secs taskset -c 0 "$bin/ckpt" unpack "$work/c.tpack" -o "$work/unpacked" >/dev/null 2>&1
    R[$dt,c-ckpt-st,d]=$(mbps "${R[$dt,safetensors,bytes]}" "$secs")
    rm -rf "$work/unpacked" "$work/c.tpack"
    timed secs bash -c "gzip -6 -c '$blob' >'$work/c.gz'"
    R[$dt,c-gzip,ratio]=$(ratio3 "$n" "$(stat -c %s "$work/c.gz")")
    R[$dt,c-gzip,c]=$(mbps "$n" "$secs")
    timed secs bash -c "gzip -dc '$work/c.gz' >/dev/null"
    R[$dt,c-gzip,d]=$(mbps "$n" "$secs")
    rm -f "$work/c.gz"
    timed secs bash -c "zstd -q -3 -T1 -c '$blob' >'$work/c.zst'"
    R[$dt,c-zstd,ratio]=$(ratio3 "$n" "$(stat -c %s "$work/c.zst")")
    R[$dt,c-zstd,c]=$(mbps "$n" "$secs")
    timed secs bash -c "zstd -q -dc '$work/c.zst' >/dev/null"
    R[$dt,c-zstd,d]=$(mbps "$n" "$secs")
    rm -f "$work/c.zst"
    zdt=$([ "$dt" = bf16 ] && echo bfloat16 || echo float32)
    read -r zr zc zd < <("$VPY" "$BENCH_ROOT/bench/formats.py" zipnn "$blob" "$zdt") || bench_die "zipnn failed"
    R[$dt,c-zipnn,ratio]=$zr R[$dt,c-zipnn,c]=$zc R[$dt,c-zipnn,d]=$zd
    for c in c-ckpt c-ckpt-st c-gzip c-zstd c-zipnn; do
        for m in ratio c d; do tsv_row formats "$dt" "$n" "${c#c-}" 1 "$m" "${R[$dt,$c,$m]}"; done
    done
    rm -rf "${work:?}/$dt"
done
t_end=$(now)
stop_mount "$mnt"

# ---------------------------------------------------------------- the table

# rel A B: A / B as a percentage difference ("+1.2%")
rel() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0 && a != "") printf "%+.1f%%", (a / b - 1) * 100; else print "-" }'; }
# verdict A B MIN: MET when A >= B * MIN
verdict() { awk -v a="$1" -v b="$2" -v m="$3" 'BEGIN { print (b > 0 && a >= b * m) ? "MET" : "MISSED" }'; }

table() {
    local dt=$1 f r st_r st_m st_mm tol name pend
    st_r=${R[$dt,safetensors,ratio]} st_m=${R[$dt,safetensors,mbps]} st_mm=${R[$dt,safetensors,mmbps]}
    echo "#### $dt: $((R[$dt,safetensors,bytes] / 1000000)) MB of tensors"
    echo
    echo "| format | MB | tensors shown | ratio | vs safetensors | ratio target | pack MB/s | vs safetensors | target | mount ratio | mount packing MB/s | vs safetensors | target | mount vs ckpt pack | target (>= 0.9x) |"
    echo "|---|---:|---:|---:|---:|---|---:|---:|---|---:|---:|---:|---|---:|---|"
    for f in "${FORMATS[@]}"; do
        name=${LABEL[$f]}
        tol=0.98
        [ "$f" = raw ] && tol=0.97
        pend=
        if [ "$f" = dcp ] && [ "${R[$dt,$f,tensors]}" = 0 ] && [ "$DCP_REQUIRED" = 0 ]; then pend=1; fi
        if [ "$f" = safetensors ]; then
            v1="(baseline)" v2="(baseline)" v3="(baseline)"
        elif [ -n "$pend" ]; then
            v1="pending DCP parser" v2=$v1 v3=$v1 v4=$v1
        else
            v1=$(verdict "${R[$dt,$f,ratio]}" "$st_r" "$tol") v2=$(verdict "${R[$dt,$f,mbps]}" "$st_m" 0.9)
            v3=$(verdict "${R[$dt,$f,mmbps]}" "$st_mm" 0.9)
            [ "$f" = raw ] && v1="$v1 (3%)"
        fi
        [ -n "$pend" ] || v4=$(verdict "${R[$dt,$f,mmbps]}" "${R[$dt,$f,mbps]}" 0.9)
        printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %sx | %s |\n' "$name" \
            "$((R[$dt,$f,bytes] / 1000000))" "${R[$dt,$f,tensors]}" "${R[$dt,$f,ratio]}" "$(rel "${R[$dt,$f,ratio]}" "$st_r")" "$v1" \
            "${R[$dt,$f,mbps]}" "$(rel "${R[$dt,$f,mbps]}" "$st_m")" "$v2" \
            "${R[$dt,$f,mratio]}" "${R[$dt,$f,mmbps]}" "$(rel "${R[$dt,$f,mmbps]}" "$st_mm")" "$v3" \
            "${R[$dt,$f,keep]}" "$v4"
    done
    echo
    echo "Side by side on the same $((R[$dt,blob] / 1000000)) MB of $dt tensor bytes (the raw blob), one core each:"
    echo
    echo "| compressor | ratio | compress MB/s | decompress MB/s |"
    echo "|---|---:|---:|---:|"
    echo "| ckpt pack --threads 1 (raw blob; unpack under taskset -c 0) | ${R[$dt,c-ckpt,ratio]} | ${R[$dt,c-ckpt,c]} | ${R[$dt,c-ckpt,d]} |"
    echo "| ckpt pack --threads 1 (safetensors) | ${R[$dt,c-ckpt-st,ratio]} | ${R[$dt,c-ckpt-st,c]} | ${R[$dt,c-ckpt-st,d]} |"
    echo "| gzip -6 | ${R[$dt,c-gzip,ratio]} | ${R[$dt,c-gzip,c]} | ${R[$dt,c-gzip,d]} |"
    echo "| zstd -3 (-T1) | ${R[$dt,c-zstd,ratio]} | ${R[$dt,c-zstd,c]} | ${R[$dt,c-zstd,d]} |"
    echo "| ZipNN 0.5.4 (Python API, threads=1, $([ "$dt" = bf16 ] && echo bfloat16 || echo float32)) | ${R[$dt,c-zipnn,ratio]} | ${R[$dt,c-zipnn,c]} | ${R[$dt,c-zipnn,d]} |"
    echo
}

section() {
    echo "## Formats"
    echo
    echo "Made by \`bench/bench-formats.sh$([ "$quick" = 1 ] && echo ' --quick') --size $size\` on $(date -u '+%Y-%m-%d %H:%M UTC'), git $(git -C "$BENCH_ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)$([ -z "$(git -C "$BENCH_ROOT" status --porcelain --untracked-files=no 2>/dev/null)" ] || echo ' + uncommitted changes'), $(nproc) cores, load average $load_begin at the start and $(cut -d' ' -f1-3 /proc/loadavg) at the end; $(awk -v s="$(elapsed "$t_begin" "$t_end")" 'BEGIN { printf "%d min %02d s", s / 60, s % 60 }')."
    echo "The same GPT-2-shaped N(0, 0.02) tensors (\`ckpt-gen\`) saved seven ways by the real clients (\`bench/formats.py\`: torch 2.13, safetensors, tensorizer, gguf). Ratio: the format's bytes over the pack's. **ckpt pack**: default level, no key, all cores, source warm. **Mount**: \`cp -r\` into a writable mount, then \`ckpt commit --wait\` timed (the packing). Targets: ratio within 2% of safetensors' (3% for the raw blob; higher meets it), packing MB/s at least 90% of safetensors', both ways (issue 13); the mount's packing at least 0.9x of \`ckpt pack\` of the same format (issue 15). MB/s are medians of $runs runs, \`ckpt pack\` and the mount taking turns; the ratios do not move between runs."
    echo
    for dt in "${dtypes[@]}"; do table "$dt"; done
}

section >"$work/section.md"
# With --md the report embeds the file, so printing it too would show it twice.
if [ -n "$md_out" ]; then
    mkdir -p "$(dirname "$md_out")"
    cp "$work/section.md" "$md_out"
    echo "$BENCH_NAME: wrote $md_out" >&2
else
    cat "$work/section.md"
fi
