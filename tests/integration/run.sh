#!/usr/bin/env bash
# Runs every tests/integration/test_*.sh and tallies their assertions.
#
# A test file reports through lib.sh: PASS/FAIL lines and a final
# "RESULT pass=N fail=N skip=N". A file that cannot run here (no FUSE, say)
# prints "SKIP: <reason>" and exits 77 (or 0) without a RESULT line; it is
# then listed as skipped. Any other way of ending (a crash, a missing RESULT
# line, a skip without a reason) counts as a failure, so a broken test cannot
# pass by saying nothing.
#
# Usage: tests/integration/run.sh [test_name_or_path...]   (default: all)
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
if [ $# -gt 0 ]; then
    tests=()
    for t in "$@"; do
        case $t in */*) tests+=("$t") ;; *) tests+=("$here/${t%.sh}.sh") ;; esac
    done
else
    tests=("$here"/test_*.sh)
    [ -e "${tests[0]}" ] || tests=()
fi

passed=0
failed=0
skipped=()
for t in "${tests[@]}"; do
    name=$(basename "$t")
    echo "=== $name"
    out=$(mktemp)
    bash "$t" 2>&1 | tee "$out"
    rc=${PIPESTATUS[0]}
    result=$(grep -E '^RESULT pass=[0-9]+ fail=[0-9]+' "$out" | tail -n 1)
    reason=$(grep -m1 -E '^SKIP: .+' "$out" | cut -c7-)
    if [ -n "$reason" ] && [ -z "$result" ] && { [ "$rc" -eq 77 ] || [ "$rc" -eq 0 ]; }; then
        skipped+=("$name ($reason)")
        rm -f "$out"
        continue
    fi
    if [ -n "$result" ]; then
        p=$(sed -E 's/^RESULT pass=([0-9]+).*/\1/' <<<"$result")
        f=$(sed -E 's/^RESULT pass=[0-9]+ fail=([0-9]+).*/\1/' <<<"$result")
        passed=$((passed + p))
        failed=$((failed + f))
        # Exiting non-zero with no failed assertion means the script died.
        if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
            echo "FAIL $name: exited with status $rc"
            failed=$((failed + 1))
        fi
    elif [ "$rc" -eq 0 ]; then
        echo "FAIL $name: ended without a RESULT line (did it call finish?)"
        failed=$((failed + 1))
    else
        # Keep what it did report before dying, plus the death itself.
        passed=$((passed + $(grep -c '^PASS ' "$out")))
        failed=$((failed + $(grep -c '^FAIL ' "$out") + 1))
        echo "FAIL $name: exited with status $rc before finishing"
    fi
    rm -f "$out"
done

for s in ${skipped[@]+"${skipped[@]}"}; do
    echo "skipped: $s"
done
echo "integration: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
