#!/usr/bin/env bash
# Runs Criterion test binaries one after another, stopping at the first that
# fails, and totals their results.
# Usage: scripts/run-unit.sh BIN...
# Last line: "unit: N passed, N failed" (crashed tests count as failed).
set -uo pipefail

[ $# -ge 1 ] || { echo "usage: $0 BIN..." >&2; exit 2; }

passed=0
failed=0
status=0
log=$(mktemp)
trap 'rm -f "$log"' EXIT

for bin in "$@"; do
  name=$(basename "$bin")
  "$bin" --jobs 2 --short-filename >"$log" 2>&1
  rc=$?
  # Criterion colours its output when it thinks it may; strip escapes so the
  # summary can be parsed either way.
  synth=$(sed -e 's/\x1b\[[0-9;]*m//g' -e 's/[[:space:]]*$//' "$log" | grep -m1 'Synthesis: Tested:')
  if [[ $synth =~ Passing:\ ([0-9]+)\ \|\ Failing:\ ([0-9]+)\ \|\ Crashing:\ ([0-9]+) ]]; then
    p=${BASH_REMATCH[1]}
    f=$((BASH_REMATCH[2] + BASH_REMATCH[3]))
  else
    # No summary: the runner itself died (or the binary is not Criterion's).
    p=0
    f=1
  fi
  passed=$((passed + p))
  failed=$((failed + f))
  if [ $rc -ne 0 ] || [ "$f" -ne 0 ]; then
    cat "$log"
    echo "$name: FAILED (exit $rc, $p passed, $f failed)"
    status=1
    break
  fi
  echo "$name: ${synth#*Synthesis: }"
done

echo "unit: $passed passed, $failed failed"
exit $status
