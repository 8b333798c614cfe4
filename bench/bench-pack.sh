#!/usr/bin/env bash
# Pack/unpack benchmark for the core (issue: tpack format): on generated
# GPT-2-shaped checkpoints (N(0, 0.02) weights), measures the compression
# ratio, pack and unpack MB/s and the peak RSS of each process, plain
# compressed, encrypted and stored, next to `mksquashfs -comp gzip -b 1M`
# (and unsquashfs) on the same files, at each thread count (`ckpt pack
# --threads N`, `mksquashfs -processors N`). The source is read from the
# page cache: this measures the CPU cost, not the disk.
#
# Usage: bench/bench-pack.sh [options] [WORKDIR]
#   --quick           GPT-2 medium with 4 layers instead of 24 (about 200 MB
#                     in bf16), for a smoke run
#   --size SIZE       a checkpoint of about SIZE bytes instead (100M, 1G, 4G)
#   --dtypes LIST     the checkpoints to make, bf16, f16, f32 (default bf16,f32)
#   --src DIR         measure this checkpoint instead of generating one
#   --threads LIST    thread counts, e.g. 1,2,4 or "scale" (1, 2, 4 ... nproc)
#                     (default: nproc)
#   --tsv FILE        also append the results to FILE as tab-separated
#                     bench/dtype/bytes/system/threads/metric/value lines
#   WORKDIR           kept afterwards (default: a new directory under /tmp);
#                     generated checkpoints there are reused
set -euo pipefail
BENCH_NAME=bench-pack
# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
while [ $# -gt 0 ]; do
    bench_common_opt "$@" || break
    shift "$BENCH_SHIFT"
done
use_workdir /tmp/ckpt-bench-pack.XXXXXX "${1:-}"
need_bins "$bin/ckpt"
[ ${#dtypes[@]} -gt 0 ] || dtypes=(bf16 f32)
[ ${#threads_list[@]} -gt 0 ] || threads_list=("$(nproc)")
have_squashfs=1
command -v mksquashfs >/dev/null && command -v unsquashfs >/dev/null || have_squashfs=0

size_of() { du -sb "$1" | cut -f1; }
mib() { echo $(($1 / 1024)); }

# The checkpoints to measure: --src, or one generated per dtype.
srcs=()
if [ -n "$src_dir" ]; then
    [ -f "$src_dir/config.json" ] || bench_die "$src_dir is not a ckpt-gen checkpoint"
    srcs=("$(cd "$src_dir" && pwd)")
else
    for dtype in "${dtypes[@]}"; do
        gen_ckpt "$work/src-$dtype${size:+-$size}" "$dtype"
        srcs+=("$work/src-$dtype${size:+-$size}")
    done
fi

"$bin/ckpt" keygen -o "$work/key" 2>/dev/null || true
printf '| data | method | threads | ratio | pack MB/s | unpack MB/s | pack RSS MiB | unpack RSS MiB |\n'
printf '|---|---|---|---|---|---|---|---|\n'
# row DATA METHOD THREADS LOGICAL STORED T_PACK T_UNPACK RSS_PACK RSS_UNPACK
row() {
    printf '| %s | %s | %s | %.3f | %s | %s | %s | %s |\n' "$1" "$2" "$3" \
        "$(awk -v a="$4" -v b="$5" 'BEGIN { print a / b }')" "$(mbps "$4" "$6")" "$(mbps "$4" "$7")" \
        "$(mib "$8")" "$(mib "$9")"
}
# emit DTYPE LOGICAL SYSTEM THREADS STORED T_PACK T_UNPACK RSS_PACK RSS_UNPACK
emit() {
    tsv_row pack "$1" "$2" "$3" "$4" ratio "$(awk -v a="$2" -v b="$5" 'BEGIN { printf "%.4f", a / b }')"
    tsv_row pack "$1" "$2" "$3" "$4" stored_bytes "$5"
    tsv_row pack "$1" "$2" "$3" "$4" pack_mbps "$(mbps "$2" "$6")"
    tsv_row pack "$1" "$2" "$3" "$4" unpack_mbps "$(mbps "$2" "$7")"
    tsv_row pack "$1" "$2" "$3" "$4" pack_rss_kib "$8"
    tsv_row pack "$1" "$2" "$3" "$4" unpack_rss_kib "$9"
}

for src in "${srcs[@]}"; do
    dtype=$(dtype_of "$src")
    logical=$(size_of "$src")
    data="$dtype $((logical / 1000000)) MB"
    cat "$src"/* >/dev/null # the source comes from the page cache for every method
    for t in "${threads_list[@]}"; do
        for mode in compressed encrypted stored; do
            out=$work/$dtype-$mode.tpack
            rm -f "$out"
            args=() keys=()
            [ $mode = encrypted ] && keys=(--key-file "$work/key")
            [ $mode = stored ] && args=(--no-compress)
            sync
            t0=$(now)
            run_rss "$bin/ckpt" pack "$src" -o "$out" --threads "$t" "${args[@]}" "${keys[@]}" >/dev/null
            t1=$(now)
            rss_pack=$LAST_RSS_KIB
            stored=$(stat -c %s "$out")
            rm -rf "$work/out"
            t2=$(now)
            run_rss "$bin/ckpt" unpack "$out" -o "$work/out" "${keys[@]}" >/dev/null
            t3=$(now)
            cmp -s "$work/out/model.safetensors" "$src/model.safetensors" || bench_die "round trip FAILED for $out"
            row "$data" "ckpt $mode" "$t" "$logical" "$stored" "$(elapsed "$t0" "$t1")" "$(elapsed "$t2" "$t3")" \
                "$rss_pack" "$LAST_RSS_KIB"
            emit "$dtype" "$logical" "ckpt-$mode" "$t" "$stored" "$(elapsed "$t0" "$t1")" "$(elapsed "$t2" "$t3")" \
                "$rss_pack" "$LAST_RSS_KIB"
            rm -f "$out"
        done
        if [ $have_squashfs = 1 ]; then
            img=$work/$dtype.sqfs
            rm -f "$img"
            sync
            t0=$(now)
            run_rss mksquashfs "$src" "$img" -comp gzip -b 1M -noappend -quiet -no-progress -processors "$t" >/dev/null
            t1=$(now)
            rss_pack=$LAST_RSS_KIB
            stored=$(stat -c %s "$img")
            rm -rf "$work/out"
            t2=$(now)
            run_rss unsquashfs -q -no-progress -processors "$t" -d "$work/out" "$img" >/dev/null
            t3=$(now)
            row "$data" "mksquashfs gzip -b 1M" "$t" "$logical" "$stored" "$(elapsed "$t0" "$t1")" \
                "$(elapsed "$t2" "$t3")" "$rss_pack" "$LAST_RSS_KIB"
            emit "$dtype" "$logical" mksquashfs "$t" "$stored" "$(elapsed "$t0" "$t1")" "$(elapsed "$t2" "$t3")" \
                "$rss_pack" "$LAST_RSS_KIB"
            rm -f "$img"
        fi
    done
done
rm -rf "$work/out"
echo "cores: $(nproc); data kept in $work"
