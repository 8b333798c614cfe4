#!/usr/bin/env bash
# POSIX corners of the writable mount, as a local filesystem answers them:
# ENAMETOOLONG for names over 255 bytes at every level; atime and mtime
# both settable (touch -a/-m, utimensat) and read back as set, across a
# remount; rmdir of an empty committed checkpoint deletes its pack; statfs
# shows the backing store's numbers.
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

finish
