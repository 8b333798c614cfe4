#!/usr/bin/env bash
# Everyday use of a mount, as a new user meets it (issue 17): errors that
# show (a wrong key, damaged packs, also below a namespace, the log when
# there is no syslog), non-UTF-8 names in manifest.json and `ckpt ls
# --json`, `ckpt` commands given MOUNT/NAME, `ckpt status --watch` at 80
# columns, du of a mounted checkpoint and -o tensors=hide.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/mount_lib.sh"
. "$(dirname "$0")/write_lib.sh"

cd "$TMP" || exit 1
SRC=$TMP/src
BACK=$TMP/back
MNT=$TMP/mnt
LOG=$TMP/ckptfs.log
mkdir -p "$SRC" "$BACK"

# A checkpoint with tensors, a file whose name is not UTF-8 and one whose
# name is the text that name used to be shown as.
expect_ok "sources: a tiny checkpoint" "$CKPT_GEN" "$SRC" --preset tiny --dtype bf16 --format both
$PY - "$SRC" <<'EOF'
import os, sys
src = os.fsencode(sys.argv[1])
open(os.path.join(src, b"\xff\xfe.bin"), "wb").write(b"raw bytes name")
open(os.path.join(src, b"\\xFF\\xFE.bin"), "wb").write(b"literal backslash name")
EOF
head -c $((8 << 20)) /dev/urandom >"$SRC/noise.bin"
"$CKPT" keygen -o "$TMP/k1" >/dev/null
"$CKPT" keygen -o "$TMP/k2" >/dev/null
expect_ok "pack plain" "$CKPT" pack "$SRC" -o "$BACK/plain.tpack"
expect_ok "pack enc (key 1)" "$CKPT" pack "$SRC" -o "$BACK/enc.tpack" --key-file "$TMP/k1"
# Unreadable packs: empty, not a pack, a damaged header, a damaged index.
: >"$BACK/empty.tpack"
head -c 5000 /dev/urandom >"$BACK/garbage.tpack"
cp "$BACK/plain.tpack" "$BACK/badhead.tpack"
printf '\x00\x00\x00\x00' | dd of="$BACK/badhead.tpack" bs=1 seek=8 conv=notrunc status=none
cp "$BACK/plain.tpack" "$BACK/badindex.tpack"
size=$(stat -c %s "$BACK/badindex.tpack")
printf 'XXXXXXXXXXXXXXXX' | dd of="$BACK/badindex.tpack" bs=1 seek=$((size - 200)) conv=notrunc status=none
# Namespaces: one holding the key-1 pack beside a good one, one holding a
# damaged pack, one holding only good packs.
mkdir -p "$BACK/ns_key/deeper" "$BACK/ns_dmg" "$BACK/ns_ok"
cp "$BACK/enc.tpack" "$BACK/ns_key/deeper/a.tpack"
cp "$BACK/plain.tpack" "$BACK/ns_key/b.tpack"
cp "$BACK/garbage.tpack" "$BACK/ns_dmg/a.tpack"
cp "$BACK/plain.tpack" "$BACK/ns_ok/a.tpack"

# The mount has key 2: enc.tpack was made with key 1.
if ! mount_ckptfs "$BACK" "$MNT" "$LOG" -o key_file="$TMP/k2"; then
    fail "mount" "$(tail -5 "$LOG")"
    finish
fi

# ------------------------------------------------------------ wrong key

[ "$(state_of "$MNT/enc")" = "key mismatch" ] && pass "wrong key: user.ckptfs.state is 'key mismatch'" ||
    fail "wrong key: user.ckptfs.state is 'key mismatch'" "$(state_of "$MNT/enc")"
err=$(getfattr --only-values -n user.ckptfs.error "$MNT/enc" 2>&1)
case $err in *"enc.tpack"*"wrong key"*) pass "user.ckptfs.error names the pack and says why" ;;
*) fail "user.ckptfs.error names the pack and says why" "'$err'" ;; esac
expect_fail "reading a file of it fails" cat "$MNT/enc/noise.bin"
last_stderr_has "with EACCES" "Permission denied"
if grep -q "enc.tpack: wrong key" "$LOG"; then pass "a log line names the pack"; else fail "a log line names the pack" "$(tail -3 "$LOG")"; fi
expect_exit "ckpt status: exit status 3" 3 "$CKPT" status "$MNT"
last_stdout_matches "shows key mismatch with the reason" '^enc +key mismatch .*wrong key'
last_stdout_matches "and the good pack committed" '^plain +committed'

# ------------------------------------------------------------ damaged

for p in empty garbage badhead badindex; do
    s=$(state_of "$MNT/$p")
    [ "$s" = damaged ] && pass "$p.tpack: state damaged" || fail "$p.tpack: state damaged" "'$s'"
    e=$(getfattr --only-values -n user.ckptfs.error "$MNT/$p" 2>/dev/null)
    [ -n "$e" ] && pass "$p.tpack: with a reason ($e)" || fail "$p.tpack: with a reason"
done
expect_exit "ckpt status: exit status 3" 3 "$CKPT" status "$MNT"
last_stdout_matches "empty: damaged, with the reason" '^empty +damaged .*truncated'
last_stdout_matches "garbage: damaged, with the reason" '^garbage +damaged .*not a tpack'
if grep -E '^(empty|garbage|badhead|badindex) ' "$LAST_OUT" | grep -q committed; then
    fail "no unreadable pack shows as committed" "$(cat "$LAST_OUT")"
else
    pass "no unreadable pack shows as committed"
fi

# A namespace sums up the checkpoints below it: one that does not open
# shows, with its reason, rather than committed.
[ "$(state_of "$MNT/ns_key")" = "key mismatch" ] && pass "a namespace over a wrong-key pack: key mismatch" ||
    fail "a namespace over a wrong-key pack: key mismatch" "$(state_of "$MNT/ns_key")"
err=$(getfattr --only-values -n user.ckptfs.error "$MNT/ns_key" 2>&1)
case $err in *"ns_key/deeper/a.tpack"*"wrong key"*) pass "  its error names that pack" ;;
*) fail "  its error names that pack" "'$err'" ;; esac
[ "$(state_of "$MNT/ns_dmg")" = damaged ] && pass "a namespace over a damaged pack: damaged" ||
    fail "a namespace over a damaged pack: damaged" "$(state_of "$MNT/ns_dmg")"
[ "$(state_of "$MNT/ns_ok")" = committed ] && pass "a namespace of good packs: committed" ||
    fail "a namespace of good packs: committed" "$(state_of "$MNT/ns_ok")"
expect_exit "ckpt status: exit status 3" 3 "$CKPT" status "$MNT"
last_stdout_matches "  shows the namespace's key mismatch" '^ns_key +key mismatch .*wrong key'
last_stdout_matches "  and the damaged one" '^ns_dmg +damaged'
expect_ok "ckpt status of the good namespace alone: exit status 0" "$CKPT" status "$MNT/ns_ok"

# ------------------------------------------------------- non-UTF-8 names

check_names() { # FILE (a manifest or ckpt ls --json output) KEY_OF_FILES
    $PY - "$1" <<'EOF'
import base64, json, sys
doc = json.load(open(sys.argv[1]))
files = {}
for f in doc["files"]:
    raw = base64.b64decode(f["path_b64"]) if "path_b64" in f else f["path"].encode()
    assert raw not in files, ("two entries for", raw)
    files[raw] = f
raw, lit = files[b"\xff\xfe.bin"], files[b"\\xFF\\xFE.bin"]
assert "path_b64" in raw and "path_b64" not in lit, (raw, lit)
assert raw["path"] == "\\xFF\\xFE.bin", raw["path"]        # the display form
assert lit["path"] == "\\xFF\\xFE.bin", lit["path"]        # the name itself
print("ok", len(files), "files")
EOF
}
expect_ok "manifest.json: raw bytes in path_b64, told apart from a literal name" check_names "$MNT/plain/manifest.json"
expect_ok "ckpt ls --json of the pack: the same" bash -c "'$CKPT' ls --json '$BACK/plain.tpack' >'$TMP/ls.json'"
expect_ok "  fields as in the manifest" check_names "$TMP/ls.json"
expect_ok "the name from path_b64 opens the file in the mount" $PY -c "
import base64, json, os
m = json.load(open('$MNT/plain/manifest.json'))
f = next(f for f in m['files'] if 'path_b64' in f)
data = open(os.path.join(b'$MNT/plain', base64.b64decode(f['path_b64'])), 'rb').read()
assert data == b'raw bytes name', data"

# ---------------------------------------------------------- mount paths

expect_ok "ckpt ls MOUNT/NAME" "$CKPT" ls "$MNT/plain"
last_stdout_has "lists the packed files" "noise.bin" "model.safetensors"
expect_ok "ckpt ls --tensors MOUNT/NAME" "$CKPT" ls --tensors "$MNT/plain"
expect_ok "ckpt ls --json MOUNT/NAME" "$CKPT" ls --json "$MNT/plain"
expect_ok "ckpt info MOUNT/NAME" "$CKPT" info "$MNT/plain"
expect_ok "ckpt verify MOUNT/NAME" "$CKPT" verify "$MNT/plain"
last_stdout_has "verifies it" "OK:"
expect_ok "ckpt cat MOUNT/NAME PATH" bash -c "'$CKPT' cat '$MNT/plain' noise.bin >'$TMP/noise.out'"
expect_same_sha256 "  the file's bytes" "$SRC/noise.bin" "$TMP/noise.out"
expect_ok "ckpt status MOUNT/NAME" "$CKPT" status "$MNT/plain"
last_stdout_matches "  shows just it" '^plain +committed'
expect_fail "ckpt ls MOUNT/NAME of an encrypted pack without its key" "$CKPT" ls "$MNT/enc"
last_stderr_has "  names the pack and asks for the key" "enc.tpack" "key"
expect_ok "  and with it" "$CKPT" ls "$MNT/enc" --key-file "$TMP/k1"
mkdir "$MNT/fresh"
cp "$SRC/noise.bin" "$MNT/fresh/"
expect_fail "ckpt ls of a checkpoint still being written" "$CKPT" ls "$MNT/fresh"
last_stderr_has "  says it is being written" "writing" "ckpt commit"
# The kernel answers EBUSY when the checkpoint was written to while the
# commit waited; that race cannot be timed, so a shim makes setxattr say it.
cat >"$TMP/ebusy.c" <<'EOF'
#define _GNU_SOURCE
#include <errno.h>
#include <stddef.h>
int setxattr(const char *path, const char *name, const void *value, size_t size, int flags)
{
    (void)path, (void)name, (void)value, (void)size, (void)flags;
    errno = EBUSY;
    return -1;
}
EOF
if ${CC:-cc} -shared -fPIC -o "$TMP/ebusy.so" "$TMP/ebusy.c" 2>"$TMP/ebusy.err"; then
    expect_fail "ckpt commit refused with EBUSY" env LD_PRELOAD="$TMP/ebusy.so" "$CKPT" commit "$MNT/fresh"
    last_stderr_has "  says it is writing again and commits on its own" "fresh" "written to while committing" "commits on its own once quiet"
else
    fail "cc builds the EBUSY shim" "$(cat "$TMP/ebusy.err")"
fi
expect_ok "committed" "$CKPT" commit --wait "$MNT/fresh"
expect_ok "ckpt verify MOUNT/NAME once committed (the mount's key)" "$CKPT" verify "$MNT/fresh" --key-file "$TMP/k2"
expect_fail "ckpt ls of the mount itself" "$CKPT" ls "$MNT"
last_stderr_has "  says what it wants" "not a pack nor a checkpoint"

# ----------------------------------------------------------------- du

pack=$(stat -c %s "$BACK/plain.tpack")
du_mnt=$(du -s -B1 "$MNT/plain" | cut -f1)
if [ "$du_mnt" -ge $((pack * 95 / 100)) ] && [ "$du_mnt" -le $((pack * 105 / 100)) ]; then
    pass "du of a committed checkpoint ($du_mnt) is within 5% of its pack ($pack)"
else
    fail "du of a committed checkpoint is within 5% of its pack" "du $du_mnt, pack $pack"
fi
blocks=$(find "$MNT/plain/tensors" -type f -printf '%b\n' | sort -u)
[ "$blocks" = 0 ] && pass "tensor files take 0 blocks" || fail "tensor files take 0 blocks" "$blocks"
mkdir "$MNT/staged"
head -c $((16 << 20)) /dev/urandom >"$MNT/staged/a.bin"
du_w=$(du -s -B1 "$MNT/staged" | cut -f1)
du_stage=$(du -s -B1 "$BACK/.ckptfs/stage" | cut -f1)
if [ "$du_w" -ge $((du_stage * 95 / 100)) ] && [ "$du_w" -le $((du_stage * 105 / 100)) ]; then
    pass "du of a checkpoint being written ($du_w) is within 5% of its staging ($du_stage)"
else
    fail "du of a checkpoint being written is within 5% of its staging" "du $du_w, staging $du_stage"
fi

# ------------------------------------------------------------- --watch

long=checkpoint-with-a-name-far-too-long-for-an-eighty-column-terminal-window
mkdir "$MNT/$long"
echo x >"$MNT/$long/x"
widest() { sed -e 's/\x1b\[[0-9;?]*[A-Za-z]//g' -e 's/\r//g' "$1" | awk '{ if (length > m) m = length } END { print m + 0 }'; }
script -q -c "stty cols 80 rows 40; COLUMNS=80 timeout 3 '$CKPT' status --watch --interval 0.5 '$MNT'; echo \"rc=\$?\"" /dev/null >"$TMP/watch.tty" 2>&1
if grep -q 'rc=124' "$TMP/watch.tty"; then pass "--watch on a terminal stays open until killed"; else fail "--watch on a terminal stays open until killed" "$(tail -3 "$TMP/watch.tty")"; fi
grep -q $'\x1b\[[0-9]*A' "$TMP/watch.tty" && pass "  and redraws in place" || fail "  and redraws in place"
w=$(widest "$TMP/watch.tty")
[ "$w" -le 80 ] && pass "  no line over 80 columns ($w)" || fail "  no line over 80 columns" "widest $w"
grep -qE 'checkpoint-with-a-nam[a-z-]*\.\.\. ' "$TMP/watch.tty" && pass "  a long name is cut with ..." || fail "  a long name is cut with ..."
grep -q 'key mismatch' "$TMP/watch.tty" && pass "  shows key mismatch" || fail "  shows key mismatch"
COLUMNS=80 timeout 2 "$CKPT" status --watch --interval 0.5 "$MNT" >"$TMP/watch.txt" 2>&1
rc=$?
[ $rc -eq 124 ] && pass "--watch into a file stays open until killed" || fail "--watch into a file stays open until killed" "exit $rc"
grep -q $'\x1b' "$TMP/watch.txt" && fail "  plain lines, no escapes" || pass "  plain lines, no escapes"
w=$(widest "$TMP/watch.txt")
[ "$w" -le 80 ] && pass "  no line over 80 columns ($w)" || fail "  no line over 80 columns" "widest $w"
n=$(grep -c '^plain ' "$TMP/watch.txt")
[ "$n" -eq 1 ] && pass "  an unchanged line is written once" || fail "  an unchanged line is written once" "$n times"
expect_fail "--watch of a path that is not a mount fails at once" timeout 5 "$CKPT" status --watch "$TMP"
[ "$LAST_RC" -ne 124 ] && pass "  without waiting" || fail "  without waiting"

unmount_ckptfs "$MNT" || fail "unmount" "$(tail -3 "$LOG")"

# ------------------------------------------------------- tensors=hide

if mount_ckptfs "$BACK" "$MNT" "$LOG" -o tensors=hide,ro; then
    if ls "$MNT/plain" | grep -qx tensors; then fail "tensors=hide: not listed" "$(ls "$MNT/plain")"; else pass "tensors=hide: not listed"; fi
    n=$(find "$MNT/plain" -path '*/tensors/*' | wc -l)
    [ "$n" -eq 0 ] && pass "  find skips it" || fail "  find skips it" "$n entries"
    t=$($PY -c "import json; print(json.load(open('$MNT/plain/manifest.json'))['tensors'][0]['path'])")
    expect_ok "  still reachable by path ($t)" test -f "$MNT/plain/$t"
    expect_ok "  and readable" cat "$MNT/plain/$t"
    expect_ok "  ls of tensors/ itself works" ls "$MNT/plain/tensors"
    unmount_ckptfs "$MNT" || fail "unmount" "$(tail -3 "$LOG")"
else
    fail "mount with tensors=hide" "$(tail -3 "$LOG")"
fi
expect_exit "tensors=bogus is a usage error" 2 "$CKPTFS" -f -o tensors=bogus "$BACK" "$MNT"

# ---------------------------------------------- the log without syslog

# In the background with no /dev/log the daemon logs to BACKING/.ckptfs/log,
# rotated. /dev is shared: another test (test_ops) binds a syslog listener
# at /dev/log for a few seconds, and a daemon that met it there logged to
# it, not to the file. So the daemon alone gets a /dev of its own, in a
# private mount namespace: the nodes it needs and no /dev/log, whatever
# the system has or gets meanwhile.
LBACK=$TMP/lback
mkdir -p "$LBACK" "$TMP/dev"
for i in $(seq 60); do head -c 100 /dev/urandom >"$LBACK/bad-checkpoint-number-$i.tpack"; done
cat >"$TMP/logrun.sh" <<EOF
set -e
if [ -n "\${PRIVATE_DEV:-}" ]; then
    mount -t tmpfs -o mode=755 tmpfs "$TMP/dev"
    cp -a /dev/fuse /dev/null /dev/zero /dev/random /dev/urandom "$TMP/dev/"
    ln -s /proc/self/fd "$TMP/dev/fd"
    mount --bind "$TMP/dev" /dev
fi
mkdir -p "$MNT"
"$CKPTFS" -o log_max=4K "$LBACK" "$MNT"
rc=0; "$CKPT" status "$MNT" >"$TMP/lstatus.out" || rc=\$?; echo \$rc >"$TMP/lstatus.rc"
fusermount3 -u "$MNT"
EOF
if command -v unshare >/dev/null && unshare -m true 2>/dev/null; then
    run_cmd unshare -m --propagation private env PRIVATE_DEV=1 bash "$TMP/logrun.sh"
elif [ -e /dev/log ]; then
    LAST_RC=77
else
    run_cmd bash "$TMP/logrun.sh"
fi
if [ "$LAST_RC" = 77 ]; then
    skip "log without /dev/log" "/dev/log exists and no mount namespace can hide it"
else
    [ "$LAST_RC" -eq 0 ] && pass "a background daemon without /dev/log ran" || fail "a background daemon without /dev/log ran" "$(cat "$LAST_ERR")"
    sleep 0.5
    [ -f "$LBACK/.ckptfs/log" ] && pass "it logs to BACKING/.ckptfs/log" || fail "it logs to BACKING/.ckptfs/log" "$(ls -la "$LBACK/.ckptfs" 2>&1)"
    [ "$(stat -c %a "$LBACK/.ckptfs/log" 2>/dev/null)" = 600 ] && pass "  mode 0600" || fail "  mode 0600"
    if cat "$LBACK/.ckptfs/log"* 2>/dev/null | grep -qE "bad-checkpoint-number-[0-9]+.tpack: "; then
        pass "  the lines name the packs"
    else
        fail "  the lines name the packs" "$(tail -3 "$LBACK/.ckptfs/log" 2>&1)"
    fi
    [ -f "$LBACK/.ckptfs/log.1" ] && [ -f "$LBACK/.ckptfs/log.2" ] && pass "  rotated (log.1, log.2)" ||
        fail "  rotated (log.1, log.2)" "$(ls "$LBACK/.ckptfs")"
    [ ! -e "$LBACK/.ckptfs/log.3" ] && pass "  keeping three files" || fail "  keeping three files"
    total=$(cat "$LBACK/.ckptfs/log"* | wc -c)
    [ "$total" -le $((3 * (4096 + 2400))) ] && pass "  bounded ($total bytes for log_max=4K)" ||
        fail "  bounded" "$total bytes"
    grep -q '^bad-checkpoint-number-1 *damaged' "$TMP/lstatus.out" && pass "  ckpt status shows them damaged" ||
        fail "  ckpt status shows them damaged" "$(head -3 "$TMP/lstatus.out")"
    [ "$(cat "$TMP/lstatus.rc")" = 3 ] && pass "  with exit status 3" ||
        fail "  with exit status 3" "exit $(cat "$TMP/lstatus.rc")"

    # A BACKING/.ckptfs that is a link (made by whoever can write the
    # backing directory) does not take the log: it is lost, with a warning.
    rm -rf "$LBACK/.ckptfs" "$TMP/elsewhere"
    mkdir -p "$TMP/elsewhere"
    ln -s "$TMP/elsewhere" "$LBACK/.ckptfs"
    sed -i 's/-o log_max=4K/-o ro,log_max=4K/' "$TMP/logrun.sh"
    if [ -e /dev/log ]; then
        run_cmd unshare -m --propagation private bash "$TMP/logrun.sh"
    else
        run_cmd bash "$TMP/logrun.sh"
    fi
    [ ! -e "$TMP/elsewhere/log" ] && pass "a .ckptfs link does not take the log" ||
        fail "a .ckptfs link does not take the log" "$(ls -la "$TMP/elsewhere")"
    last_stderr_has "  the log is lost, with a warning" "cannot log to"
    rm -f "$LBACK/.ckptfs"

    # A backing directory that is not there is said once, by name, without
    # a warning before it about a log that could not be made in it.
    cat >"$TMP/logmissing.sh" <<EOF
if [ -e /dev/log ]; then : >"$TMP/not-a-socket"; mount --bind "$TMP/not-a-socket" /dev/log; fi
exec "$CKPTFS" "$TMP/no-such-backing" "$MNT"
EOF
    if [ -e /dev/log ]; then
        run_cmd unshare -m --propagation private bash "$TMP/logmissing.sh"
    else
        run_cmd bash "$TMP/logmissing.sh"
    fi
    [ "$LAST_RC" = 1 ] && pass "a missing backing directory fails (exit 1)" ||
        fail "a missing backing directory fails (exit 1)" "exit $LAST_RC"
    last_stderr_has "  naming it" "cannot use backing directory '$TMP/no-such-backing'"
    if grep -q "cannot log to" "$LAST_ERR"; then
        fail "  with no warning about the log" "$(cat "$LAST_ERR")"
    else
        pass "  with no warning about the log"
    fi
fi

finish
