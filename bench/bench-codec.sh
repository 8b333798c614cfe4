#!/usr/bin/env bash
# Single-core speed of the chunk codec (issue 15): on a generated GPT-2
# medium checkpoint (N(0, 0.02) weights), bf16 and fp32, prints
#  - bench/plane_codecs: the candidate plane coders (Huffman-only deflate,
#    zstd levels and settings) on the byte planes of real 1 MiB chunks:
#    ratio, encode and decode MB/s of plane on one core;
#  - bench/codec_speed: the library's own chunk_encode/chunk_decode with
#    CRC-32 or the pack's AEAD, GB/s of raw bytes per CPU-second.
# Timings are thread CPU time, the median of --reps runs; the machine may
# be shared, so compare rows of one run.
#
# Usage: bench/bench-codec.sh [options] [WORKDIR]
#   --quick           4 layers instead of 24, and 16 MiB of data per tool
#   --src DIR         measure this ckpt-gen checkpoint (its first
#                     .safetensors file) instead of generating one
#   --dtypes LIST     bf16, f16, f32 (default bf16,f32)
#   WORKDIR           kept afterwards (default: a new directory under /tmp);
#                     generated checkpoints there are reused
set -euo pipefail
BENCH_NAME=bench-codec
# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
reps=3
while [ $# -gt 0 ]; do
    bench_common_opt "$@" || break
    shift "$BENCH_SHIFT"
done
use_workdir /tmp/ckpt-bench-codec.XXXXXX "${1:-}"
need_bins "$BENCH_ROOT/${B:-build}/bench/codec_speed" "$BENCH_ROOT/${B:-build}/bench/plane_codecs"
bb=$BENCH_ROOT/${B:-build}/bench
[ ${#dtypes[@]} -gt 0 ] || dtypes=(bf16 f32)
mib=64
[ "$quick" = 1 ] && mib=16

run_on() { # run_on FILE ELEM
    echo "### $(basename "$(dirname "$1")")/$(basename "$1"), element size $2"
    echo
    "$bb/plane_codecs" "$1" --elem "$2" --mib "$mib" --reps "$reps"
    echo
    "$bb/codec_speed" "$1" --elem "$2" --mib "$mib" --reps "$reps"
    echo
}

if [ -n "$src_dir" ]; then
    f=$(find "$src_dir" -name '*.safetensors' | sort | head -n 1)
    [ -n "$f" ] || bench_die "$src_dir has no .safetensors file"
    run_on "$f" 2
    exit 0
fi
for dtype in "${dtypes[@]}"; do
    gen_ckpt "$work/src-$dtype" "$dtype"
    elem=2
    [ "$dtype" = f32 ] && elem=4
    run_on "$(find "$work/src-$dtype" -name '*.safetensors' | sort | head -n 1)" "$elem"
done
