#!/usr/bin/env bash
# Writing into a mount with a key: staged data and names never reach the
# disk in the clear, the packs are encrypted, a wrong key (or none) gets
# EACCES on remount and loses nothing, and the right key finds everything.
# Also with a passphrase. A checkpoint staged without a key takes no more
# writes from a mount with one until it is committed.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/write_lib.sh"
mkdir -p "$BACK"
"$CKPT" keygen -o "$TMP/key" >/dev/null
"$CKPT" keygen -o "$TMP/other" >/dev/null
printf 'correct horse battery staple\n' >"$TMP/pass"
chmod 600 "$TMP/pass"
MARK=PLAINTEXT-MARKER-7f3a9c
# A file whose every 4 KiB holds the marker: any plaintext block would show.
$PY - "$TMP/marked.bin" "$MARK" <<'EOF'
import sys
block = (sys.argv[2] * 200).encode()[:4096]
with open(sys.argv[1], "wb") as f:
    for _ in range(3000):
        f.write(block)
EOF

mount_ckptfs "$BACK" "$MNT" "$LOG" -o key_file="$TMP/key",commit_delay=0 || { fail "mount with a key" "$(cat "$LOG")"; finish; }
mkdir "$MNT/enc" "$MNT/enc2"
expect_ok "write a marked file" cp "$TMP/marked.bin" "$MNT/enc/secret-name-$MARK.bin"
expect_ok "and python writers" $PY "$WCLIENTS" save "$MNT/enc/py" mixed 3
expect_ok "small writes and random ops too" $PY "$WCLIENTS" random-ops "$TMP/plainr" "$MNT/enc/r" 11 150
sync "$MNT/enc/secret-name-$MARK.bin"
expect_ok "read back before commit" cmp "$TMP/marked.bin" "$MNT/enc/secret-name-$MARK.bin"
if grep -rqa "$MARK" "$BACK"; then fail "no plaintext data or names in the staging area" "$(grep -rla "$MARK" "$BACK" | head -3)"
else pass "no plaintext data or names in the staging area"; fi
if grep -rqa "layers.0.attn.weight" "$BACK"; then fail "no tensor names in the staging area"
else pass "no tensor names in the staging area"; fi

cp "$TMP/marked.bin" "$MNT/enc2/m.bin"
expect_ok "commit one" "$CKPT" commit --wait "$MNT/enc2"
if grep -rqa "$MARK" "$BACK"; then fail "the pack holds no plaintext either"; else pass "the pack holds no plaintext either"; fi
expect_ok "the pack is encrypted" "$CKPT" info "$BACK/enc2.tpack"
last_stdout_has "with the default cipher" "$(default_cipher)"
expect_fail "and cannot be read without the key" "$CKPT" ls "$BACK/enc2.tpack"
expect_ok "but can with it" "$CKPT" verify "$BACK/enc2.tpack" --key-file "$TMP/key"
unmount_ckptfs "$MNT"

# ------------------------------------------------------------ wrong keys

mount_ckptfs "$BACK" "$MNT" "$LOG" -o key_file="$TMP/other",commit_delay=0 || { fail "mount with another key"; finish; }
[ "$(ls "$MNT" | tr '\n' ' ')" = "enc enc2 " ] && pass "wrong key: both checkpoints listed" || fail "wrong key: both checkpoints listed" "$(ls "$MNT")"
[ "$(state_of "$MNT/enc")" = writing ] && pass "wrong key: state still readable" || fail "wrong key: state still readable" "$(state_of "$MNT/enc")"
expect_fail "wrong key: listing the written checkpoint fails" ls "$MNT/enc"
last_stderr_has "with EACCES" "Permission denied"
expect_fail "wrong key: reading the committed one fails" cat "$MNT/enc2/m.bin"
last_stderr_has "with EACCES" "Permission denied"
expect_fail "wrong key: ckpt commit fails" "$CKPT" commit --wait "$MNT/enc"
last_stderr_has "and says why" "key"
expect_fail "wrong key: writing into it fails" touch "$MNT/enc/new"
if grep -q "wrong key" "$LOG"; then pass "wrong key: a log line says so"; else fail "wrong key: a log line says so"; fi
unmount_ckptfs "$MNT"

mount_ckptfs "$BACK" "$MNT" "$LOG" -o commit_delay=0 || { fail "mount without a key"; finish; }
expect_fail "no key: listing the written checkpoint fails" ls "$MNT/enc"
last_stderr_has "with EACCES" "Permission denied"
expect_fail "no key: rm -r cannot delete it" rm -r "$MNT/enc"
unmount_ckptfs "$MNT"

mount_ckptfs "$BACK" "$MNT" "$LOG" -o key_file="$TMP/key",commit_delay=0 || { fail "mount with the key again"; finish; }
expect_ok "right key again: nothing lost" cmp "$TMP/marked.bin" "$MNT/enc/secret-name-$MARK.bin"
expect_ok "python checkpoint intact" $PY "$WCLIENTS" verify "$MNT/enc/py" mixed 3
expect_ok "random-ops tree intact" $PY "$WCLIENTS" same-tree "$TMP/plainr" "$MNT/enc/r"
expect_ok "it commits" "$CKPT" commit --wait "$MNT/enc"
expect_ok "and reads back from the pack" $PY "$WCLIENTS" verify "$MNT/enc/py" mixed 3
expect_ok "the committed one reads" cmp "$TMP/marked.bin" "$MNT/enc2/m.bin"
unmount_ckptfs "$MNT"

# ------------------------------------------------------------ passphrase

BACKP=$TMP/backp
mkdir -p "$BACKP"
mount_ckptfs "$BACKP" "$MNT" "$LOG" -o passphrase_file="$TMP/pass",commit_delay=0 || { fail "mount with a passphrase"; finish; }
mkdir "$MNT/pp"
cp "$TMP/marked.bin" "$MNT/pp/m.bin"
unmount_ckptfs "$MNT"
if grep -rqa "$MARK" "$BACKP"; then fail "passphrase: no plaintext staged"; else pass "passphrase: no plaintext staged"; fi
mount_ckptfs "$BACKP" "$MNT" "$LOG" -o passphrase_file="$TMP/pass",commit_delay=0 || { fail "remount with a passphrase"; finish; }
expect_ok "passphrase: staged data back after a remount" cmp "$TMP/marked.bin" "$MNT/pp/m.bin"
expect_ok "passphrase: commits" "$CKPT" commit --wait "$MNT/pp"
expect_ok "passphrase: the pack verifies with it" "$CKPT" verify "$BACKP/pp.tpack" --passphrase-file "$TMP/pass"
unmount_ckptfs "$MNT"

# ------------------------------------- staged without a key, then with one

# A checkpoint staged by a mount without a key and found by one with a key:
# what it holds reads and commits (the pack is sealed), but nothing written
# now is staged in the clear beside it; once committed, writing reopens it
# sealed.
BACKU=$TMP/backu
mkdir -p "$BACKU"
mount_ckptfs "$BACKU" "$MNT" "$LOG" -o commit_delay=0 || { fail "mount without a key"; finish; }
mkdir "$MNT/plain"
echo public >"$MNT/plain/a"
unmount_ckptfs "$MNT"
mount_ckptfs "$BACKU" "$MNT" "$LOG" -o key_file="$TMP/key",commit_delay=0 || { fail "remount it with a key"; finish; }
expect_ok "unsealed staging: what it holds reads" grep -q public "$MNT/plain/a"
expect_fail "unsealed staging: a new file is refused" cp "$TMP/marked.bin" "$MNT/plain/new-$MARK"
last_stderr_has "with EACCES" "Permission denied"
expect_fail "unsealed staging: so is a write to a staged file" sh -c "echo $MARK >>'$MNT/plain/a'"
sync
if grep -rqa "$MARK" "$BACKU"; then fail "unsealed staging: nothing staged in the clear" "$(grep -rla "$MARK" "$BACKU" | head -3)"
else pass "unsealed staging: nothing staged in the clear"; fi
if grep -q "staged without a key" "$LOG"; then pass "unsealed staging: the log says why"; else fail "unsealed staging: the log says why"; fi
expect_ok "unsealed staging: it commits" "$CKPT" commit --wait "$MNT/plain"
expect_ok "into an encrypted pack" "$CKPT" info "$BACKU/plain.tpack"
last_stdout_has "with the default cipher" "$(default_cipher)"
expect_ok "then writing reopens it" cp "$TMP/marked.bin" "$MNT/plain/new-$MARK"
sync
if grep -rqa "$MARK" "$BACKU"; then fail "sealed this time" "$(grep -rla "$MARK" "$BACKU" | head -3)"
else pass "sealed this time"; fi
unmount_ckptfs "$MNT"

# ------------------------------------------ keys stay locked in the background

# Going to the background forks, and a child of fork holds no memory locks:
# the staging keys that recovery derived before it must be locked again, so
# the daemon locks as much as one that stayed in the foreground.
lim=$(ulimit -l)
if [ "$lim" != unlimited ] && [ "$lim" -lt 1024 ]; then
    skip "keys locked in the background" "ulimit -l is $lim KiB"
else
    BACKL=$TMP/backl
    mkdir -p "$BACKL"
    vmlck() { awk '/^VmLck:/ { print $2 }' "/proc/$1/status"; }
    mount_ckptfs "$BACKL" "$MNT" "$LOG" -o key_file="$TMP/key",commit_delay=0 || { fail "mount for the lock check"; finish; }
    mkdir "$MNT/s1" "$MNT/s2"
    echo a >"$MNT/s1/a"
    echo b >"$MNT/s2/b"
    unmount_ckptfs "$MNT"
    mount_ckptfs "$BACKL" "$MNT" "$LOG" -o key_file="$TMP/key",commit_delay=0 || { fail "remount in the foreground"; finish; }
    fg=$(vmlck "${DAEMON_OF[$MNT]}")
    unmount_ckptfs "$MNT"
    "$CKPTFS" -o key_file="$TMP/key",commit_delay=0 "$BACKL" "$MNT" 2>>"$LOG" || fail "mount in the background"
    bgpid=$(awk '{ print $2 }' "$BACKL/.ckptfs/lock")
    bg=$(vmlck "$bgpid")
    fusermount3 -u "$MNT"
    for _ in $(seq 100); do kill -0 "$bgpid" 2>/dev/null || break; sleep 0.05; done
    [ -n "$fg" ] && [ -n "$bg" ] && [ "$bg" -ge "$fg" ] && pass "keys locked in the background as in the foreground" ||
        fail "keys locked in the background as in the foreground" "VmLck $bg kB in the background, $fg kB in the foreground"
fi
finish
