#!/usr/bin/env bash
# POSIX corners of the writable mount, as a local filesystem answers them:
# ENAMETOOLONG for names over 255 bytes at every level; atime and mtime
# both settable (touch -a/-m, utimensat) and read back as set, across a
# remount; rmdir of an empty committed checkpoint deletes its pack, and
# deleting a checkpoint frees its space at once; symlinks in the backing
# store are ignored, never followed; statfs shows the backing store's
# numbers; files never show set-id bits, packed or being written.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/write_lib.sh"

mkdir -p "$BACK"
mount_ckptfs "$BACK" "$MNT" "$LOG" -o commit_delay=0 || { fail "mount" "$(cat "$LOG")"; finish; }

# py_errno NAME WANT CODE: runs python CODE (os imported, errors caught)
# and compares the errno name it ended with ("0": no error).
py_errno() {
    local name=$1 want=$2 got
    got=$($PY -c "
import errno, os, sys
try:
$3
except OSError as e:
    print(errno.errorcode.get(e.errno, e.errno)); sys.exit(0)
print(0)" 2>&1)
    if [ "$got" = "$want" ]; then pass "$name"; else fail "$name" "got $got, want $want"; fi
}

# ------------------------------------------------- ENAMETOOLONG

mkdir "$MNT/n"
echo x >"$MNT/n/f"
L=$(printf 'a%.0s' $(seq 256))
for where in "$MNT" "$MNT/n"; do
    lvl=$([ "$where" = "$MNT" ] && echo root || echo "inside a checkpoint")
    py_errno "lookup of 256 bytes ($lvl)" ENAMETOOLONG "    os.stat('$where/$L')"
    py_errno "mkdir ($lvl)" ENAMETOOLONG "    os.mkdir('$where/$L')"
    py_errno "create ($lvl)" ENAMETOOLONG "    open('$where/$L', 'wb')"
    py_errno "mknod ($lvl)" ENAMETOOLONG "    os.mknod('$where/$L', 0o100644)"
    py_errno "symlink ($lvl)" ENAMETOOLONG "    os.symlink('target', '$where/$L')"
    py_errno "unlink ($lvl)" ENAMETOOLONG "    os.unlink('$where/$L')"
    py_errno "rmdir ($lvl)" ENAMETOOLONG "    os.rmdir('$where/$L')"
done
py_errno "rename to 256 bytes (inside)" ENAMETOOLONG "    os.rename('$MNT/n/f', '$MNT/n/$L')"
py_errno "rename of a checkpoint to 256 bytes" ENAMETOOLONG "    os.rename('$MNT/n', '$MNT/$L')"
py_errno "255 bytes still work inside a checkpoint" 0 "    open('$MNT/n/${L:1}', 'wb').close()"
py_errno "and read back" 0 "    os.stat('$MNT/n/${L:1}')"
py_errno "a missing 255-byte name is ENOENT" ENOENT "    os.stat('$MNT/n/${L:2}b')"
# The first file into an empty directory makes the directory the checkpoint,
# so its name is a file's inside one (up to 255 bytes), not a checkpoint's.
mkdir "$MNT/first"
py_errno "255 bytes as the first file of an empty directory" 0 \
    "    open('$MNT/first/${L:1}', 'wb').close()"
# A file at the top is a checkpoint of its own: 249 bytes at most.
py_errno "a 250-byte file at the top is ENAMETOOLONG" ENAMETOOLONG \
    "    open('$MNT/${L:6}', 'wb')"
# So is a checkpoint or namespace renamed to 250 bytes, as mkdir says.
mkdir -p "$MNT/ns/sub"
py_errno "rename of a checkpoint to 250 bytes" ENAMETOOLONG \
    "    os.rename('$MNT/n', '$MNT/${L:6}')"
py_errno "rename of a namespace to 250 bytes" ENAMETOOLONG \
    "    os.rename('$MNT/ns', '$MNT/${L:6}')"
# The longest checkpoint name (249 bytes) must commit: its temporary pack
# (.NAME.tpack.tmp) must fit in a directory entry too.
L249=${L:7}
mkdir "$MNT/$L249"
echo long >"$MNT/$L249/f"
expect_ok "commit a checkpoint named 249 bytes" "$CKPT" commit --wait "$MNT/$L249"
expect_ok "its pack is there" test -f "$BACK/$L249.tpack"
echo top >"$MNT/t${L249:1}"
expect_ok "commit a file at the top named 249 bytes" "$CKPT" commit --wait "$MNT/t${L249:1}"
expect_ok "its packed file is there" test -f "$BACK/t${L249:1}.tfile"

# ------------------------------------------------- atime and mtime

mkdir -p "$MNT/t/sub"
echo data >"$MNT/t/f"
# times_of PATH: "atime mtime" in whole seconds.
times_of() { $PY -c "import os,sys; s=os.stat(sys.argv[1]); print(int(s.st_atime), int(s.st_mtime))" "$1"; }
expect_times() {
    local name=$1 path=$2 want=$3 got
    got=$(times_of "$path")
    if [ "$got" = "$want" ]; then pass "$name"; else fail "$name" "got '$got', want '$want'"; fi
}
$PY -c "import os; os.utime('$MNT/t/f', (1000000000, 1100000000))"
expect_times "utime sets both on a file" "$MNT/t/f" "1000000000 1100000000"
touch -a -d @1200000000 "$MNT/t/f"
expect_times "touch -a changes the atime alone" "$MNT/t/f" "1200000000 1100000000"
touch -m -d @1300000000 "$MNT/t/f"
expect_times "touch -m changes the mtime alone" "$MNT/t/f" "1200000000 1300000000"
touch -a -d @1400000000 "$MNT/t/sub"
touch -m -d @1500000000 "$MNT/t/sub"
expect_times "and on a directory" "$MNT/t/sub" "1400000000 1500000000"
touch -a -d @1600000000 "$MNT/t"
expect_times "and on the checkpoint directory" "$MNT/t" "1600000000 $(times_of "$MNT/t" | cut -d' ' -f2)"
ns=$($PY -c "
import os
os.utime('$MNT/t/f', ns=(1700000000123456789, 1300000000000000001))
s = os.stat('$MNT/t/f'); print(s.st_atime_ns, s.st_mtime_ns)")
[ "$ns" = "1700000000123456789 1300000000000000001" ] && pass "nanoseconds kept" || fail "nanoseconds kept" "$ns"
cat "$MNT/t/f" >/dev/null
expect_times "reading leaves the atime as set" "$MNT/t/f" "1700000000 1300000000"
unmount_ckptfs "$MNT"
mount_ckptfs "$BACK" "$MNT" "$LOG" -o commit_delay=0 || { fail "remount"; finish; }
expect_times "atime survives a remount (staging keeps it)" "$MNT/t/f" "1700000000 1300000000"
expect_times "so does a directory's" "$MNT/t/sub" "1400000000 1500000000"

# ------------------------------------------------- rmdir of an empty checkpoint

# Committed with one file; that file removed (hidden): manifest.json and
# tensors/ are still listed, but they are views of files that are gone.
mkdir "$MNT/e1"
echo one >"$MNT/e1/only.txt"
expect_ok "commit e1" "$CKPT" commit --wait "$MNT/e1"
expect_ok "rm of its one file" rm "$MNT/e1/only.txt"
expect_ok "rmdir of the emptied checkpoint" rmdir "$MNT/e1"
expect_absent "deletes its pack" "$BACK/e1.tpack" "$MNT/e1"
# Committed with nothing in it at all.
mkdir "$MNT/e2"
expect_ok "commit of an empty checkpoint" "$CKPT" commit --wait "$MNT/e2"
[ -e "$BACK/e2.tpack" ] && pass "is a pack" || fail "is a pack"
expect_ok "rmdir of it" rmdir "$MNT/e2"
expect_absent "deletes it" "$BACK/e2.tpack" "$MNT/e2"
# One that still holds a file is not empty.
mkdir "$MNT/e3"
mkdir "$MNT/e3/d"
echo y >"$MNT/e3/y" # the first file: e3 is the checkpoint
echo x >"$MNT/e3/d/x"
expect_ok "commit e3" "$CKPT" commit --wait "$MNT/e3"
rm "$MNT/e3/y"
py_errno "rmdir with a packed file left is ENOTEMPTY" ENOTEMPTY "    os.rmdir('$MNT/e3')"
[ -e "$BACK/e3.tpack" ] && pass "and keeps the pack" || fail "and keeps the pack"
# A symbolic link is content too: rmdir of a checkpoint that shows one is
# ENOTEMPTY and keeps the pack (it used to delete the pack, link and all);
# rm -r removes the link, then the checkpoint.
mkdir "$MNT/e4"
ln -s ../elsewhere "$MNT/e4/l"
expect_ok "commit e4 (one symbolic link, no file)" "$CKPT" commit --wait "$MNT/e4"
py_errno "rmdir with a symbolic link left is ENOTEMPTY" ENOTEMPTY "    os.rmdir('$MNT/e4')"
[ -e "$BACK/e4.tpack" ] && [ "$(readlink "$MNT/e4/l")" = ../elsewhere ] &&
    pass "and keeps the pack and its link" || fail "and keeps the pack and its link"
expect_ok "rm -r of it" rm -r "$MNT/e4"
expect_absent "deletes it" "$BACK/e4.tpack" "$MNT/e4"

# ------------------------------------------------- rm -r of a committed checkpoint

# Its first unlink reopens it, and tensors/, listed by rm -r before that,
# is hidden on the way. The log used to say "reopened; a new generation of
# its pack replaces it once quiet" and "removing entries in it only hides
# them until the next mount" before the deletion: neither happened.
mkdir -p "$MNT/rr/sub"
echo a >"$MNT/rr/a.txt"
echo b >"$MNT/rr/sub/b.txt"
$PY -c "import numpy as np; np.save('$MNT/rr/w.npy', np.arange(8, dtype='<f4'))"
expect_ok "commit rr (files, a directory, a tensor)" "$CKPT" commit --wait "$MNT/rr"
expect_ok "it shows tensors/" test -e "$MNT/rr/tensors/w"
stage_before=$(ls "$BACK/.ckptfs/stage")
log_before=$(wc -l <"$LOG")
expect_ok "rm -r of it" rm -r "$MNT/rr"
expect_absent "deletes its pack" "$BACK/rr.tpack" "$MNT/rr"
[ "$(ls "$BACK/.ckptfs/stage")" = "$stage_before" ] && pass "and leaves no staging" ||
    fail "and leaves no staging" "$(ls "$BACK/.ckptfs/stage")"
got=$(tail -n +$((log_before + 1)) "$LOG")
want="ckptfs: checkpoint 'rr' deleted ($BACK/rr.tpack removed)"
[ "$got" = "$want" ] && pass "the log says that, in one line" || fail "the log says that, in one line" "$got"

# ------------------------------------------------- deleting frees the space

mkdir "$MNT/big"
head -c $((64 << 20)) /dev/urandom >"$MNT/big/random.bin"
expect_ok "commit a 64 MB checkpoint" "$CKPT" commit --wait "$MNT/big"
daemon=${DAEMON_OF[$MNT]}
cat "$MNT/big/random.bin" >/dev/null # the daemon opens the pack
ls "$MNT/big" >/dev/null
free_before=$(stat -f -c '%a' "$BACK")
expect_ok "rm -r of the committed checkpoint" rm -r "$MNT/big"
expect_absent "removes the pack" "$BACK/big.tpack"
held=$(ls -l "/proc/$daemon/fd" 2>/dev/null | grep -c 'big.tpack')
[ "$held" = 0 ] && pass "the daemon holds no descriptor of it (no ls of the root needed)" ||
    fail "the daemon holds no descriptor of it" "$(ls -l "/proc/$daemon/fd" | grep tpack)"
free_after=$(stat -f -c '%a' "$BACK")
bsize=$(stat -f -c '%S' "$BACK")
freed=$(((free_after - free_before) * bsize >> 20))
# The file system is shared with whatever else runs on the machine, so the
# free-space figure is reported, not asserted: no link and no descriptor
# left (checked above) is what frees the space.
echo "     info: $freed MB free space came back (64 MB pack)"
# A reader that has a file open keeps it, as on a local filesystem.
mkdir "$MNT/held"
head -c $((4 << 20)) /dev/urandom >"$TMP/held.bin"
cp "$TMP/held.bin" "$MNT/held/f"
expect_ok "commit another" "$CKPT" commit --wait "$MNT/held"
exec {rd}<"$MNT/held/f"
expect_ok "rm -r while a file in it is open" rm -r "$MNT/held"
sum=$(sha256sum <&$rd | cut -d' ' -f1)
[ "$sum" = "$(sha256sum <"$TMP/held.bin" | cut -d' ' -f1)" ] && pass "the open file still reads whole" ||
    fail "the open file still reads whole"
exec {rd}<&-
sleep 0.2
held=$(ls -l "/proc/$daemon/fd" 2>/dev/null | grep -c 'held.tpack')
[ "$held" = 0 ] && pass "and is let go once closed" || fail "and is let go once closed" "$(ls -l "/proc/$daemon/fd" | grep tpack)"

# ------------------------------------------------- symlinks in the backing store

cp "$BACK/e3.tpack" "$TMP/outside.tpack"
ln -s /etc/shadow "$BACK/shadow.tpack"
ln -s "$TMP/outside.tpack" "$BACK/outside.tpack"
ls "$MNT" >/dev/null
ls "$MNT" >"$TMP/listing"
if grep -qx 'shadow\|outside' "$TMP/listing"; then fail "links to packs are not listed" "$(cat "$TMP/listing")"; else pass "links to packs are not listed"; fi
py_errno "a link to /etc/shadow does not resolve" ENOENT "    os.stat('$MNT/shadow')"
py_errno "nor one to a pack outside" ENOENT "    os.listdir('$MNT/outside')"
n=$(grep -c "outside.tpack is a symbolic link: ignored" "$LOG")
[ "$n" = 1 ] && pass "one warning names it" || fail "one warning names it" "$n lines"
grep -q "shadow.tpack is a symbolic link: ignored" "$LOG" && pass "the other too" || fail "the other too"
if ls -l "/proc/$daemon/fd" 2>/dev/null | grep -q "shadow\|outside"; then
    fail "neither is ever opened" "$(ls -l "/proc/$daemon/fd" | grep "shadow\|outside")"
else pass "neither is ever opened"; fi
rm -f "$BACK/shadow.tpack" "$BACK/outside.tpack"

# ------------------------------------------------- statfs

# stat -f of the mount: the backing filesystem's numbers (allowing for
# what changes between the two calls).
read -r mb mf mbs mnm < <(stat -f -c '%b %f %S %l' "$MNT")
read -r bb bf bbs < <(stat -f -c '%b %f %S' "$BACK")
[ "$mb" = "$bb" ] && [ "$mbs" = "$bbs" ] && pass "statfs: the backing store's size and block size ($mb x $mbs)" ||
    fail "statfs: the backing store's size" "mount $mb x $mbs, backing $bb x $bbs"
diff=$((mf > bf ? mf - bf : bf - mf))
[ "$diff" -le 256 ] && pass "statfs: its free blocks" || fail "statfs: its free blocks" "mount $mf, backing $bf"
[ "$mnm" = 255 ] && pass "statfs: names up to 255 bytes" || fail "statfs: names up to 255 bytes" "$mnm"
dfm=$(df -P "$MNT" | awk 'NR == 2 { print $2, $4 }')
dfb=$(df -P "$BACK" | awk 'NR == 2 { print $2 }')
[ "${dfm%% *}" = "$dfb" ] && pass "df shows the backing store's size" || fail "df shows the backing store's size" "$dfm vs $dfb"


# ------------------------------------------------- set-id bits of packed files

# A pack made elsewhere (here by ckpt pack of a set-uid, set-gid file)
# shows its files without set-id bits, as a read-only mount and ckpt
# unpack do, also once the checkpoint is reopened by a write beside them.
mkdir -p "$TMP/suid"
printf '#!/bin/sh\nid\n' >"$TMP/suid/tool"
chmod 6755 "$TMP/suid/tool"
"$CKPT" pack "$TMP/suid" -o "$BACK/suid.tpack" >/dev/null 2>&1 || fail "pack a set-id file"
m=$(stat -c %a "$MNT/suid/tool" 2>&1)
[ "$m" = 755 ] && pass "a packed set-id file shows mode 755" || fail "a packed set-id file shows mode 755" "$m"
echo y >"$MNT/suid/other"
m=$(stat -c %a "$MNT/suid/tool" 2>&1)
[ "$m" = 755 ] && pass "and still once reopened" || fail "and still once reopened" "$m"
"$CKPT" commit "$MNT/suid" --wait >/dev/null 2>&1 || fail "commit the reopened checkpoint"
m=$(stat -c %a "$MNT/suid/tool" 2>&1)
[ "$m" = 755 ] && pass "and once committed again" || fail "and once committed again" "$m"
rm -rf "$MNT/suid" "$TMP/suid"

# Nor does a file or directory being written: everything in the mount shows
# as the daemon's user's, whoever made it (-o allow_other), so a set-uid
# file made there by another user would run as that user (root, with
# -o suid). Made with the bits, chmod'ed to them, and once packed.
mkdir "$MNT/sid"
$PY - "$MNT/sid" <<'PYEOF'
import os, sys
d = sys.argv[1]
os.close(os.open(d + "/made", os.O_CREAT | os.O_WRONLY, 0o6755))
open(d + "/chmoded", "w").close()
os.chmod(d + "/chmoded", 0o4755)
os.mkdir(d + "/dir", 0o3755)
PYEOF
m=$(stat -c %a "$MNT/sid/made" "$MNT/sid/chmoded" "$MNT/sid/dir" 2>&1 | tr '\n' ' ')
[ "$m" = "755 755 1755 " ] && pass "a file being written never shows set-id bits" || fail "a file being written never shows set-id bits" "$m"
"$CKPT" commit "$MNT/sid" --wait >/dev/null 2>&1 || fail "commit the set-id checkpoint"
m=$(stat -c %a "$MNT/sid/made" "$MNT/sid/chmoded" 2>&1 | tr '\n' ' ')
[ "$m" = "755 755 " ] && pass "nor once packed" || fail "nor once packed" "$m"
rm -rf "$MNT/sid"

unmount_ckptfs "$MNT"
finish
