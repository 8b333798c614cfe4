#!/usr/bin/env bash
# A full backing filesystem (a small tmpfs): writing into a checkpoint gets
# ENOSPC, the checkpoint turns failed with the reason (log, xattr and
# ckpt status alike, whatever is written meanwhile), and after space is
# freed and what failed is removed it can be fixed and committed. A pack that does not fit fails the
# same way, leaves no temporary file, keeps the staged data, and a later
# `ckpt commit` succeeds.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/write_lib.sh"

cd "$TMP" || exit 1
SMALL=$TMP/small
mkdir -p "$SMALL"
mount -t tmpfs -o size=48m tmpfs "$SMALL" 2>/dev/null || skip_all "cannot mount a tmpfs (needs root)"
trap 'unmount_all; umount "$SMALL" 2>/dev/null; cleanup_tmp' EXIT
BACK=$SMALL/back
MNT=$TMP/mnt
LOG=$TMP/ckptfs.log
mkdir -p "$BACK"
mount_ckptfs "$BACK" "$MNT" "$LOG" -o commit_delay=0 || { fail "mount" "$(cat "$LOG")"; finish; }

head -c $((80 << 20)) /dev/urandom >"$TMP/80m"
head -c $((20 << 20)) /dev/urandom >"$TMP/20m"
head -c $((4 << 20)) /dev/urandom >"$TMP/4m"

# ------------------------------------------------------- while writing

mkdir "$MNT/full"
expect_fail "cp of 80 MB into 48 MB fails" cp "$TMP/80m" "$MNT/full/x"
last_stderr_has "with ENOSPC" "No space left on device"
[ "$(state_of "$MNT/full")" = failed ] && pass "the checkpoint is failed" || fail "the checkpoint is failed" "$(state_of "$MNT/full")"
err=$(getfattr --only-values -n user.ckptfs.error "$MNT/full" 2>/dev/null)
case $err in *"No space left"*) pass "user.ckptfs.error says why: $err" ;; *) fail "user.ckptfs.error says why" "'$err'" ;; esac
if grep -q "state is now failed" "$LOG"; then pass "a log line says so"; else fail "a log line says so" "$(tail -3 "$LOG")"; fi
# Exit status 3 tells a script that a checkpoint failed (1 is for a
# mount it could not read).
expect_exit "ckpt status shows it, exit status 3" 3 "$CKPT" status "$MNT"
last_stdout_matches "failed, with the reason" '^full +failed .*No space left'
expect_exit "ckpt status MOUNT/NAME of it: exit status 3" 3 "$CKPT" status "$MNT/full"
# On a terminal the live view draws the table once: the same answer.
if command -v script >/dev/null; then
    expect_exit "  on a terminal too" 3 script -qec "'$CKPT' status '$MNT'" /dev/null
    last_stdout_has "  drawing the table" "failed"
else
    skip "ckpt status on a terminal" "no script(1)"
fi
expect_ok "the partial file is still readable" head -c 1000 "$MNT/full/x"
# A write that fits (in place, over bytes already staged) succeeds, but
# the bytes that failed are still missing: failed, everywhere, with why.
expect_ok "a later write that fits succeeds" $PY -c "
import os
fd = os.open('$MNT/full/x', os.O_WRONLY)
os.pwrite(fd, b'z' * 4096, 0)
os.close(fd)"
[ "$(state_of "$MNT/full")" = failed ] && pass "the checkpoint stays failed (xattr)" ||
    fail "the checkpoint stays failed (xattr)" "$(state_of "$MNT/full")"
expect_exit "ckpt status" 3 "$CKPT" status "$MNT"
last_stdout_matches "stays failed with the reason (ckpt status)" '^full +failed .*No space left'
if grep -q "writing again" "$LOG"; then fail "and the log says nothing else" "$(grep "writing again" "$LOG")"; else pass "and the log says nothing else"; fi
# A write is answered before it is copied to the staging file, so the
# copy's ENOSPC reaches the writer at its fsync or close, as a local
# disk's writeback error does: never lost, and said once.
# late_enospc FILE CALL: one 64 KiB write (one request, answered whole)
# into FILE on the full disk, then CALL ("fsync" or "close") says ENOSPC.
late_enospc() {
    expect_ok "a write answered before it failed: $2 says ENOSPC" $PY -c "
import errno, os
fd = os.open('$1', os.O_WRONLY | os.O_CREAT, 0o644)
assert os.write(fd, b'x' * 65536) == 65536, 'short write'
try:
    os.fsync(fd) if '$2' == 'fsync' else os.close(fd)
except OSError as e:
    assert e.errno == errno.ENOSPC, e
else:
    raise SystemExit('$2 succeeded')
if '$2' == 'fsync':
    os.close(fd)  # taken by fsync: nothing more to say"
}
late_enospc "$MNT/full/late" close
late_enospc "$MNT/full/late2" fsync
expect_ok "and the next close of it has nothing more to say" $PY -c "
import os
os.close(os.open('$MNT/full/late', os.O_WRONLY))"
expect_ok "removing them frees the space" rm "$MNT/full/x" "$MNT/full/late" "$MNT/full/late2"
expect_ok "a smaller file then fits" cp "$TMP/4m" "$MNT/full/y"
# Writing again once the namespace, whose save failed too, is saved.
wait_state "and the checkpoint is writing again" "$MNT/full" writing 15
if grep -q "state is writing again" "$LOG"; then pass "which the log says too"; else fail "which the log says too" "$(tail -3 "$LOG")"; fi
expect_ok "it commits" "$CKPT" commit --wait "$MNT/full"
expect_same_sha256 "and reads back from the pack" "$TMP/4m" "$MNT/full/y"

# ------------------------------------------------------- while packing

# 20 MB staged plus a 20 MB filler: the pack (another 20 MB) cannot fit.
mkdir "$MNT/p"
expect_ok "20 MB staged" cp "$TMP/20m" "$MNT/p/data"
expect_ok "a filler takes most of the rest" bash -c "head -c $((19 << 20)) /dev/zero >'$BACK/filler' || true"
expect_fail "ckpt commit --wait fails when the pack does not fit" "$CKPT" commit --wait "$MNT/p"
last_stderr_has "and says why" "packing failed" "No space left on device"
[ "$(state_of "$MNT/p")" = failed ] && pass "state failed" || fail "state failed" "$(state_of "$MNT/p")"
expect_exit "ckpt status: a pack that failed is exit status 3 too" 3 "$CKPT" status "$MNT"
expect_absent "no temporary pack is left" "$BACK/.p.tpack.tmp" "$BACK/p.tpack"
expect_same_sha256 "the staged data is kept" "$TMP/20m" "$MNT/p/data"
rm -f "$BACK/filler"
expect_ok "after freeing space, ckpt commit retries and succeeds" "$CKPT" commit --wait "$MNT/p"
expect_same_sha256 "the pack reads back" "$TMP/20m" "$MNT/p/data"
expect_ok "ckpt status: nothing failed any more, exit status 0" "$CKPT" status "$MNT"

unmount_ckptfs "$MNT"
mount_ckptfs "$BACK" "$MNT" "$LOG" -o commit_delay=0 || { fail "remount"; finish; }
expect_same_sha256 "still there after a remount" "$TMP/20m" "$MNT/p/data"

# ------------------------------------------------------- while reopening

# A late write into a committed checkpoint on a full disk: its staging
# cannot be started, and the writer hears ENOSPC, as from any full disk
# (it heard EROFS, as if the mount were read-only).
expect_ok "a filler takes all the room" bash -c "head -c $((48 << 20)) /dev/zero >'$BACK/filler' 2>/dev/null || true"
# late_open WHAT FLAGS FILE: opening FILE with FLAGS gets ENOSPC.
late_open() {
    expect_ok "$1 in a committed checkpoint on a full disk: ENOSPC" $PY -c "
import errno, os
try:
    os.close(os.open('$3', $2, 0o644))
except OSError as e:
    assert e.errno == errno.ENOSPC, e
else:
    raise SystemExit('opened')"
}
late_open "a new file" "os.O_WRONLY | os.O_CREAT" "$MNT/p/new"
late_open "a packed file opened for writing" "os.O_WRONLY" "$MNT/p/data"
if grep -q "cannot write into checkpoint 'p': .*No space left" "$LOG"; then
    pass "the log names the checkpoint and says why"
else
    fail "the log names the checkpoint and says why" "$(tail -3 "$LOG")"
fi
rm -f "$BACK/filler"
head -c 65536 /dev/urandom >"$TMP/64k"
expect_ok "with room again, the late write succeeds" cp "$TMP/64k" "$MNT/p/new"
expect_ok "and commits" "$CKPT" commit --wait "$MNT/p"
expect_same_sha256 "  the new file reads back" "$TMP/64k" "$MNT/p/new"
expect_same_sha256 "  the old one too" "$TMP/20m" "$MNT/p/data"
unmount_ckptfs "$MNT"
finish
