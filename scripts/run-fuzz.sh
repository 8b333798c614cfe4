#!/usr/bin/env bash
# Runs libFuzzer binaries for a fixed time each, over a scratch copy of their
# seed corpus (fuzz/corpus/X for fuzz_X) so the checked-in seeds never change.
# Usage: scripts/run-fuzz.sh SECONDS BIN...
# Prints one line per target; exits 1 if any target crashed, leaked or timed
# out, 2 on usage errors or when clang/libFuzzer is missing.
set -uo pipefail

usage() { echo "usage: $0 SECONDS BIN..." >&2; exit 2; }
[ $# -ge 2 ] || usage
secs=$1; shift
if ! [[ $secs =~ ^[0-9]+$ ]] || [ "$secs" -eq 0 ]; then usage; fi

root=$(cd "$(dirname "$0")/.." && pwd)
clang=${CLANG:-clang}

# The binaries need clang's libFuzzer runtime; say so plainly rather than
# leaving a reader to decode a link error.
if ! command -v "$clang" >/dev/null 2>&1; then
  echo "run-fuzz: $clang not found; install clang (scripts/deps.sh test)" >&2
  exit 2
fi
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
printf '#include <stddef.h>\n#include <stdint.h>\nint LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }\n' >"$probe/p.c"
if ! "$clang" -fsanitize=fuzzer "$probe/p.c" -o "$probe/p" >"$probe/log" 2>&1; then
  echo "run-fuzz: $clang cannot link -fsanitize=fuzzer (libFuzzer runtime missing;" \
       "install libclang-rt-14-dev, see scripts/deps.sh test):" >&2
  sed 's/^/  /' "$probe/log" >&2
  exit 2
fi

failed=0
for bin in "$@"; do
  name=$(basename "$bin")
  target=${name#fuzz_}
  if [ ! -x "$bin" ]; then
    echo "$name: FAILED (no such executable: $bin)"
    failed=1
    continue
  fi
  work=$(mktemp -d "${TMPDIR:-/tmp}/fuzz-$target.XXXXXX")
  mkdir -p "$work/corpus" "$work/artifacts"
  if [ -d "$root/fuzz/corpus/$target" ]; then
    cp -R "$root/fuzz/corpus/$target/." "$work/corpus/"
  fi
  seeds=$(find "$work/corpus" -type f | wc -l)
  # A token dictionary (fuzz/X.dict) helps the fuzzer past keyword checks.
  dict=()
  [ -f "$root/fuzz/$target.dict" ] && dict=(-dict="$root/fuzz/$target.dict")
  "$bin" -max_total_time="$secs" -rss_limit_mb=2048 -print_final_stats=1 \
         -artifact_prefix="$work/artifacts/" "${dict[@]}" "$work/corpus" >"$work/log" 2>&1
  rc=$?
  runs=$(sed -n 's/^Done \([0-9]*\) runs.*/\1/p' "$work/log" | tail -n1)
  found=$(find "$work/corpus" -type f | wc -l)
  if [ $rc -eq 0 ]; then
    echo "$name: ok, ${runs:-?} runs in ${secs}s, corpus $seeds -> $found"
    rm -rf "$work"
  else
    # Keep the log and the crashing input for whoever looks next.
    art=$(find "$work/artifacts" -type f | head -n1)
    reason=$(grep -m1 -E 'ERROR: (libFuzzer|AddressSanitizer|LeakSanitizer|UndefinedBehaviorSanitizer)|runtime error:' "$work/log" | sed 's/^==[0-9]*==//')
    echo "$name: CRASHED (exit $rc) ${reason:-}; input ${art:-none}, log $work/log"
    failed=1
  fi
done
exit $failed
