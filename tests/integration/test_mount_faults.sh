#!/usr/bin/env bash
# ckptfs under faults: a damaged chunk fails exactly the reads that touch it
# (EIO, one log line naming checkpoint, file and offset) while everything
# else stays readable; missing or wrong keys give EACCES with the reason in
# the log; garbage, truncated and empty packs give EIO without hurting the
# daemon; packs added, replaced and removed while mounted come and go.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/mount_lib.sh"

# read_errno PATH OFFSET LENGTH: the errno of one pread (0 when it worked).
read_errno() { $PY "$CLIENTS" read-errno "$@"; }

# Flips the low bit of the byte at OFFSET of FILE in place.
flip_bit() {
    $PY - "$1" "$2" <<'EOF'
import sys
with open(sys.argv[1], 'r+b') as f:
    f.seek(int(sys.argv[2]))
    b = f.read(1)
    f.seek(int(sys.argv[2]))
    f.write(bytes([b[0] ^ 1]))
EOF
}

# ------------------------------------------------------------------ inputs

cd "$TMP" || exit 1
SRC=$TMP/src
BACK=$TMP/back
MNT=$TMP/mnt
mkdir -p "$SRC" "$BACK"
# a.bin fills most of each pack, so the pack's middle byte lies inside one
# of its chunks; its chunks start at multiples of 64K, page aligned, so a
# fault in one chunk cannot spill into reads of its neighbours.
head -c $((1 << 20)) /dev/urandom >"$SRC/a.bin"
head -c 100000 /dev/urandom >"$SRC/b.bin"
echo "small and healthy" >"$SRC/c.txt"
"$CKPT" keygen -o "$TMP/key" >/dev/null
"$CKPT" keygen -o "$TMP/key2" >/dev/null

MODES=(plain comp enc both)
"$CKPT" pack "$SRC" -o "$BACK/plain.tpack" --no-compress --chunk-size 64K >/dev/null
"$CKPT" pack "$SRC" -o "$BACK/comp.tpack" --chunk-size 64K >/dev/null
"$CKPT" pack "$SRC" -o "$BACK/enc.tpack" --no-compress --chunk-size 64K --key-file "$TMP/key" >/dev/null
"$CKPT" pack "$SRC" -o "$BACK/both.tpack" --chunk-size 64K --key-file "$TMP/key" >/dev/null
for m in "${MODES[@]}"; do
    cp "$BACK/$m.tpack" "$BACK/bad-$m.tpack"
    size=$(stat -c %s "$BACK/bad-$m.tpack")
    flip_bit "$BACK/bad-$m.tpack" $((size / 2))
done
# Not packs at all, or no longer whole ones.
head -c 5000 /dev/urandom >"$BACK/garbage.tpack"
: >"$BACK/empty.tpack"
head -c $(($(stat -c %s "$BACK/comp.tpack") / 2)) "$BACK/comp.tpack" >"$BACK/truncated.tpack"

# ------------------------------------------------------------ damaged chunks

if ! mount_ckptfs "$BACK" "$MNT" "$TMP/faults.log" -o key_file="$TMP/key"; then
    fail "ckptfs mounts" "$(cat "$TMP/faults.log")"
    finish
fi
pass "ckptfs mounts"

for m in "${MODES[@]}"; do
    ck=bad-$m
    expect_fail "$ck: reading the damaged file fails" cat "$MNT/$ck/a.bin"
    last_stderr_has "$ck: with EIO" "Input/output error"
    failing=()
    for k in $(seq 0 15); do
        e=$(read_errno "$MNT/$ck/a.bin" $((k * 65536)) 65536)
        [ "$e" = 0 ] || failing+=("$k:$e")
    done
    if [ ${#failing[@]} -eq 1 ] && [ "${failing[0]#*:}" = 5 ]; then
        pass "$ck: exactly one 64K chunk of a.bin fails, with EIO (chunk ${failing[0]%:*})"
    else
        fail "$ck: exactly one 64K chunk of a.bin fails, with EIO" "failing chunk:errno: ${failing[*]}"
    fi
    k=${failing[0]%:*}
    bad=()
    [ "$k" -eq 0 ] || [ "$(read_errno "$MNT/$ck/a.bin" $((k * 65536 - 1)) 1)" = 0 ] || bad+=("byte before")
    [ "$k" -eq 15 ] || [ "$(read_errno "$MNT/$ck/a.bin" $((k * 65536 + 65536)) 1)" = 0 ] || bad+=("byte after")
    [ "$(read_errno "$MNT/$ck/a.bin" $((k * 65536 + 65535)) 1)" = 5 ] || bad+=("last byte")
    dd if="$MNT/$ck/a.bin" of=/dev/null bs=4096 skip=$((k * 16 + 3)) count=1 2>"$TMP/dd.err"
    grep -q "Input/output error" "$TMP/dd.err" || bad+=("dd")
    if [ ${#bad[@]} -eq 0 ]; then pass "$ck: dd and preads inside the chunk fail, beside it work"
    else fail "$ck: dd and preads inside the chunk fail, beside it work" "${bad[*]}"; fi
    expect_same_sha256 "$ck: another file of the pack reads fine" "$SRC/b.bin" "$MNT/$ck/b.bin"
    expect_same_sha256 "$ck: a small file reads fine" "$SRC/c.txt" "$MNT/$ck/c.txt"
    lines=$(grep -c "'$ck'" "$TMP/faults.log")
    if [ "$lines" = 1 ] && grep "'$ck'" "$TMP/faults.log" | grep -q "a.bin" &&
        grep "'$ck'" "$TMP/faults.log" | grep -q "offset $((k * 65536))"; then
        pass "$ck: one log line names checkpoint, file and offset"
    else
        fail "$ck: one log line names checkpoint, file and offset" "$(grep "'$ck'" "$TMP/faults.log" | head -3)"
    fi
done
expect_same_sha256 "the healthy copy of the same pack reads fine" "$SRC/a.bin" "$MNT/both/a.bin"

# ------------------------------------------------------ broken pack files

for g in garbage empty truncated; do
    if ls "$MNT" | grep -qx "$g"; then pass "$g: still listed"; else fail "$g: still listed"; fi
    expect_fail "$g: listing it fails" ls "$MNT/$g"
    last_stderr_has "$g: with EIO" "Input/output error"
    e=$(read_errno "$MNT/$g/a.bin" 0 10)
    [ "$e" = 5 ] && pass "$g: opening a file inside gives EIO" || fail "$g: opening a file inside gives EIO" "errno $e"
    expect_ok "$g: stat of the directory itself works" stat "$MNT/$g"
done
if grep -q "'garbage'" "$TMP/faults.log" && grep -q "'truncated'" "$TMP/faults.log"; then
    pass "broken packs are logged by name"
else
    fail "broken packs are logged by name" "$(cat "$TMP/faults.log")"
fi
if kill -0 "${DAEMON_OF[$MNT]}" 2>/dev/null && cmp -s "$SRC/c.txt" "$MNT/comp/c.txt"; then
    pass "the daemon survives every fault and still serves"
else
    fail "the daemon survives every fault and still serves"
fi

# ------------------------------------------------- packs come and go

cp "$BACK/comp.tpack" "$BACK/new.tpack"
if ls "$MNT" | grep -qx new; then pass "a pack added while mounted appears"; else fail "a pack added while mounted appears"; fi
expect_same_sha256 "the added pack reads" "$SRC/a.bin" "$MNT/new/a.bin"
exec 7<"$MNT/new/b.bin"
rm "$BACK/new.tpack"
if ! ls "$MNT" | grep -qx new && [ ! -e "$MNT/new" ]; then pass "a removed pack disappears"
else fail "a removed pack disappears"; fi
if cmp -s "$SRC/b.bin" /dev/fd/7; then pass "a file opened before removal still reads"
else fail "a file opened before removal still reads"; fi
exec 7<&-

# Replaced under the same name: the new contents show, not cached old ones.
mkdir -p "$TMP/src2"
echo "second version" >"$TMP/src2/c.txt"
cat "$MNT/comp/c.txt" >/dev/null
"$CKPT" pack "$TMP/src2" -o "$BACK/comp.tpack.new" >/dev/null
mv "$BACK/comp.tpack.new" "$BACK/comp.tpack"
if [ "$(cat "$MNT/comp/c.txt")" = "second version" ] && [ ! -e "$MNT/comp/a.bin" ]; then
    pass "a pack replaced while mounted shows its new contents"
else
    fail "a pack replaced while mounted shows its new contents" "$(cat "$MNT/comp/c.txt")"
fi
"$CKPT" pack "$SRC" -o "$BACK/comp.tpack" --chunk-size 64K --force >/dev/null
expect_same_sha256 "and replaced back again" "$SRC/a.bin" "$MNT/comp/a.bin"
unmount_ckptfs "$MNT"
pass "unmounted"

# ---------------------------------------------------------------- keys

if mount_ckptfs "$BACK" "$MNT" "$TMP/nokey.log"; then
    if ls "$MNT" | grep -qx enc; then pass "no key: encrypted packs are listed"; else fail "no key: encrypted packs are listed"; fi
    expect_fail "no key: listing inside fails" ls "$MNT/enc"
    last_stderr_has "no key: with EACCES" "Permission denied"
    e=$(read_errno "$MNT/both/a.bin" 0 10)
    [ "$e" = 13 ] && pass "no key: opening a file gives EACCES" || fail "no key: opening a file gives EACCES" "errno $e"
    expect_same_sha256 "no key: unencrypted packs still read" "$SRC/a.bin" "$MNT/comp/a.bin"
    grep -q "'enc'.*no key" "$TMP/nokey.log" && pass "no key: the log says 'no key'" ||
        fail "no key: the log says 'no key'" "$(cat "$TMP/nokey.log")"
    unmount_ckptfs "$MNT"
else
    fail "mount without a key" "$(cat "$TMP/nokey.log")"
fi

if mount_ckptfs "$BACK" "$MNT" "$TMP/wrongkey.log" -o key_file="$TMP/key2"; then
    expect_fail "wrong key: listing inside fails" ls "$MNT/both"
    last_stderr_has "wrong key: with EACCES" "Permission denied"
    e=$(read_errno "$MNT/enc/c.txt" 0 10)
    [ "$e" = 13 ] && pass "wrong key: opening a file gives EACCES" || fail "wrong key: opening a file gives EACCES" "errno $e"
    expect_ok "wrong key: the directory itself can be stat'ed" stat "$MNT/both"
    grep -q "'both'.*wrong key" "$TMP/wrongkey.log" && pass "wrong key: the log says 'wrong key'" ||
        fail "wrong key: the log says 'wrong key'" "$(cat "$TMP/wrongkey.log")"
    n=$(grep -c "'both'" "$TMP/wrongkey.log")
    [ "$n" = 1 ] && pass "wrong key: logged once however often it is tried" ||
        fail "wrong key: logged once however often it is tried" "$n lines"
    if grep -qi "$(od -An -tx1 "$TMP/key2" | tr -d ' \n' | head -c 16)" "$TMP/wrongkey.log"; then
        fail "the key never reaches the log"
    else
        pass "the key never reaches the log"
    fi
    unmount_ckptfs "$MNT"
else
    fail "mount with a wrong key" "$(cat "$TMP/wrongkey.log")"
fi

# ------------------------------------------ a damaged pack written to again

# Its commit decodes the damaged chunk and fails; what it says must name
# the pack, whatever descriptor the daemon opened it through.
LATE=$TMP/late
mkdir -p "$LATE"
cp "$BACK/bad-both.tpack" "$LATE/late.tpack"
if mount_ckptfs "$LATE" "$MNT" "$TMP/late.log" -o key_file="$TMP/key",commit_delay=0; then
    echo new >"$MNT/late/new.txt"
    expect_fail "late write into a damaged pack: its commit fails" "$CKPT" commit --wait "$MNT/late"
    last_stderr_has "and names the pack and the chunk" "$LATE/late.tpack: chunk " "authentication failed"
    if grep -q "/proc/self/fd" "$LAST_ERR" "$TMP/late.log"; then
        fail "and never a descriptor's path" "$(grep -h /proc/self/fd "$LAST_ERR" "$TMP/late.log" | head -2)"
    else
        pass "and never a descriptor's path"
    fi
    expect_same_sha256 "the file written stays readable" <(echo new) "$MNT/late/new.txt"
    unmount_ckptfs "$MNT"
else
    fail "writable mount of a damaged pack" "$(cat "$TMP/late.log")"
fi

# ----------------------------------- writing into a pack whose index is damaged

# A writer is answered as a reader is, EIO, whether the mount meets the
# damage at the write or had opened the pack before it was damaged in
# place (same size and mtime: only the write side's own open sees it).
WCLIENTS=$ROOT/tests/integration/write_clients.py
errno_is() {
    local got
    got=$($PY "$WCLIENTS" errno-of "${@:3}" 2>&1)
    [ "$got" = "$2" ] && pass "$1" || fail "$1" "got $got, want $2"
}
damage_index() {
    touch -r "$1" "$TMP/when"
    flip_bit "$1" $(($(stat -c %s "$1") - 200))
    touch -r "$TMP/when" "$1"
}
IDX=$TMP/idx
mkdir -p "$IDX"
cp "$BACK/plain.tpack" "$IDX/fresh.tpack"
cp "$BACK/plain.tpack" "$IDX/held.tpack"
damage_index "$IDX/fresh.tpack"
if mount_ckptfs "$IDX" "$MNT" "$TMP/idx.log" -o commit_delay=0; then
    errno_is "a file created in a checkpoint whose pack index is damaged: EIO" EIO create "$MNT/fresh/new.txt"
    errno_is "  a directory too" EIO mkdir "$MNT/fresh/d"
    grep -q "fresh.tpack: index checksum mismatch" "$TMP/idx.log" && pass "  the log says the index is damaged" ||
        fail "  the log says the index is damaged" "$(tail -3 "$TMP/idx.log")"
    expect_same_sha256 "a pack read before its index is damaged in place" "$SRC/c.txt" "$MNT/held/c.txt"
    damage_index "$IDX/held.tpack"
    errno_is "  a file created in it then: EIO too" EIO create "$MNT/held/new.txt"
    grep -q "cannot write into checkpoint 'held': .*index checksum mismatch" "$TMP/idx.log" &&
        pass "  the log says why" || fail "  the log says why" "$(tail -3 "$TMP/idx.log")"
    # Its entries could not be removed (each unlink reopened the pack:
    # EIO), so rm -r never reached the rmdir that deletes it, until a
    # remount. A file of it open meanwhile reads on.
    exec {held_fd}<"$MNT/held/c.txt"
    expect_ok "rm -r of that checkpoint, a file of it open" rm -r "$MNT/held"
    expect_absent "  deletes its pack" "$IDX/held.tpack"
    [ -e "$MNT/held" ] && fail "  and it is gone from the mount" || pass "  and it is gone from the mount"
    grep -q "checkpoint 'held' deleted ($IDX/held.tpack removed)" "$TMP/idx.log" && pass "  the log says it was deleted" ||
        fail "  the log says it was deleted" "$(tail -3 "$TMP/idx.log")"
    cmp -s "$SRC/c.txt" /dev/fd/$held_fd && pass "  the open file reads on, byte-identical" || fail "  the open file reads on, byte-identical"
    exec {held_fd}<&-
    unmount_ckptfs "$MNT"
else
    fail "writable mount of packs with damaged indexes" "$(cat "$TMP/idx.log")"
fi

# ---------------------------------------------- removing a damaged checkpoint

# Removed where it is seen, as on any filesystem: listing it still fails
# (EIO), and rm -r then removes the directory it cannot read, which
# deletes the pack. A pack whose key is not the mount's is not damaged:
# it stays, EACCES.
DEL=$TMP/del
mkdir -p "$DEL"
cp "$BACK/garbage.tpack" "$BACK/empty.tpack" "$BACK/truncated.tpack" "$BACK/enc.tpack" "$DEL/"
cp "$BACK/plain.tpack" "$DEL/badindex.tpack"
damage_index "$DEL/badindex.tpack"
enc_sum=$(sha256sum <"$DEL/enc.tpack")
# A pack of a format newer than this build reads (version 99) is likely
# fine for the ckpt that wrote it: not deleted either.
cp "$BACK/plain.tpack" "$DEL/newer.tpack"
printf '\x63\x00\x00\x00' | dd of="$DEL/newer.tpack" bs=1 seek=8 conv=notrunc status=none
newer_sum=$(sha256sum <"$DEL/newer.tpack")
# A damaged single-file checkpoint: its lookup failed (EIO), and so did
# rm of it, which looks the name up first.
head -c 300 /dev/urandom >"$DEL/junk.tfile"
if mount_ckptfs "$DEL" "$MNT" "$TMP/del.log" -o ro,key_file="$TMP/key2"; then
    errno_is "read-only mount: rmdir of a damaged checkpoint: EROFS" EROFS rmdir "$MNT/garbage"
    [ -f "$DEL/garbage.tpack" ] && pass "  its pack stays" || fail "  its pack stays"
    errno_is "read-only mount: unlink of a damaged single file: EROFS" EROFS unlink "$MNT/junk"
    [ "$(stat -c %s "$MNT/junk" 2>&1)" = 300 ] && pass "  it shows its pack's size, not an empty file" ||
        fail "  it shows its pack's size, not an empty file" "$(stat -c %s "$MNT/junk" 2>&1)"
    errno_is "  reading it: EIO" EIO read "$MNT/junk"
    [ -f "$DEL/junk.tfile" ] && pass "  its pack stays" || fail "  its pack stays"
    unmount_ckptfs "$MNT"
else
    fail "read-only mount of damaged packs" "$(cat "$TMP/del.log")"
fi
if mount_ckptfs "$DEL" "$MNT" "$TMP/del.log" -o key_file="$TMP/key2"; then
    expect_fail "ls of a damaged checkpoint still fails" ls "$MNT/badindex"
    last_stderr_has "  with EIO" "Input/output error"
    expect_ok "rm -r of a checkpoint whose index is damaged" rm -r "$MNT/badindex"
    expect_absent "  deletes its pack" "$DEL/badindex.tpack"
    [ -e "$MNT/badindex" ] && fail "  and it is gone from the mount" || pass "  and it is gone from the mount"
    grep -q "checkpoint 'badindex': the pack deleted was damaged: $DEL/badindex.tpack: index checksum mismatch" \
        "$TMP/del.log" && pass "  the log names the pack and says it was damaged" ||
        fail "  the log names the pack and says it was damaged" "$(tail -3 "$TMP/del.log")"
    expect_ok "rm -r of a garbage pack" rm -r "$MNT/garbage"
    expect_ok "rmdir of an empty pack file" rmdir "$MNT/empty"
    expect_ok "rm -rf of a truncated one" rm -rf "$MNT/truncated"
    expect_absent "  all deleted" "$DEL/garbage.tpack" "$DEL/empty.tpack" "$DEL/truncated.tpack"
    [ -f "$MNT/junk" ] && pass "a damaged single file shows as a file" || fail "a damaged single file shows as a file" "$(stat "$MNT/junk" 2>&1)"
    errno_is "  reading it: EIO" EIO read "$MNT/junk"
    state=$(getfattr -n user.ckptfs.state --only-values "$MNT/junk" 2>/dev/null)
    [ "$state" = damaged ] && pass "  its state is damaged" || fail "  its state is damaged" "$state"
    expect_ok "  rm of it" rm "$MNT/junk"
    expect_absent "  deletes its pack" "$DEL/junk.tfile"
    grep -q "checkpoint 'junk': the pack deleted was damaged: $DEL/junk.tfile: not a tpack file" "$TMP/del.log" &&
        pass "  the log names the pack and says it was damaged" ||
        fail "  the log names the pack and says it was damaged" "$(tail -3 "$TMP/del.log")"
    errno_is "rmdir of a checkpoint with the wrong key: EACCES" EACCES rmdir "$MNT/enc"
    expect_fail "  rm -r too" rm -r "$MNT/enc"
    last_stderr_has "  with EACCES" "Permission denied"
    [ "$(sha256sum <"$DEL/enc.tpack" 2>/dev/null)" = "$enc_sum" ] && pass "  its pack stays, unchanged" ||
        fail "  its pack stays, unchanged"
    errno_is "rmdir of a pack of a newer format: EIO" EIO rmdir "$MNT/newer"
    grep -q "newer.tpack: unsupported format version 99" "$TMP/del.log" && pass "  the log says why" ||
        fail "  the log says why" "$(tail -3 "$TMP/del.log")"
    [ "$(sha256sum <"$DEL/newer.tpack" 2>/dev/null)" = "$newer_sum" ] && pass "  its pack stays, unchanged" ||
        fail "  its pack stays, unchanged"
    unmount_ckptfs "$MNT"
else
    fail "writable mount of damaged packs" "$(cat "$TMP/del.log")"
fi

finish
