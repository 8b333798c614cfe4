#!/usr/bin/env bash
# Scaling from one run (issue 15): samples every thread's CPU time from
# /proc during `ckpt pack` (compressed; compressed + encrypted), `unpack`,
# `verify` and `cat` of a generated GPT-2 medium bf16 checkpoint in 4
# shards (and `pack` of the same weights as one file), and of the ckptfs
# daemon while it packs that checkpoint copied into a mount (as root), with
# bench/threads.py.
# Each line gives the stage's CPU-seconds per GB, the busiest thread of a
# role only one thread has (the serial part s) and the Amdahl prediction
# 1 / (s + (1 - s) / N) for 16 and 64 cores. Source and packs are warm in
# the page cache.
#
# Usage: bench/bench-threads.sh [options] [WORKDIR]
#   --quick           4 layers instead of 24
#   --threads LIST    worker threads of each command (default: nproc)
#   --tsv FILE        also append stage/cpu_s/wall_s/threads/serial_cpu_s/
#                     serial_share/amdahl16/amdahl64/bytes/pipelined16/pipelined64
#                     lines to FILE
#   WORKDIR           kept afterwards (default: a new directory under /tmp)
set -euo pipefail
BENCH_NAME=bench-threads
# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
while [ $# -gt 0 ]; do
    bench_common_opt "$@" || break
    shift "$BENCH_SHIFT"
done
use_workdir /tmp/ckpt-bench-threads.XXXXXX "${1:-}"
need_bins
[ ${#threads_list[@]} -gt 0 ] || threads_list=("$(nproc)")
sampler=$BENCH_ROOT/bench/threads.py
layers=24
[ "$quick" = 1 ] && layers=4
for shards in 4 1; do
    d=$work/src-$shards
    [ -f "$d/config.json" ] || "$bin/ckpt-gen" "$d" --preset gpt2-medium --layers "$layers" --shards "$shards" >/dev/null
done
[ -f "$work/key" ] || "$bin/ckpt" keygen -o "$work/key" >/dev/null 2>&1
bytes=$(du -sb "$work/src-4" | cut -f1)
cat "$work"/src-*/* >/dev/null
s() { # LABEL CMD...
    local label=$1
    shift
    python3 "$sampler" --label "$label" --bytes "$bytes" ${tsv:+--tsv "$tsv"} -- "$@"
}
for t in "${threads_list[@]}"; do
    echo "threads $t, $bytes bytes of bf16 N(0, 0.02), $(nproc) cores"
    rm -f "$work"/*.tpack
    s "pack 4 shards, compressed" "$bin/ckpt" pack "$work/src-4" -o "$work/c.tpack" --threads "$t"
    s "pack 4 shards, compressed+encrypted" "$bin/ckpt" pack "$work/src-4" -o "$work/e.tpack" --threads "$t" \
        --key-file "$work/key"
    s "pack 1 file, compressed" "$bin/ckpt" pack "$work/src-1" -o "$work/one.tpack" --threads "$t"
    rm -rf "$work/un"
    s "unpack 4 shards, compressed" "$bin/ckpt" unpack "$work/c.tpack" -o "$work/un" --threads "$t"
    rm -rf "$work/un"
    s "verify 4 shards, compressed" "$bin/ckpt" verify "$work/c.tpack" --threads "$t"
    s "verify 4 shards, compressed+encrypted" "$bin/ckpt" verify "$work/e.tpack" --threads "$t" --key-file "$work/key"
    s "cat 1 file, compressed" "$bin/ckpt" cat "$work/one.tpack" model.safetensors --threads "$t"
    # Background packing: the daemon, sampled from `ckpt commit` until the
    # pack is committed (the copy in before is not counted).
    if [ "$(id -u)" != 0 ] || [ ! -e /dev/fuse ]; then
        echo "background packing: skipped (needs root and /dev/fuse)"
        continue
    fi
    for keyed in 0 1; do
        label="background packing 4 shards, compressed" opts="commit_delay=3600,threads=$t"
        [ "$keyed" = 1 ] && label+="+encrypted" opts+=",key_file=$work/key"
        rm -rf "$work/back" "$work/committed"
        mkdir -p "$work/back"
        start_daemon "$work/mnt" "$bin/ckptfs" -f -o "$opts" "$work/back" "$work/mnt"
        mkdir "$work/mnt/ckpt"
        cp -r "$work/src-4/." "$work/mnt/ckpt/"
        python3 "$sampler" --label "$label" --bytes "$bytes" ${tsv:+--tsv "$tsv"} \
            --pid "${bench_pid_of[$work/mnt]}" --until-file "$work/committed" &
        sampler_pid=$!
        "$bin/ckpt" commit --wait --quiet "$work/mnt/ckpt"
        touch "$work/committed"
        wait "$sampler_pid"
        stop_mount "$work/mnt"
    done
done
