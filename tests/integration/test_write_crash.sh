#!/usr/bin/env bash
# Crash safety of writing: the daemon is killed with SIGKILL at random
# moments (while a writer is writing and fsyncing, while packing, just
# after a commit), then restarted over the same backing directory. Never
# is a half-written NAME.tpack visible; after the restart every checkpoint
# is where it was (writing stays writing, packing resumes, committed stays
# committed), no .tmp is left, and every fsynced file is intact, before and
# after it is finally committed. One more kill lands exactly between the
# pack's rename and the directory fsync. Once without a key, then with one (sealed
# staging, whose logs must recover from a cut tail).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/write_lib.sh"

ROUNDS=${CRASH_ROUNDS:-15}
KEYED_ROUNDS=${CRASH_KEYED_ROUNDS:-6}
cd "$TMP" || exit 1
"$CKPT" keygen -o "$TMP/key" >/dev/null

# sleep_random SEED MAX: sleeps between 0 and MAX seconds.
sleep_random() {
    sleep "$(awk -v s="$1" -v m="$2" 'BEGIN { srand(s); printf "%.3f", rand() * m }')"
}

# no_half_packs BACK: every visible pack is complete and valid.
no_half_packs() {
    local p bad=()
    for p in "$1"/*.tpack; do
        [ -e "$p" ] || continue
        "$CKPT" verify "$p" "${KEYOPT[@]}" >/dev/null 2>&1 || bad+=("$(basename "$p")")
    done
    [ ${#bad[@]} -eq 0 ] || { echo "not valid: ${bad[*]}"; return 1; }
}

# crash_rounds LABEL ROUNDS [ckptfs options...]
crash_rounds() {
    local label=$1 rounds=$2 i mode name s kept=()
    shift 2
    local back=$TMP/$label/back mnt=$TMP/$label/mnt log=$TMP/$label/ckptfs.log
    mkdir -p "$back"
    local ok_rounds=0 states="" tmps=0
    for i in $(seq "$rounds"); do
        mount_ckptfs "$back" "$mnt" "$log" -o commit_delay=0 "$@" || { fail "$label: mount $i" "$(tail -3 "$log")"; return; }
        name=c$i
        mkdir "$mnt/$name"
        $PY "$WCLIENTS" crash-writer "$mnt/$name" "$TMP/$label/$name.log" "$i" >/dev/null 2>&1 &
        local writer=$!
        sleep_random "$i" 1.0
        mode=$((RANDOM % 3))
        if [ $mode -gt 0 ]; then
            kill -KILL $writer 2>/dev/null
            wait $writer 2>/dev/null
            "$CKPT" commit "$mnt/$name" >/dev/null 2>&1
            [ $mode -eq 2 ] && sleep_random "$((i * 7))" 1.5
        fi
        crash_ckptfs "$mnt"
        kill -KILL $writer 2>/dev/null
        wait $writer 2>/dev/null
        if ! out=$(no_half_packs "$back"); then
            fail "$label round $i: no half-written pack is ever visible" "$out"
            return
        fi
        # A .tmp after the restart may be packing resumed; the one the
        # crash left must have been removed first (and said so).
        local had_tmp=0 removed_before
        local t
        for t in "$back"/.*.tpack.tmp; do [ -e "$t" ] && had_tmp=1; done
        removed_before=$(grep -c "unfinished pack" "$log")
        mount_ckptfs "$back" "$mnt" "$log" -o commit_delay=0 "$@" || { fail "$label: remount $i" "$(tail -3 "$log")"; return; }
        if [ $had_tmp -eq 1 ] && [ "$(grep -c "unfinished pack" "$log")" -le "$removed_before" ]; then
            fail "$label round $i: the leftover .tmp is removed at restart" "$(tail -3 "$log")"
            return
        fi
        tmps=$((tmps + had_tmp))
        s=$(state_of "$mnt/$name")
        states+="$mode:$s "
        if [ $mode -eq 0 ] && [ "$s" != writing ]; then
            fail "$label round $i: killed while writing, it is writing again" "state $s"
            return
        fi
        if [ $mode -gt 0 ] && [ "$s" != packing ] && [ "$s" != committed ]; then
            fail "$label round $i: killed after the commit, it is packing or committed" "state $s"
            return
        fi
        if ! out=$($PY "$WCLIENTS" crash-check "$mnt/$name" "$TMP/$label/$name.log" "$i" 2>&1); then
            fail "$label round $i: every fsynced file intact after the restart ($s)" "$out"
            return
        fi
        if ! "$CKPT" commit --wait "$mnt/$name" >/dev/null 2>"$TMP/commit.err"; then
            fail "$label round $i: commits after the restart" "$(cat "$TMP/commit.err")"
            return
        fi
        if ! out=$($PY "$WCLIENTS" crash-check "$mnt/$name" "$TMP/$label/$name.log" "$i" 2>&1); then
            fail "$label round $i: every fsynced file intact in the pack" "$out"
            return
        fi
        kept+=("$name")
        # Keep the disk small: only the last few stay for the final check.
        if [ ${#kept[@]} -gt 3 ]; then
            rm -r "${mnt:?}/${kept[0]}"
            kept=("${kept[@]:1}")
        fi
        unmount_ckptfs "$mnt" || { fail "$label round $i: clean unmount" "$(tail -3 "$log")"; return; }
        ok_rounds=$((ok_rounds + 1))
    done
    pass "$label: $ok_rounds rounds of SIGKILL and restart (mode:state $states; $tmps leftover .tmp removed)"
    mount_ckptfs "$back" "$mnt" "$log" -o commit_delay=0 "$@" || { fail "$label: final mount"; return; }
    local broken=0
    for name in "${kept[@]}"; do
        [ "$(state_of "$mnt/$name")" = committed ] || broken=1
        $PY "$WCLIENTS" crash-check "$mnt/$name" "$TMP/$label/${name}.log" 0 >/dev/null || broken=1
    done
    [ $broken -eq 0 ] && pass "$label: committed checkpoints intact after a last remount" ||
        fail "$label: committed checkpoints intact after a last remount"
    [ -z "$(ls "$back/.ckptfs/stage")" ] && pass "$label: no staging left behind" ||
        fail "$label: no staging left behind" "$(ls "$back/.ckptfs/stage")"
    unmount_ckptfs "$mnt"
    if grep -qiE "sanitizer|assert" "$log"; then fail "$label: no crash traces" "$(grep -iE 'sanitizer|assert' "$log" | head -3)"
    else pass "$label: no crash traces in the log"; fi
}

# rename_window: the narrowest kill point, after .NAME.tpack.tmp is renamed
# to NAME.tpack but before the backing directory is fsynced and the daemon
# records the commit. strace holds the daemon for 5 s right after a rename
# inside the backing directory itself returns (-P: only the packer's commit
# renames there; staging renames inside .ckptfs/), and the daemon is
# killed there. After the restart the checkpoint is committed,
# from that pack, with every file intact and nothing left in staging.
rename_window() {
    if ! command -v strace >/dev/null; then
        skip "killed between rename and directory fsync" "no strace (apt-get install strace)"
        return
    fi
    local back=$TMP/rw/back mnt=$TMP/rw/mnt log=$TMP/rw/ckptfs.log plain=$TMP/rw/plain _ tracer daemon
    mkdir -p "$back" "$mnt"
    strace -f -qq -o /dev/null -P "$back" -e trace=rename,renameat,renameat2 \
        -e inject=rename,renameat,renameat2:delay_exit=5000000 \
        "$CKPTFS" -f -o commit_delay=0 "$back" "$mnt" 2>>"$log" &
    tracer=$!
    for _ in $(seq 400); do mountpoint -q "$mnt" && break; sleep 0.05; done
    mountpoint -q "$mnt" || { fail "rename window: mount under strace" "$(tail -3 "$log")"; return; }
    # One kind: its files go straight into r/, which is then the checkpoint.
    $PY "$WCLIENTS" save "$plain" torch-per-tensor 11 >/dev/null &&
        mkdir "$mnt/r" && $PY "$WCLIENTS" save "$mnt/r" torch-per-tensor 11 >/dev/null &&
        "$CKPT" commit "$mnt/r" >/dev/null || { fail "rename window: write and commit" "$(tail -3 "$log")"; return; }
    for _ in $(seq 400); do [ -e "$back/r.tpack" ] && break; sleep 0.05; done
    daemon=$(pgrep -P "$tracer" -x ckptfs)
    [ -e "$back/r.tpack" ] && [ -n "$daemon" ] && kill -KILL "$daemon"
    wait "$tracer" 2>/dev/null
    fusermount3 -u -z "$mnt" 2>/dev/null
    if grep -q "checkpoint 'r' committed" "$log"; then
        fail "rename window: killed after the rename, before the commit was recorded" "$(tail -2 "$log")"
        return
    fi
    pass "rename window: killed right after the rename (pack in place, commit not yet logged)"
    mount_ckptfs "$back" "$mnt" "$log" -o commit_delay=0 || { fail "rename window: remount" "$(tail -3 "$log")"; return; }
    [ "$(state_of "$mnt/r")" = committed ] && pass "rename window: committed after the restart" ||
        fail "rename window: committed after the restart" "state $(state_of "$mnt/r")"
    expect_ok "rename window: every file byte-identical, from the pack" $PY "$WCLIENTS" same-tree "$plain" "$mnt/r" --packed
    expect_ok "rename window: and loads back" $PY "$WCLIENTS" verify "$mnt/r" torch-per-tensor 11
    expect_ok "rename window: the pack verifies" "$CKPT" verify "$back/r.tpack"
    [ -z "$(ls "$back/.ckptfs/stage")" ] && pass "rename window: its staging was removed" ||
        fail "rename window: its staging was removed" "$(ls "$back/.ckptfs/stage")"
    unmount_ckptfs "$mnt" || fail "rename window: clean unmount" "$(tail -3 "$log")"
}

rename_window
KEYOPT=()
crash_rounds plain "$ROUNDS"
KEYOPT=(--key-file "$TMP/key")
crash_rounds keyed "$KEYED_ROUNDS" -o key_file="$TMP/key"
finish
