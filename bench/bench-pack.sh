#!/usr/bin/env bash
# Pack/unpack benchmark for the core (issue: tpack format): on generated
# GPT-2-medium-shaped checkpoints (bf16 and fp32, N(0, 0.02)), measures the
# compression ratio, pack MB/s and unpack MB/s with all cores, plain and
# encrypted, next to `mksquashfs -comp gzip -b 1M` on the same files.
# Usage: bench/bench-pack.sh [--quick] [WORKDIR]   (quick = 4 layers)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=$root/${B:-build}/bin
quick=0
[ "${1:-}" = --quick ] && { quick=1; shift; }
work=${1:-$(mktemp -d /tmp/ckpt-bench-pack.XXXXXX)}
mkdir -p "$work"
layers=24
[ $quick = 1 ] && layers=4

now() { date +%s.%N; }
mbps() { awk -v b="$1" -v t0="$2" -v t1="$3" 'BEGIN { printf "%.0f", b / 1e6 / (t1 - t0) }'; }
size_of() { du -sb "$1" | cut -f1; }

"$bin/ckpt" keygen -o "$work/key" 2>/dev/null || true
printf '| data | method | ratio | pack MB/s | unpack MB/s |\n|---|---|---|---|---|\n'
for dtype in bf16 f32; do
  src=$work/src-$dtype
  [ -d "$src" ] || "$bin/ckpt-gen" "$src" --preset gpt2-medium --layers $layers --dtype $dtype >/dev/null
  logical=$(size_of "$src")
  for mode in compressed encrypted stored; do
    out=$work/$dtype-$mode.tpack
    rm -f "$out"
    args=() keys=()
    [ $mode = encrypted ] && keys=(--key-file "$work/key")
    [ $mode = stored ] && args=(--no-compress)
    sync
    t0=$(now); "$bin/ckpt" pack "$src" -o "$out" "${args[@]}" "${keys[@]}" >/dev/null; t1=$(now)
    stored=$(stat -c %s "$out")
    rm -rf "$work/out"
    t2=$(now); "$bin/ckpt" unpack "$out" -o "$work/out" "${keys[@]}" >/dev/null; t3=$(now)
    cmp -s "$work/out/model.safetensors" "$src/model.safetensors" || { echo "round trip FAILED for $out" >&2; exit 1; }
    printf '| %s %s MB | ckpt %s | %.3f | %s | %s |\n' $dtype $((logical / 1000000)) $mode \
      "$(awk -v a=$logical -v b=$stored 'BEGIN{print a/b}')" "$(mbps $logical $t0 $t1)" \
      "$(mbps $logical $t2 $t3)"
    rm -f "$out"
  done
  if command -v mksquashfs >/dev/null; then
    img=$work/$dtype.sqfs
    rm -f "$img"
    t0=$(now); mksquashfs "$src" "$img" -comp gzip -b 1M -noappend -quiet >/dev/null; t1=$(now)
    stored=$(stat -c %s "$img")
    rm -rf "$work/out"
    t2=$(now); unsquashfs -q -d "$work/out" "$img" >/dev/null; t3=$(now)
    printf '| %s %s MB | mksquashfs gzip -b 1M | %.3f | %s | %s |\n' $dtype $((logical / 1000000)) \
      "$(awk -v a=$logical -v b=$stored 'BEGIN{print a/b}')" "$(mbps $logical $t0 $t1)" \
      "$(mbps $logical $t2 $t3)"
    rm -f "$img"
  fi
done
rm -rf "$work/out"
echo "cores: $(nproc); data kept in $work"
