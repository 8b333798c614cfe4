#!/usr/bin/env bash
# Concurrent writers into different checkpoints of one mount (cp -r and
# python writers at once, with auto-commit on), commits overlapping with
# writing, and readers of committed checkpoints meanwhile: every checkpoint
# ends committed and byte-identical to what was written.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/write_lib.sh"
SRC=$TMP/src
mkdir -p "$BACK"
"$CKPT_GEN" "$SRC" --preset tiny --format both --shards 3 >/dev/null || { fail "ckpt-gen"; finish; }
head -c $((40 << 20)) /dev/urandom >"$SRC/noise.bin"
for s in 1 2 3; do $PY "$WCLIENTS" save "$TMP/plain$s" mixed "$s" >/dev/null; done

mount_ckptfs "$BACK" "$MNT" "$LOG" -o commit_delay=1 || { fail "mount" "$(cat "$LOG")"; finish; }
mkdir "$MNT/first"
cp -r "$SRC/." "$MNT/first/"
"$CKPT" commit --wait "$MNT/first" >/dev/null || fail "a first checkpoint commits"

pids=()
for i in 1 2 3; do
    (mkdir "$MNT/cp$i" && cp -r "$SRC/." "$MNT/cp$i/") &
    pids+=($!)
    (mkdir "$MNT/py$i" && $PY "$WCLIENTS" save "$MNT/py$i" mixed "$i" >/dev/null) &
    pids+=($!)
done
# A reader of a committed checkpoint meanwhile.
(for _ in 1 2 3; do cmp -s "$SRC/noise.bin" "$MNT/first/noise.bin" || echo bad; done >"$TMP/reader.out") &
pids+=($!)
bad=0
for p in "${pids[@]}"; do wait "$p" || bad=$((bad + 1)); done
[ $bad -eq 0 ] && pass "6 writers at once into 6 checkpoints" || fail "6 writers at once into 6 checkpoints" "$bad failed"
[ ! -s "$TMP/reader.out" ] && pass "a reader of a committed checkpoint meanwhile" || fail "a reader meanwhile"
# Explicit commits racing the auto-commits.
"$CKPT" commit "$MNT/cp1" >/dev/null &
c1=$!
"$CKPT" commit "$MNT/py1" >/dev/null &
c2=$!
wait $c1 $c2
for c in cp1 cp2 cp3 py1 py2 py3; do
    wait_state "$c committed" "$MNT/$c" committed 120
done
for i in 1 2 3; do
    expect_ok "cp$i byte-identical" $PY "$WCLIENTS" same-tree "$SRC" "$MNT/cp$i" --packed
    expect_ok "py$i byte-identical" $PY "$WCLIENTS" same-tree "$TMP/plain$i" "$MNT/py$i" --packed
    expect_ok "py$i loads" $PY "$WCLIENTS" verify "$MNT/py$i" mixed "$i"
done
expect_ok "ckpt status" "$CKPT" status "$MNT"
[ "$(grep -c committed "$LAST_OUT")" -eq 7 ] && pass "shows all 7 committed" || fail "shows all 7 committed" "$(cat "$LAST_OUT")"
unmount_ckptfs "$MNT"
finish
