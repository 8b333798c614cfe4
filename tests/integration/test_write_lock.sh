#!/usr/bin/env bash
# One writer per backing directory. A writable daemon locks
# BACKING/.ckptfs/lock; a second writable daemon on the same backing
# directory fails at start, naming the first one's pid and mount point,
# and deletes nothing (the fault this guards against: its recovery took
# the first daemon's unsynced files for crash leftovers and removed them).
# A read-only mount beside the writer is fine; mounting twice on one mount
# point is refused.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/write_lib.sh"

MNT2=$TMP/mnt2
MNT3=$TMP/mnt3
LOG2=$TMP/second.log
mkdir -p "$BACK" "$MNT2"
mount_ckptfs "$BACK" "$MNT" "$LOG" -o commit_delay=0 || { fail "mount" "$(cat "$LOG")"; finish; }
first=${DAEMON_OF[$MNT]}

lock=$(cat "$BACK/.ckptfs/lock" 2>/dev/null)
[ "$lock" = "pid $first mount $MNT" ] && pass "the lock file names the writer: $lock" ||
    fail "the lock file names the writer" "'$lock', want 'pid $first mount $MNT'"

# Written, never fsynced: exactly what the second daemon's recovery deleted.
head -c $((8 << 20)) /dev/urandom >"$TMP/data"
mkdir "$MNT/run"
cp "$TMP/data" "$MNT/run/weights.bin"
# The staged data blobs: the first daemon may still rewrite its namespace
# and record files on its own timer, but nothing may delete or change data.
staged_data() { find "$BACK/.ckptfs/stage" -path '*/data/*' -type f | sort | xargs sha256sum 2>/dev/null | sha256sum; }
staged_before=$(staged_data)

expect_fail "a second writable daemon on the same backing dir fails" "$CKPTFS" -f "$BACK" "$MNT2"
last_stderr_has "naming the pid and mount point that hold the lock" \
    "already served by a writable ckptfs" "pid $first, mounted on $MNT"
if mountpoint -q "$MNT2"; then fail "and mounts nothing" "$MNT2 is mounted"; fusermount3 -u "$MNT2"; else pass "and mounts nothing"; fi
expect_fail "in the background too (exit status of the foreground part)" "$CKPTFS" "$BACK" "$MNT2"
last_stderr_has "with the same message" "pid $first, mounted on $MNT"
staged_after=$(staged_data)
[ "$staged_before" = "$staged_after" ] && pass "no staged file was touched" || fail "no staged file was touched"
[ "$(cat "$BACK/.ckptfs/lock")" = "pid $first mount $MNT" ] && pass "the lock file still names the first" ||
    fail "the lock file still names the first" "$(cat "$BACK/.ckptfs/lock")"
expect_same_sha256 "the unsynced file reads back whole" "$TMP/data" "$MNT/run/weights.bin"

# A read-only mount beside the writer takes no lock and serves the packs.
expect_ok "commit" "$CKPT" commit --wait "$MNT/run"
mount_ckptfs "$BACK" "$MNT3" "$TMP/ro.log" -o ro && pass "a read-only mount beside it works" ||
    fail "a read-only mount beside it works" "$(cat "$TMP/ro.log")"
expect_same_sha256 "and reads the committed pack" "$TMP/data" "$MNT3/run/weights.bin"
[ "$(cat "$BACK/.ckptfs/lock")" = "pid $first mount $MNT" ] && pass "and leaves the lock alone" ||
    fail "and leaves the lock alone" "$(cat "$BACK/.ckptfs/lock")"
unmount_ckptfs "$MNT3"
# -r, which libfuse takes for ro: read-only for ckptfs too, not a writer
# that the kernel mounted read-only.
if mount_ckptfs "$BACK" "$MNT3" "$TMP/r.log" -r; then
    pass "-r beside the writer works"
    expect_same_sha256 "-r reads the committed pack" "$TMP/data" "$MNT3/run/weights.bin"
    unmount_ckptfs "$MNT3"
else
    fail "-r beside the writer works" "$(cat "$TMP/r.log")"
fi

# Mounting again on a mount point that is a ckptfs mount.
mkdir -p "$TMP/other"
expect_fail "mounting on an existing ckptfs mount fails" "$CKPTFS" -f -o ro "$TMP/other" "$MNT"
last_stderr_has "and says so" "$MNT is already a ckptfs mount"
expect_same_sha256 "the first mount still serves" "$TMP/data" "$MNT/run/weights.bin"

# Once the writer is gone, the next one takes the lock (no stale lock).
crash_ckptfs "$MNT"
mount_ckptfs "$BACK" "$MNT2" "$LOG2" -o commit_delay=0 && pass "after the writer died (SIGKILL), a new one starts" ||
    fail "after the writer died (SIGKILL), a new one starts" "$(cat "$LOG2")"
second=${DAEMON_OF[$MNT2]}
[ "$(cat "$BACK/.ckptfs/lock")" = "pid $second mount $MNT2" ] && pass "and records itself" ||
    fail "and records itself" "$(cat "$BACK/.ckptfs/lock")"
expect_same_sha256 "the data is there" "$TMP/data" "$MNT2/run/weights.bin"
unmount_ckptfs "$MNT2"

# Daemonized (no -f): the lock names the daemon, not the process that forked it.
expect_ok "a daemonized writer" "$CKPTFS" "$BACK" "$MNT2"
daemon=$(pgrep -f "^$CKPTFS $BACK $MNT2\$" | head -1)
[ -n "$daemon" ] && [ "$(cat "$BACK/.ckptfs/lock")" = "pid $daemon mount $MNT2" ] &&
    pass "records the daemon's own pid" || fail "records the daemon's own pid" "$(cat "$BACK/.ckptfs/lock") (daemon $daemon)"
fusermount3 -u "$MNT2"
for _ in $(seq 100); do kill -0 "$daemon" 2>/dev/null || break; sleep 0.05; done

# The staging area is the daemon's own and private: one left wider (an older
# ckptfs, a backup restored) is made 0700; one another user owns (who could
# read, replace or plant staged data and the lock) leaves the mount
# read-only, saying why.
BACK3=$TMP/back3
mkdir -p "$BACK3/.ckptfs/stage"
chmod 777 "$BACK3/.ckptfs" "$BACK3/.ckptfs/stage"
mount_ckptfs "$BACK3" "$MNT2" "$LOG2" -o commit_delay=0 || fail "mount over a wide staging area" "$(cat "$LOG2")"
expect_ok "writes there" mkdir "$MNT2/w"
m=$(stat -c %a "$BACK3/.ckptfs" "$BACK3/.ckptfs/stage" | tr '\n' ' ')
[ "$m" = "700 700 " ] && pass "the staging area is made 0700" || fail "the staging area is made 0700" "$m"
unmount_ckptfs "$MNT2"
if [ "$(id -u)" = 0 ]; then
    chown 65534 "$BACK3/.ckptfs/stage"
    : >"$LOG2"
    mount_ckptfs "$BACK3" "$MNT2" "$LOG2" -o commit_delay=0 || fail "mount over a foreign staging area" "$(cat "$LOG2")"
    expect_fail "a staging area another user owns: no writing" mkdir "$MNT2/w2"
    grep -q "owned by uid 65534" "$LOG2" && pass "and the log says why" || fail "and the log says why" "$(cat "$LOG2")"
    unmount_ckptfs "$MNT2"
else
    skip "a staging area another user owns" "needs root to chown"
fi
finish
