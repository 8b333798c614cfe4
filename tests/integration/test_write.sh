#!/usr/bin/env bash
# Writing checkpoints into a ckptfs mount, end to end: cp -r and ordinary
# file work (against the same work on a plain directory), real writers
# (torch.save whole and per tensor, np.save, safetensors), ckpt commit and
# ckpt status, reads before commit, after it and after a remount, EROFS
# once committed, EBUSY while packing, auto-commit, renaming and removing
# checkpoints, namespaces (a directory holding only directories) and files
# at the mount root (checkpoints of their own).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/write_lib.sh"
SRC=$TMP/src
PLAIN=$TMP/plain
mkdir -p "$BACK" "$PLAIN"

# A source tree: a generated checkpoint plus odd files.
expect_ok "ckpt-gen makes a source checkpoint" "$CKPT_GEN" "$SRC" --preset tiny --format both --shards 2
mkdir -p "$SRC/optim/state" "$SRC/empty-dir"
head -c 3000000 /dev/urandom >"$SRC/optim/state/rng.bin"
: >"$SRC/optim/empty.bin"
printf 'odd name\n' >"$SRC/optim/with space & symbols#1.txt"
chmod 600 "$SRC/optim/state/rng.bin"

if ! mount_ckptfs "$BACK" "$MNT" "$LOG" -o commit_delay=0; then
    fail "ckptfs mounts writable" "$(cat "$LOG")"
    finish
fi
pass "ckptfs mounts writable"

# ------------------------------------------------------------------ the root

expect_ok "a file at the mount root is a checkpoint of its own" bash -c "printf stray >'$MNT/stray'"
expect_ok "and reads back" grep -q stray "$MNT/stray"
# A file at the root unlinked while open (tempfile.TemporaryFile's fallback:
# open, unlink, use the descriptor) keeps working through its descriptor, as
# on a local disk, and leaves nothing staged or packed (its next write got
# EROFS before).
staged_before=$(ls "$BACK/.ckptfs/stage" | wc -l)
expect_ok "a file at the root unlinked while open: write, read, fstat, ftruncate" $PY - "$MNT/anon" "$BACK/.ckptfs/stage" "$staged_before" <<'PYEOF'
import os, sys
path, stage, before = sys.argv[1], sys.argv[2], int(sys.argv[3])
fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
os.write(fd, b"head")
os.unlink(path)
assert not os.path.exists(path), "the name is gone"
data = os.urandom(1 << 20)
assert os.write(fd, data) == len(data)
os.lseek(fd, 0, os.SEEK_SET)
got = b""
while len(got) < 4 + len(data):
    chunk = os.read(fd, 1 << 20)
    if not chunk:
        break
    got += chunk
assert got == b"head" + data, "reads back what was written"
st = os.fstat(fd)
assert st.st_size == 4 + len(data) and st.st_nlink == 0, (st.st_size, st.st_nlink)
os.ftruncate(fd, 10)
assert os.fstat(fd).st_size == 10 and os.pread(fd, 100, 0) == got[:10]
# Nothing of it is left for a restart to find while it is still open.
assert len(os.listdir(stage)) == before, os.listdir(stage)
os.close(fd)
PYEOF
expect_absent "then the name is gone and nothing was packed" "$MNT/anon" "$BACK/anon.tfile"
[ "$(ls "$BACK/.ckptfs/stage" | wc -l)" = "$staged_before" ] && pass "nor left staged" ||
    fail "nor left staged" "$(ls "$BACK/.ckptfs/stage")"
# A write past the largest file the staging file system allows (16 TiB
# less 4 KiB on ext4, where staging itself allows 256 TiB) is refused with
# EFBIG, as that file system refuses it, and the checkpoint stays good; so
# are a truncate and a fallocate to such a size. (The write was answered,
# then failed the checkpoint.) fs_max: the largest size a file may have
# there, found with ftruncate on the backing file system.
fs_max=$($PY - "$TMP" <<'PYEOF'
import os, sys, tempfile
fd, path = tempfile.mkstemp(dir=sys.argv[1])
os.unlink(path)
lo, hi = 0, (1 << 63) - 1
while lo < hi:
    mid = (lo + hi + 1) // 2
    try:
        os.ftruncate(fd, mid)
        lo = mid
    except OSError:
        hi = mid - 1
print(lo)
PYEOF
)
if [ "$fs_max" -ge $((256 << 40)) ]; then
    skip "a write past the staging file system's largest file" "$(stat -f -c %T "$TMP") allows more than staging does"
else
    mkdir "$MNT/huge"
    expect_ok "writes, truncates and fallocates past the staging file system's largest file: EFBIG" \
        $PY - "$MNT/huge/sparse.bin" "$fs_max" <<'PYEOF'
import errno, os, sys
path, at = sys.argv[1], int(sys.argv[2])
fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
os.write(fd, b"kept")
for what, op in (("pwrite", lambda: os.pwrite(fd, b"x", at)),
                 ("ftruncate", lambda: os.ftruncate(fd, at + 1)),
                 ("fallocate", lambda: os.posix_fallocate(fd, at, 1))):
    try:
        op()
    except OSError as e:
        assert e.errno == errno.EFBIG, (what, e)
    else:
        raise AssertionError(what + " past the largest file worked")
os.write(fd, b" and more")
os.close(fd)
PYEOF
    [ "$(state_of "$MNT/huge")" = writing ] && pass "the checkpoint stays writing" || fail "the checkpoint stays writing" "$(state_of "$MNT/huge")"
    expect_ok "and commits" "$CKPT" commit --wait "$MNT/huge"
    [ "$(cat "$MNT/huge/sparse.bin")" = "kept and more" ] && pass "with what was written" || fail "with what was written" "$(head -c 100 "$MNT/huge/sparse.bin")"
    rm -r "$MNT/huge"
fi
expect_fail "the staging directory's name is refused" mkdir "$MNT/.ckptfs"
expect_ok "a name starting with '.' is fine" mkdir "$MNT/.hidden"
expect_ok "mkdir makes a directory" mkdir "$MNT/a"
[ "$(state_of "$MNT/a")" = writing ] && pass "its state is writing" || fail "its state is writing" "$(state_of "$MNT/a")"
expect_fail "mkdir of an existing checkpoint fails" mkdir "$MNT/a"
expect_absent "the staging area does not show" "$MNT/.ckptfs"
# A directory whose inode the kernel got while it was a namespace (a shell's
# cwd) is listed after it became a committed checkpoint (ESTALE before).
mkdir "$MNT/cw"
expect_ok "ls in a directory that became a committed checkpoint under its cwd" \
    bash -c "cd '$MNT/cw' && echo x >a && '$CKPT' commit --wait . >/dev/null && ls"
last_stdout_has "and it lists its file" "a"
rm -r "$MNT/cw"
# Copies into the root set its times and mode (rsync -a, cp -a dir/. MNT/,
# tar's ./ entry): they succeed and change nothing (they failed with EPERM).
root_mode=$(stat -c %a "$BACK")
expect_ok "touch of the mount root" touch "$MNT"
expect_ok "chmod of the mount root" chmod 700 "$MNT"
expect_ok "touch -d of the mount root (as cp -a and tar set it)" touch -d @1000000000 "$MNT"
[ "$(stat -c %a "$BACK")" = "$root_mode" ] && pass "the backing directory's mode is kept" || fail "the backing directory's mode is kept" "$(stat -c %a "$BACK")"
[ -d "$BACK/.ckptfs" ] && pass "staging lives under BACKING/.ckptfs" || fail "staging lives under BACKING/.ckptfs"

# ---------------------------------------------------------------- cp -r

expect_ok "cp -r of a tree into the checkpoint" cp -r "$SRC/." "$MNT/a/"
expect_ok "read-your-writes: the copy matches the source" $PY "$WCLIENTS" same-tree "$SRC" "$MNT/a"
mkdir "$MNT/work"
expect_ok "cp -a keeps modes and mtimes" cp -a "$SRC/optim/state/rng.bin" "$MNT/work/rng-a.bin"
want=$(stat -c '%a %Y %s' "$SRC/optim/state/rng.bin")
got=$(stat -c '%a %Y %s' "$MNT/work/rng-a.bin")
[ "$want" = "$got" ] && pass "mode, mtime and size as the source" || fail "mode, mtime and size as the source" "$got, want $want"
# cp -p sets the mtime right after its last write is answered, while that
# write may still be copied to staging: the time set must stay, also once
# the kernel's cached attributes (1 s) expire. Twenty times, as cp does it
# (a write, then futimens on the same descriptor).
expect_ok "write then futimens, twenty times" $PY -c "
import os
for i in range(20):
    fd = os.open('$MNT/work/t%d' % i, os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(fd, os.urandom(1 << 20))
    os.utime(fd, ns=(1234567890 * 10**9, 1234567890 * 10**9))
    os.close(fd)"
sleep 1.2
got=$(for i in $(seq 0 19); do stat -c '%Y' "$MNT/work/t$i"; done | sort -u | tr '\n' ' ')
[ "$got" = "1234567890 " ] && pass "each keeps the mtime it set after its last write" ||
    fail "each keeps the mtime it set after its last write" "$got"
rm -f "$MNT"/work/t[0-9]*
expect_ok "an empty directory can be made" test -d "$MNT/a/empty-dir"

# ----------------------------------------------- ordinary file work, twice

# file_work DIR: the same edits on a plain directory and in the mount.
file_work() {
    local d=$1
    mkdir -p "$d/w/sub" || return 1
    printf 'first\n' >"$d/w/f.txt" &&
        printf 'second\n' >>"$d/w/f.txt" &&
        printf 'replaced\n' >"$d/w/g.txt" &&
        head -c 200000 "$SRC/optim/state/rng.bin" >"$d/w/big.bin" &&
        dd if=/dev/zero of="$d/w/big.bin" bs=1 count=10 seek=65530 conv=notrunc status=none &&
        dd if="$SRC/optim/state/rng.bin" of="$d/w/big.bin" bs=4096 count=3 seek=100 conv=notrunc status=none &&
        truncate -s 70000 "$d/w/big.bin" &&
        truncate -s 300000 "$d/w/big.bin" &&
        printf 'tail' >>"$d/w/big.bin" &&
        mv "$d/w/g.txt" "$d/w/sub/moved.txt" &&
        printf 'gone' >"$d/w/gone.txt" && rm "$d/w/gone.txt" &&
        mkdir "$d/w/d2" && rmdir "$d/w/d2" &&
        mv "$d/w/sub" "$d/w/sub2" &&
        printf 'x' >"$d/w/over.txt" && printf 'yz' >"$d/w/new.txt" && mv "$d/w/new.txt" "$d/w/over.txt" &&
        sync "$d/w/big.bin"
}
expect_ok "file work in a plain directory" file_work "$PLAIN"
expect_ok "the same file work in the checkpoint" file_work "$MNT/work"
expect_ok "both trees read the same" $PY "$WCLIENTS" same-tree "$PLAIN/w" "$MNT/work/w"
expect_ok "random writes, appends, truncates, mmap writes, renames match a plain directory" \
    $PY "$WCLIENTS" random-ops "$PLAIN/r" "$MNT/work/r" 7 300
expect_ok "the tree reads the same after closing everything" $PY "$WCLIENTS" same-tree "$PLAIN/r" "$MNT/work/r"
expect_ok "commit the file work" "$CKPT" commit --wait "$MNT/work"
expect_ok "which reads the same from the pack" $PY "$WCLIENTS" same-tree "$PLAIN/r" "$MNT/work/r" --packed
expect_ok "edited files too" $PY "$WCLIENTS" same-tree "$PLAIN/w" "$MNT/work/w" --packed

# --------------------------------------------------------- python writers

expect_ok "torch.save, np.save, safetensors and DCP into a plain directory" $PY "$WCLIENTS" save "$PLAIN/py" mixed 5
expect_ok "the same writers into a checkpoint" bash -c "mkdir '$MNT/py' && $PY '$WCLIENTS' save '$MNT/py' mixed 5"
expect_ok "byte-identical to the plain copy before commit" $PY "$WCLIENTS" same-tree "$PLAIN/py" "$MNT/py"
expect_ok "torch.load, np.load(mmap), safetensors(mmap) and DCP read them before commit" $PY "$WCLIENTS" verify "$MNT/py" mixed 5

# ------------------------------------------------------- status and commit

expect_ok "ckpt status lists the checkpoints" "$CKPT" status "$MNT"
last_stdout_matches "a plain line per checkpoint, with state and size" '^a +writing +[0-9.]+ [kMG]?B'
last_stdout_matches "py too" '^py +writing'
expect_ok "ckpt status of one checkpoint" "$CKPT" status "$MNT/py"
last_stdout_matches "shows just it" '^py +writing'
expect_fail "ckpt commit outside a mount fails" "$CKPT" commit "$TMP"
last_stderr_has "and says why" "not a checkpoint directory"
expect_ok "ckpt commit --wait" "$CKPT" commit --wait "$MNT/py"
last_stdout_has "reports it committed" "committed"
# py/ got its files in subdirectories: each is a checkpoint, py a namespace.
[ -f "$BACK/py/safetensors.tpack" ] && [ -f "$BACK/py/dcp.tpack" ] && pass "BACKING/py/*.tpack exist" || fail "BACKING/py/*.tpack exist" "$(find "$BACK/py")"
[ "$(state_of "$MNT/py")" = committed ] && pass "state committed" || fail "state committed" "$(state_of "$MNT/py")"
expect_ok "byte-identical after commit, now from the pack" $PY "$WCLIENTS" same-tree "$PLAIN/py" "$MNT/py" --packed
expect_ok "and loads back after commit" $PY "$WCLIENTS" verify "$MNT/py" mixed 5
expect_ok "the read-only view: manifest.json" test -f "$MNT/py/safetensors/manifest.json"
n=$(find "$MNT"/py/*/tensors -type f | wc -l)
[ "$n" -gt 10 ] && pass "and tensors/ ($n tensors from safetensors and npy)" || fail "and tensors/" "$n files"
expect_ok "ckpt verify passes on the pack" "$CKPT" verify "$BACK/py/safetensors.tpack"
# A namespace stands for no pack: ckpt ls says so (it said "this checkpoint
# is committed: it has no pack until it is committed").
expect_fail "ckpt ls of a committed namespace fails" "$CKPT" ls "$MNT/py"
last_stderr_has "naming it a namespace, not a checkpoint" "a namespace of a ckptfs mount" "ckpt status $MNT/py"
expect_ok "ckpt commit of a committed checkpoint is a no-op" "$CKPT" commit --wait "$MNT/py"

# Late writes never fail: the checkpoint is reopened, and a new
# generation of its pack replaces the old one.
mkdir -p "$MNT/late" "$PLAIN/late"
head -c 3000000 /dev/urandom >"$MNT/late/kept.bin"
printf 'first' >"$MNT/late/a.bin"
expect_ok "a checkpoint to write into late" "$CKPT" commit --wait "$MNT/late"
cp "$BACK/late.tpack" "$TMP/late-gen1.tpack"
expect_errno "writing into a committed checkpoint works: create" 0 create "$MNT/late/new.bin"
[ "$(state_of "$MNT/late")" = writing ] && pass "it is writing again" || fail "it is writing again" "$(state_of "$MNT/late")"
expect_errno "write" 0 write "$MNT/late/a.bin"
expect_errno "truncate" 0 truncate "$MNT/late/new.bin"
expect_errno "mkdir" 0 mkdir "$MNT/late/newdir"
cp -a "$MNT/late/." "$PLAIN/late/"
expect_ok "ckpt commit --wait packs a new generation" "$CKPT" commit --wait "$MNT/late"
expect_ok "which reads as written" $PY "$WCLIENTS" same-tree "$PLAIN/late" "$MNT/late" --packed
# kept.bin did not change: the new generation reuses its stored chunks.
if grep -qE "checkpoint 'late': 1 unchanged file \(3000000 bytes\) reused from the previous generation" "$LOG"; then
    pass "the log says the unchanged file's chunks were reused"
else
    fail "the log says the unchanged file's chunks were reused" "$(grep "'late'" "$LOG" | tail -3)"
fi
# Random bytes are stored as they are: the 3 MB appear in both packs.
if $PY - "$TMP/late-gen1.tpack" "$BACK/late.tpack" "$MNT/late/kept.bin" <<'PYEOF'
import sys
old, new, kept = (open(p, "rb").read() for p in sys.argv[1:4])
i = old.find(kept[:65536]); j = new.find(kept[:65536])
sys.exit(0 if i > 0 and j > 0 and old[i:i + len(kept)] == new[j:j + len(kept)] == kept else 1)
PYEOF
then pass "kept.bin's stored bytes are the same in both generations"
else fail "kept.bin's stored bytes are the same in both generations"; fi
expect_errno "its views are read-only" EROFS write "$MNT/late/manifest.json"
expect_ok "rm -r of it" rm -r "$MNT/late"
expect_absent "removes it with its pack" "$MNT/late" "$BACK/late.tpack"

# Writes while packing: a checkpoint big enough to take a moment.
mkdir "$MNT/big"
head -c $((256 << 20)) /dev/urandom >"$MNT/big/noise.bin"
cp "$MNT/big/noise.bin" "$TMP/noise.bin"
expect_ok "ckpt commit (without --wait) starts packing" "$CKPT" commit "$MNT/big"
s=$(state_of "$MNT/big")
if [ "$s" = packing ]; then
    pass "state packing"
    expect_ok "ckpt status while packing" "$CKPT" status "$MNT"
    # Random bytes are stored without compressing: packing can end between
    # the state check above and status.
    if grep -qE '^big +committed' "$LAST_OUT"; then
        skip "writes while packing stop the packing" "packing was over before ckpt status ran"
    else
        last_stdout_matches "shows progress with an ETA" '^big +packing .*% .* of .*ETA'
        expect_errno "reading while packing works" 0 read "$MNT/big/noise.bin"
        expect_errno "creating a file while packing works" 0 create "$MNT/big/more.bin"
        [ "$(state_of "$MNT/big")" = writing ] && pass "the packing stopped: writing again" ||
            fail "the packing stopped: writing again" "$(state_of "$MNT/big")"
        why_logged=1
    fi
else
    skip "writes while packing" "packing was over before the check ($s)"
fi
expect_ok "ckpt commit --wait follows it to the end" "$CKPT" commit --wait "$MNT/big"
# Reading 256 MiB back can outlast the packing: the create then reopens
# the committed checkpoint instead, which the next commit's line says.
if [ -n "${why_logged:-}" ]; then
    if grep -qE "'big'.*written to (while it|after its commit)" "$LOG"; then pass "a log line says why"
    else fail "a log line says why" "$(grep big "$LOG" | tail -3)"; fi
fi
expect_same_sha256 "the big file reads back from the pack" "$TMP/noise.bin" "$MNT/big/noise.bin"

expect_ok "ckpt commit --wait of the cp -r checkpoint" "$CKPT" commit --wait "$MNT/a"
expect_ok "ckpt commit --wait of a file at the root" "$CKPT" commit --wait "$MNT/stray"
[ -f "$BACK/stray.tfile" ] && pass "packed into BACKING/stray.tfile" || fail "packed into BACKING/stray.tfile"
expect_ok "cp -r copy byte-identical after commit" $PY "$WCLIENTS" same-tree "$SRC" "$MNT/a" --packed
expect_ok "mode of a copied file kept in the pack" test "$(stat -c %a "$MNT/a/optim/state/rng.bin")" = 600
expect_ok "the staging area is empty once all is committed" test -z "$(ls "$BACK/.ckptfs/stage")"

# A file open since before its commit reads the pack it was committed
# into, from the first read to the last, whatever replaces that pack.
expect_ok "a file held open across two generations" $PY "$WCLIENTS" held-open "$MNT/held" "$CKPT"
expect_ok "its checkpoint is removed once closed" rm -r "$MNT/held"
# Every open of it has been released (the kernel sends releases after
# close returns): no descriptor of either pack is kept.
for _ in $(seq 50); do
    held=$(ls -l "/proc/${DAEMON_OF[$MNT]}/fd" | grep -c 'held.*tpack')
    [ "$held" = 0 ] && break
    sleep 0.1
done
[ "$held" = 0 ] && pass "the daemon let go of both generations" || fail "the daemon let go of both generations" "$(ls -l "/proc/${DAEMON_OF[$MNT]}/fd" | grep tpack)"

# ----------------------------------------------------- remount, rename, rm

mkdir "$MNT/w"
printf 'kept while writing\n' >"$MNT/w/note.txt"
sync "$MNT/w/note.txt"
expect_ok "mv renames a checkpoint being written" mv "$MNT/w" "$MNT/w2"
expect_ok "mv renames a committed checkpoint" mv "$MNT/big" "$MNT/big2"
[ -f "$BACK/big2.tpack" ] && [ ! -e "$BACK/big.tpack" ] && pass "its pack is renamed" || fail "its pack is renamed"
expect_fail "mv onto an existing checkpoint is refused" mv -T "$MNT/w2" "$MNT/py"

# Renames trainers make: a whole checkpoint (tmp-checkpoint-5 ->
# checkpoint-5, written or committed, across namespaces) and a file over a
# file in a namespace (DeepSpeed's latest, through a temporary).
mkdir -p "$MNT/run/tmp-checkpoint-5"
printf 'weights' >"$MNT/run/tmp-checkpoint-5/a.bin"
expect_ok "mv of a checkpoint being written to its final name" mv "$MNT/run/tmp-checkpoint-5" "$MNT/run/checkpoint-5"
printf '1' >"$MNT/run/latest"
printf '2' >"$MNT/run/latest.tmp"
expect_ok "mv of a file over a file in a namespace" mv "$MNT/run/latest.tmp" "$MNT/run/latest"
[ "$(cat "$MNT/run/latest")" = 2 ] && pass "replaces it" || fail "replaces it" "$(cat "$MNT/run/latest")"
expect_ok "ckpt commit --wait of the namespace" "$CKPT" commit --wait "$MNT/run"
[ -f "$BACK/run/checkpoint-5.tpack" ] && [ -f "$BACK/run/latest.tfile" ] && [ ! -e "$BACK/run/latest.tmp.tfile" ] &&
    pass "packs: run/checkpoint-5.tpack, run/latest.tfile" || fail "packs: run/checkpoint-5.tpack, run/latest.tfile" "$(find "$BACK/run")"
printf '3' >"$MNT/run/latest.tmp"
"$CKPT" commit --wait "$MNT/run/latest.tmp" >/dev/null
expect_ok "mv of a committed file over a committed one" mv "$MNT/run/latest.tmp" "$MNT/run/latest"
[ "$(cat "$MNT/run/latest")" = 3 ] && pass "replaces it too" || fail "replaces it too" "$(cat "$MNT/run/latest")"
mkdir "$MNT/kept"
expect_ok "mv of a committed checkpoint into another namespace" mv "$MNT/run/checkpoint-5" "$MNT/kept/ck5"
[ -f "$BACK/kept/ck5.tpack" ] && [ "$(cat "$MNT/kept/ck5/a.bin")" = weights ] && pass "its pack moved" || fail "its pack moved" "$(find "$BACK/kept")"
expect_ok "mv of a namespace" mv "$MNT/kept" "$MNT/kept2"
expect_ok "reads through the new name" grep -q weights "$MNT/kept2/ck5/a.bin"
rm -r "$MNT/kept2" "$MNT/run"
expect_absent "rm -r of namespaces removes them" "$MNT/kept2" "$MNT/run" "$BACK/kept2" "$BACK/run"

# rename(2) of a directory over another: an empty one is replaced (it
# gave ENOTEMPTY), a checkpoint is a directory that is not empty (a
# namespace over one gave ENOTDIR), and so is a directory whose only entry
# is a checkpoint being written (nothing of it in BACKING yet).
mkdir -p "$MNT/rn/ck" "$MNT/rn/ck2" "$MNT/rn/pk" "$MNT/rn/pk2" "$MNT/rn/re" "$MNT/rn/e1" "$MNT/rn/e2" "$MNT/rn/e3" "$MNT/rn/full/sub" "$MNT/rn/busy/w"
for d in ck ck2 pk pk2 re busy/w; do printf '%s' "$d" >"$MNT/rn/$d/f"; done
printf s >"$MNT/rn/single"
for d in pk pk2 re single; do "$CKPT" commit --wait "$MNT/rn/$d" >/dev/null; done
printf re2 >"$MNT/rn/re/g" # written again: its pack moves along
expect_ok "mv -T of a checkpoint being written over an empty directory" mv -T "$MNT/rn/ck" "$MNT/rn/e1"
expect_errno "of a committed one" 0 rename "$MNT/rn/pk" "$MNT/rn/e2"
expect_errno "of one written again after its commit" 0 rename "$MNT/rn/re" "$MNT/rn/e3"
[ "$(cat "$MNT/rn/e1/f" "$MNT/rn/e2/f" "$MNT/rn/e3/f" "$MNT/rn/e3/g")" = ckpkrere2 ] && pass "each reads under the name it replaced" ||
    fail "each reads under the name it replaced" "$(ls -R "$MNT/rn")"
[ -f "$BACK/rn/e2.tpack" ] && [ -f "$BACK/rn/e3.tpack" ] && [ ! -d "$BACK/rn/e1" ] && [ ! -d "$BACK/rn/e2" ] && [ ! -d "$BACK/rn/e3" ] &&
    pass "the empty directories are gone from BACKING, the packs moved" || fail "the empty directories are gone from BACKING, the packs moved" "$(find "$BACK/rn")"
expect_errno "a checkpoint over a directory holding a directory: ENOTEMPTY" ENOTEMPTY rename "$MNT/rn/ck2" "$MNT/rn/full"
expect_errno "over one holding only a checkpoint being written: ENOTEMPTY" ENOTEMPTY rename "$MNT/rn/ck2" "$MNT/rn/busy"
expect_errno "a single-file checkpoint over a directory: EISDIR" EISDIR rename "$MNT/rn/single" "$MNT/rn/full"
expect_errno "a directory over a committed checkpoint: ENOTEMPTY" ENOTEMPTY rename "$MNT/rn/full" "$MNT/rn/pk2"
expect_errno "over one being written: ENOTEMPTY" ENOTEMPTY rename "$MNT/rn/full" "$MNT/rn/ck2"
expect_errno "over a single-file checkpoint: ENOTDIR" ENOTDIR rename "$MNT/rn/full" "$MNT/rn/single"
expect_errno "over a directory holding only a checkpoint being written: ENOTEMPTY" ENOTEMPTY rename "$MNT/rn/full" "$MNT/rn/busy"
[ -d "$MNT/rn/full/sub" ] && [ "$(cat "$MNT/rn/busy/w/f" "$MNT/rn/pk2/f" "$MNT/rn/ck2/f")" = busy/wpk2ck2 ] && [ -d "$BACK/rn/full/sub" ] &&
    pass "the refused renames changed nothing" || fail "the refused renames changed nothing" "$(ls -R "$MNT/rn")"
expect_ok "ckpt commit --wait of what was renamed" "$CKPT" commit --wait "$MNT/rn"
[ -f "$BACK/rn/e1.tpack" ] && [ "$(cat "$MNT/rn/e3/g")" = re2 ] && pass "commits under the new names" || fail "commits under the new names" "$(find "$BACK/rn")"
rm -r "$MNT/rn"

# readdir gives each entry the inode stat does (find -inum, ls -i): a
# committed single file gave its pack's root, and ".." of a checkpoint or
# of a namespace in a namespace (and "." of the latter) the mount root.
mkdir -p "$MNT/inos/wdir/d" "$MNT/inos/pdir/d" "$MNT/inos/sub/deeper"
printf w >"$MNT/inos/wdir/d/f"
printf p >"$MNT/inos/pdir/d/f"
printf f >"$MNT/inos/wfile"
printf g >"$MNT/inos/pfile"
"$CKPT" commit --wait "$MNT/inos/pdir" >/dev/null && "$CKPT" commit --wait "$MNT/inos/pfile" >/dev/null
expect_ok "readdir's inodes are stat's: namespaces, written and committed checkpoints" $PY "$WCLIENTS" same-inodes \
    "$MNT" "$MNT/inos" "$MNT/inos/sub" "$MNT/inos/wdir" "$MNT/inos/wdir/d" "$MNT/inos/pdir" "$MNT/inos/pdir/d"
if mount_ckptfs "$BACK" "$TMP/ro" "$LOG" -o ro; then
    expect_ok "on a read-only mount too" $PY "$WCLIENTS" same-inodes "$TMP/ro" "$TMP/ro/inos" "$TMP/ro/inos/sub" "$TMP/ro/inos/pdir"
    unmount_ckptfs "$TMP/ro"
else
    fail "on a read-only mount too" "it does not mount: $(tail -3 "$LOG")"
fi
rm -r "$MNT/inos"

# Symbolic links: a Hugging Face cache tree copied with cp -a (relative
# links into blobs/), and a link straight in a namespace (Lightning's
# last.ckpt), kept in the packs with their target text.
HF=$TMP/hf/models--org--name
mkdir -p "$HF/blobs" "$HF/refs" "$HF/snapshots/abc123"
head -c 300000 /dev/urandom >"$HF/blobs/5f1e"
printf '{"model_type": "gpt2"}' >"$HF/blobs/9a0b"
printf 'abc123' >"$HF/refs/main"
ln -s ../../blobs/5f1e "$HF/snapshots/abc123/model.safetensors"
ln -s ../../blobs/9a0b "$HF/snapshots/abc123/config.json"
expect_ok "cp -a of a Hugging Face cache tree" cp -a "$TMP/hf/models--org--name" "$MNT/"
expect_ok "reads back through its links" cmp "$HF/blobs/5f1e" "$MNT/models--org--name/snapshots/abc123/model.safetensors"
[ "$(readlink "$MNT/models--org--name/snapshots/abc123/config.json")" = ../../blobs/9a0b ] &&
    pass "readlink gives the target text" || fail "readlink gives the target text"
mkdir -p "$MNT/lt/checkpoints"
printf 'e0' >"$MNT/lt/checkpoints/epoch=0-step=1.ckpt"
printf 'e1' >"$MNT/lt/checkpoints/epoch=1-step=2.ckpt"
expect_ok "a link in a namespace" ln -s epoch=1-step=2.ckpt "$MNT/lt/checkpoints/last.ckpt"
expect_ok "ckpt commit --wait of both" bash -c "'$CKPT' commit --wait '$MNT/models--org--name' && '$CKPT' commit --wait '$MNT/lt'"
expect_ok "links read back from the packs" cmp "$HF/blobs/9a0b" "$MNT/models--org--name/snapshots/abc123/config.json"
[ "$(cat "$MNT/lt/checkpoints/last.ckpt")" = e1 ] && pass "and in a namespace" || fail "and in a namespace"
expect_ok "a relinked last.ckpt (rm, ln -s)" bash -c "rm '$MNT/lt/checkpoints/last.ckpt' && ln -s epoch=0-step=1.ckpt '$MNT/lt/checkpoints/last.ckpt'"
py_target=$(python3 -c "import os; print(len(os.readlink('$MNT/lt/checkpoints/last.ckpt')))")
[ "$py_target" = 19 ] && pass "reads as the new link" || fail "reads as the new link" "$py_target"
expect_fail "a target over 4095 bytes is refused" ln -s "$(head -c 5000 /dev/zero | tr '\0' a)" "$MNT/lt/checkpoints/long"
if ls -a "$MNT/models--org--name/snapshots/abc123" | grep -q ckptfs-links; then fail "the links file is hidden"; else pass "the links file is hidden"; fi

if unmount_ckptfs "$MNT"; then pass "unmount ends the daemon with status 0"
else fail "unmount ends the daemon with status 0" "$(tail -3 "$LOG")"; fi
mount_ckptfs "$BACK" "$MNT" "$LOG" -o commit_delay=0 || { fail "remount" "$(tail -5 "$LOG")"; finish; }
expect_ok "after a remount: the cp -r checkpoint" $PY "$WCLIENTS" same-tree "$SRC" "$MNT/a" --packed
expect_ok "the python checkpoint" $PY "$WCLIENTS" verify "$MNT/py" mixed 5
expect_ok "the renamed one" cmp "$TMP/noise.bin" "$MNT/big2/noise.bin"
expect_ok "links after a remount" cmp "$HF/blobs/5f1e" "$MNT/models--org--name/snapshots/abc123/model.safetensors"
[ "$(cat "$MNT/lt/checkpoints/last.ckpt")" = e0 ] && pass "a link in a namespace after a remount" || fail "a link in a namespace after a remount"
rm -r "$MNT/models--org--name" "$MNT/lt"
[ "$(state_of "$MNT/w2")" = writing ] && pass "a checkpoint left writing is still writing" || fail "a checkpoint left writing is still writing" "$(state_of "$MNT/w2")"
expect_ok "with its data" grep -q "kept while writing" "$MNT/w2/note.txt"
expect_ok "and can be written on" bash -c "printf more >>'$MNT/w2/note.txt'"

expect_ok "rm -r of a committed checkpoint" rm -r "$MNT/a"
expect_absent "deletes it and its pack" "$MNT/a" "$BACK/a.tpack"
expect_ok "rm -r of a checkpoint being written" rm -r "$MNT/w2"
expect_absent "deletes it" "$MNT/w2"
expect_ok "and its staged data" test -z "$(ls "$BACK/.ckptfs/stage")"
expect_ok "ls of the root" ls "$MNT"
[ "$(ls "$MNT" | tr '\n' ' ')" = "big2 py stray work " ] && pass "lists what is left" || fail "lists what is left" "$(ls "$MNT")"
expect_ok "df works on the mount" df "$MNT"

unmount_ckptfs "$MNT"

# ------------------------------------------------------------ auto-commit

mount_ckptfs "$BACK" "$MNT" "$LOG" -o commit_delay=1 || { fail "mount with commit_delay=1"; finish; }
mkdir "$MNT/auto"
cp -r "$SRC/." "$MNT/auto/"
[ "$(state_of "$MNT/auto")" = writing ] && pass "writing right after cp" || fail "writing right after cp" "$(state_of "$MNT/auto")"
wait_state "committed on its own once quiet for commit_delay" "$MNT/auto" committed 30
expect_ok "auto-committed copy byte-identical" $PY "$WCLIENTS" same-tree "$SRC" "$MNT/auto" --packed
mkdir "$MNT/open"
exec 7>"$MNT/open/held.bin"
printf 'x' >&7
sleep 2.5
[ "$(state_of "$MNT/open")" = writing ] && pass "not while a file in it is open" || fail "not while a file in it is open" "$(state_of "$MNT/open")"
exec 7>&-
wait_state "committed once it is closed" "$MNT/open" committed 30
# A file open for reading only (an eval process that mapped a checkpoint
# still being written, torch.load(mmap=True), for as long as it lives)
# does not hold the commit back: it reads on, the same bytes, from the pack.
mkdir "$MNT/reader"
printf 'weights' >"$MNT/reader/w.bin"
exec 8<"$MNT/reader/w.bin"
wait_state "committed while a file in it is open for reading" "$MNT/reader" committed 30
[ "$(cat <&8)" = weights ] && pass "the reader reads on across the commit" ||
    fail "the reader reads on across the commit"
exec 8<&-
# A committed checkpoint changed only by a remove, a rename or a touch is
# committed again once quiet too (it stayed writing until ckpt commit).
for change in rm mv touch open; do
    mkdir "$MNT/re-$change"
    echo a >"$MNT/re-$change/a"
    echo b >"$MNT/re-$change/b"
    wait_state "re-$change: committed" "$MNT/re-$change" committed 30
    case $change in
    rm) rm "$MNT/re-$change/b" ;;
    mv) mv "$MNT/re-$change/b" "$MNT/re-$change/c" ;;
    touch) touch -d @1000000000 "$MNT/re-$change/b" ;;
    open) $PY -c "open('$MNT/re-$change/b', 'r+').close()" ;;
    esac
    wait_state "re-$change: committed again once quiet, after only a $change" "$MNT/re-$change" committed 30
    expect_ok "re-$change: the new pack holds the change" "$CKPT" ls -l "$BACK/re-$change.tpack"
    case $change in
    rm) ! grep -q " b$" "$LAST_OUT" && pass "re-rm: b is gone from the pack" || fail "re-rm: b is gone from the pack" "$(cat "$LAST_OUT")" ;;
    mv) grep -q " c$" "$LAST_OUT" && ! grep -q " b$" "$LAST_OUT" && pass "re-mv: b is c in the pack" || fail "re-mv: b is c in the pack" "$(cat "$LAST_OUT")" ;;
    touch) grep -q "2001-09-0[89].* b$" "$LAST_OUT" && pass "re-touch: b's new mtime is in the pack" || fail "re-touch: b's new mtime is in the pack" "$(cat "$LAST_OUT")" ;;
    open) grep -q " a$" "$LAST_OUT" && grep -q " b$" "$LAST_OUT" && pass "re-open: the pack is unchanged" || fail "re-open: the pack is unchanged" "$(cat "$LAST_OUT")" ;;
    esac
    [ -e "$MNT/re-$change/manifest.json" ] && pass "re-$change: shown packed again" || fail "re-$change: shown packed again" "no manifest.json"
done
# Saved into tmp-N, then renamed to step-N as its pack ends: the daemon
# told the kernel of the commit while the rename, holding the directory's
# lock, waited for the pack to stop, and the mount hung for good (the
# rename in D state). Delays sweep across the pack's length.
head -c 48M /dev/urandom >"$TMP/r48"
hung=0
for i in $(seq 1 16); do
    mkdir "$MNT/tmp-$i" && cp "$TMP/r48" "$MNT/tmp-$i/w.bin"
    setfattr -n user.ckptfs.commit -v 1 "$MNT/tmp-$i"
    sleep "$(awk -v i="$i" 'BEGIN { printf "%.3f", (i - 1) * 0.03 }')"
    timeout -s KILL 30 mv "$MNT/tmp-$i" "$MNT/step-$i" || hung=$((hung + 1))
    rm -rf "$MNT/step-$i"
done
[ "$hung" -eq 0 ] && pass "a checkpoint renamed as its pack ends: 16 renames, none hung" ||
    fail "a checkpoint renamed as its pack ends: 16 renames, none hung" "$hung failed"
hwm=$(awk '/VmHWM/ {print $2}' "/proc/${DAEMON_OF[$MNT]}/status")
[ "${hwm:-999999}" -lt $((200 << 10)) ] && pass "daemon peak memory ${hwm} KiB" || fail "daemon peak memory" "${hwm} KiB"
unmount_ckptfs "$MNT"

if grep -qiE "assert|sanitizer|segfault" "$LOG"; then fail "no crash traces in the log" "$(grep -iE 'assert|sanitizer' "$LOG" | head -3)"
else pass "no crash traces in the log"; fi
finish
