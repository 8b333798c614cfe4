#!/usr/bin/env bash
# End to end tests of the ckptfs mount: packs in every storage mode are
# mounted for real and read back through cat, cp -r, dd at odd offsets and
# real clients (numpy, torch, mmap), and must match the sources byte for
# byte; plus the layout, manifest.json, xattrs, read-only refusals, many
# readers at once, the cache bound, options and daemon mode.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/mount_lib.sh"

# ------------------------------------------------------------------ inputs

cd "$TMP" || exit 1
SRC=$TMP/src
BACK=$TMP/back
MNT=$TMP/mnt
mkdir -p "$BACK"
expect_ok "sources generated" $PY "$CLIENTS" make-data "$SRC"
if [ -x "$CKPT_GEN" ]; then
    expect_ok "ckpt-gen adds a tiny checkpoint" "$CKPT_GEN" "$SRC/gen" --preset tiny --dtype bf16 --format both
else
    skip "ckpt-gen checkpoint" "$CKPT_GEN not built"
fi
"$CKPT" keygen -o "$TMP/key" >/dev/null
printf 'correct horse battery staple\n' >"$TMP/pass"
chmod 600 "$TMP/pass"

# Every storage mode, with 64K chunks so files span many chunks.
PACKS=(plain comp enc both)
expect_ok "pack plain" "$CKPT" pack "$SRC" -o "$BACK/plain.tpack" --no-compress --chunk-size 64K
expect_ok "pack comp" "$CKPT" pack "$SRC" -o "$BACK/comp.tpack" --chunk-size 64K
expect_ok "pack enc" "$CKPT" pack "$SRC" -o "$BACK/enc.tpack" --no-compress --chunk-size 64K --key-file "$TMP/key"
expect_ok "pack both" "$CKPT" pack "$SRC" -o "$BACK/both.tpack" --chunk-size 64K --key-file "$TMP/key"
expect_ok "pack dflt (1M chunks)" "$CKPT" pack "$SRC" -o "$BACK/dflt.tpack"
PACKS+=(dflt)
# Not checkpoints: must not show. (A directory is a namespace, and names
# may start with '.'.)
cp "$BACK/comp.tpack" "$BACK/comp.tpack.bak"
echo "not a pack" >"$BACK/notes.txt"
# A version-2 pack whose tensors are views inside regions (tied, at an
# offset; made by test_views.c, see there) and a version-1 pack: checked
# below, not in PACKS (their sources are not $SRC).
cp "$ROOT/fuzz/corpus/pack/v2-views.tpack" "$BACK/views.tpack"
cp "$ROOT/tests/unit/fixtures/v1-plain.tpack" "$BACK/v1.tpack"
mkdir "$BACK/.ckptfs"

if ! mount_ckptfs "$BACK" "$MNT" "$TMP/ckptfs.log" -o key_file="$TMP/key"; then
    fail "ckptfs mounts" "$(cat "$TMP/ckptfs.log")"
    finish
fi
pass "ckptfs mounts"
# The mount table names the backing directory as the source, as fstab does
# (`mount -a` compares them; test_packaging.sh mounts through fstab).
src=$(findmnt -n -o SOURCE --mountpoint "$MNT")
if [ "$src" = "$BACK" ]; then pass "the mount's source is the backing directory"; else fail "the mount's source is the backing directory" "'$src'"; fi

# ------------------------------------------------------------------ layout

listing=$(ls "$MNT" | tr '\n' ' ')
if [ "$listing" = "both comp dflt enc plain v1 views " ]; then pass "root lists one directory per pack"
else fail "root lists one directory per pack" "got: $listing"; fi
expect_absent "other files and the staging area do not show" "$MNT/comp.tpack.bak" \
    "$MNT/notes" "$MNT/notes.txt" "$MNT/.ckptfs"

# Views and version 1: every tensors/NAME holds exactly the bytes that
# `ckpt cat --tensor` gives and the manifest's sha256 names, and every file
# is byte-identical to `ckpt cat`.
for p in views v1; do
    ok=1
    for t in $($PY -c 'import json, sys; print(" ".join(t["name"] for t in json.load(open(sys.argv[1]))["tensors"]))' \
               "$MNT/$p/manifest.json"); do
        "$CKPT" cat "$BACK/$p.tpack" --tensor "$t" >"$TMP/t.bin" || ok=0
        want=$($PY -c 'import json, sys; print([t["sha256"] for t in json.load(open(sys.argv[1]))["tensors"] if t["name"] == sys.argv[2]][0])' \
               "$MNT/$p/manifest.json" "$t")
        got=$(sha256sum <"$MNT/$p/tensors/$t" | cut -d' ' -f1)
        [ "$got" = "$want" ] && cmp -s "$MNT/$p/tensors/$t" "$TMP/t.bin" || { ok=0; echo "  $p: tensors/$t differs" >&2; }
    done
    for f in $(cd "$MNT/$p" && find . -type f ! -name manifest.json ! -path './tensors/*' -printf '%P\n'); do
        "$CKPT" cat "$BACK/$p.tpack" "$f" | cmp -s - "$MNT/$p/$f" || { ok=0; echo "  $p: $f differs" >&2; }
    done
    if [ $ok = 1 ]; then pass "$p: tensors/ and files read back exactly"; else fail "$p: tensors/ and files read back exactly"; fi
done
expect_ok "views: tied views are separate files over the same bytes; versions in the manifest" $PY -c '
import json, sys
m = json.load(open(sys.argv[1] + "/views/manifest.json"))
assert m["format_version"] == 2, m
t = {x["name"]: x for x in m["tensors"]}
assert t["a"]["offset"] == t["a_tied"]["offset"] == 10 and t["b"]["offset"] == 210, t
assert t["a"]["container"] == "torch" and t["a"]["torch_dtype"] == "torch.float32", t
assert open(sys.argv[1] + "/views/tensors/a", "rb").read() == open(sys.argv[1] + "/views/m.pt", "rb").read()[10:266]
f = {x["path"]: x for x in m["files"]}
assert "stored opaque" in f["bad.safetensors"]["warning"] and f["bad.safetensors"]["container"] == "", f
assert json.load(open(sys.argv[1] + "/v1/manifest.json"))["format_version"] == 1
' "$MNT"

# shown PATH: where a packed path appears (reserved names move to .packed/).
shown() {
    case $1 in manifest.json | tensors/* | .packed/*) echo ".packed/$1" ;; *) echo "$1" ;; esac
}
FILES=$(cd "$SRC" && find . -type f -printf '%P\n' | LC_ALL=C sort)

for p in "${PACKS[@]}"; do
    bad=()
    while IFS= read -r f; do
        cmp -s "$SRC/$f" "$MNT/$p/$(shown "$f")" || bad+=("$f")
    done <<<"$FILES"
    if [ ${#bad[@]} -eq 0 ]; then pass "$p: every file byte-identical through cat"
    else fail "$p: every file byte-identical through cat" "differ: ${bad[*]:0:5}"; fi

    bad=()
    while IFS= read -r f; do
        # A writable mount shows the mode as packed (writing reopens).
        want=$(stat -c %a "$SRC/$f")
        got=$(stat -c '%a %Y %s' "$MNT/$p/$(shown "$f")")
        [ "$got" = "$want $(stat -c '%Y %s' "$SRC/$f")" ] || bad+=("$f: $got, want $want")
    done <<<"$FILES"
    if [ ${#bad[@]} -eq 0 ]; then pass "$p: modes, mtimes and sizes"
    else fail "$p: modes, mtimes and sizes" "${bad[@]:0:5}"; fi

    rm -rf "$TMP/copy"
    cp -r "$MNT/$p" "$TMP/copy"
    bad=()
    while IFS= read -r f; do
        cmp -s "$SRC/$f" "$TMP/copy/$(shown "$f")" || bad+=("$f")
    done <<<"$FILES"
    if [ ${#bad[@]} -eq 0 ]; then pass "$p: cp -r copies every file intact"
    else fail "$p: cp -r copies every file intact" "differ: ${bad[*]:0:5}"; fi

    # dd at offsets and sizes that straddle 64K chunk boundaries.
    bad=()
    for spec in "blob.bin 65530 20" "blob.bin 0 1" "blob.bin 131071 65538" "blob.bin 299990 100" \
        "big.safetensors 1 4097" "big.safetensors 4194000 300000" "big.safetensors 8388000 5000" \
        "model.safetensors 65535 2" "ints.npy 123457 98765"; do
        set -- $spec
        a=$(dd if="$SRC/$1" iflag=skip_bytes,count_bytes skip="$2" count="$3" bs=7919 2>/dev/null | sha256sum)
        b=$(dd if="$MNT/$p/$1" iflag=skip_bytes,count_bytes skip="$2" count="$3" bs=7919 2>/dev/null | sha256sum)
        [ "$a" = "$b" ] || bad+=("$spec")
    done
    if [ ${#bad[@]} -eq 0 ]; then pass "$p: dd at odd offsets and sizes across chunks"
    else fail "$p: dd at odd offsets and sizes across chunks" "${bad[@]}"; fi

    expect_ok "$p: manifest.json describes files and tensors" $PY "$CLIENTS" manifest "$MNT/$p" "$SRC" "$BACK/$p.tpack"
    expect_ok "$p: np.memmap and np.fromfile on tensors/*" $PY "$CLIENTS" tensors "$MNT/$p" "$SRC"
    expect_ok "$p: np.load(mmap_mode='r') on packed .npy" $PY "$CLIENTS" npy "$MNT/$p" "$SRC"
    expect_ok "$p: torch.from_file on BF16 tensors" $PY "$CLIENTS" torch-file "$MNT/$p" "$SRC"
    expect_ok "$p: torch.load on packed .pt files" $PY "$CLIENTS" torch-load "$MNT/$p" "$SRC"
    expect_ok "$p: safetensors read through mmap" $PY "$CLIENTS" safetensors "$MNT/$p" "$SRC"
    expect_ok "$p: random preads" $PY "$CLIENTS" random-reads "$MNT/$p" "$SRC" 300
done

# manifest.json itself: pretty-printed JSON with the pack's parameters.
expect_ok "manifest.json is pretty-printed JSON" $PY -c '
import json, sys
text = open(sys.argv[1]).read()
m = json.loads(text)
assert text.startswith("{\n  \""), "not indented"
assert m["cipher"] == sys.argv[2] and m["kdf"] == "keyfile", m
assert m["chunk_size"] == 65536 and m["format_version"] == 5 and m["codec"] == "bytegroup+zstd", m
for f in m["files"]:
    assert "container" in f and "warning" not in f, f
for t in m["tensors"]:
    assert t["container"] in ("safetensors", "npy", "torch"), t
    assert t["torch_dtype"].startswith("torch."), t
    assert t["numpy_dtype"][0] in "<|", t
    assert t.get("numpy_raw_bits", False) == (t["dtype"] in ("BF16", "F8_E5M2", "F8_E4M3")), t
' "$MNT/both/manifest.json" "$(default_cipher)"
expect_ok "packed manifest.json and tensors/ are under .packed/" \
    grep -q '"packed": "manifest"' "$MNT/comp/.packed/manifest.json"
expect_same_sha256 "packed tensors/raw.bin is under .packed/tensors/" "$SRC/tensors/raw.bin" \
    "$MNT/comp/.packed/tensors/raw.bin"
if [ -f "$MNT/comp/tensors/%2E%2E" ] && [ -f "$MNT/comp/tensors/a%2F/b" ] && [ -f "$MNT/comp/tensors/%2Flead" ] &&
    [ -f "$MNT/comp/tensors/deep/er/name" ]; then
    pass "odd tensor names are percent-escaped; '/' makes directories"
else
    fail "odd tensor names are percent-escaped; '/' makes directories" "$(ls -R "$MNT/comp/tensors" | head -20)"
fi

# --------------------------------------------------------------- xattrs

T=$MNT/comp/tensors/embed.weight
expect_ok "getfattr dtype" getfattr --only-values -n user.ckptfs.dtype "$T"
[ "$(cat "$LAST_OUT")" = BF16 ] && pass "user.ckptfs.dtype is BF16" || fail "user.ckptfs.dtype is BF16" "$(cat "$LAST_OUT")"
expect_ok "getfattr shape" getfattr --only-values -n user.ckptfs.shape "$T"
[ "$(cat "$LAST_OUT")" = "[512, 384]" ] && pass "user.ckptfs.shape is JSON style" ||
    fail "user.ckptfs.shape is JSON style" "$(cat "$LAST_OUT")"
expect_ok "getfattr sha256" getfattr --only-values -n user.ckptfs.sha256 "$T"
[ "$(cat "$LAST_OUT")" = "$(sha256sum <"$T" | cut -d' ' -f1)" ] && pass "user.ckptfs.sha256 is the tensor's digest" ||
    fail "user.ckptfs.sha256 is the tensor's digest" "$(cat "$LAST_OUT")"
expect_ok "getfattr -d lists the three attributes" getfattr -d "$T"
last_stdout_has "listxattr names them" user.ckptfs.dtype user.ckptfs.shape user.ckptfs.sha256
expect_ok "scalar shape" getfattr --only-values -n user.ckptfs.shape "$MNT/comp/tensors/scalar"
[ "$(cat "$LAST_OUT")" = "[]" ] && pass "a scalar's shape is []" || fail "a scalar's shape is []" "$(cat "$LAST_OUT")"
# Every tensor's, scalars and 1-D ones included: their value was cut to 55
# or 31 digits, then bytes past the daemon's buffer were sent.
expect_ok "user.ckptfs.sha256 is the digest of every tensor, whatever its rank" $PY - "$MNT/comp/tensors" <<'PYEOF'
import hashlib, os, sys
bad, n = [], 0
for d, _, names in os.walk(sys.argv[1]):
    for name in names:
        p = os.path.join(d, name)
        n += 1
        want = hashlib.sha256(open(p, "rb").read()).hexdigest().encode()
        got = os.getxattr(p, "user.ckptfs.sha256")
        if got != want:
            bad.append("%s: %r" % (p, got))
assert n > 10 and not bad, "%d tensors; %s" % (n, "; ".join(bad[:5]))
PYEOF
expect_fail "a missing attribute fails" getfattr -n user.ckptfs.nope "$T"
last_stderr_has "a missing attribute is ENODATA" "No such attribute"
expect_fail "plain files have no tensor attributes" getfattr -n user.ckptfs.dtype "$MNT/comp/config.json"

# ---------------------------------------------------------------- read-only

# On a writable mount a change to a pack reopens its checkpoint (late
# writes, test_write.sh); a read-only mount beside it refuses them all.
RO=$TMP/ro
if mount_ckptfs "$BACK" "$RO" "$TMP/ro.log" -o ro,key_file="$TMP/key"; then
    pass "a read-only mount beside the writable one"
    expect_fail "touch is refused" touch "$RO/comp/new"
    last_stderr_has "touch gets EROFS" "Read-only file system"
    expect_fail "mkdir is refused" mkdir "$RO/comp/newdir"
    last_stderr_has "mkdir gets EROFS" "Read-only file system"
    expect_fail "rm is refused" rm -f "$RO/plain/config.json"
    expect_same_sha256 "the pack is unchanged" "$SRC/blob.bin" "$RO/plain/blob.bin"
    expect_fail "mv is refused" mv "$RO/comp/config.json" "$RO/comp/c2.json"
    last_stderr_has "mv gets EROFS" "Read-only file system"
    expect_fail "chmod is refused" chmod 777 "$RO/comp/config.json"
    last_stderr_has "chmod gets EROFS" "Read-only file system"
    expect_fail "truncate is refused" truncate -s 0 "$RO/comp/config.json"
    expect_fail "setfattr is refused" setfattr -n user.x -v 1 "$RO/comp/tensors/${T#"$MNT/comp/tensors/"}"
    last_stderr_has "setfattr gets EROFS" "Read-only file system"
    expect_fail "ln -s is refused" ln -s x "$RO/comp/link"
    expect_fail "rmdir of a checkpoint is refused" rmdir "$RO/comp/sub/dir"
    expect_ok "python open(..., 'w') gets errno 30" $PY "$CLIENTS" erofs "$RO/comp"
    expect_same_sha256 "a refused write changed nothing" "$SRC/config.json" "$RO/comp/config.json"
    # A file open (and mapped) while its pack is replaced keeps reading the
    # generation it opened; a new open reads the new one. The read-only
    # mount used to tell the kernel to send no opens, hold no reference,
    # and answer ESTALE (SIGBUS through the mapping) after the rename.
    cp "$BACK/plain.tpack" "$BACK/gen.tpack"
    cp "$ROOT/tests/unit/fixtures/v1-plain.tpack" "$TMP/gen-next.tpack"
    expect_ok "an open file keeps its generation when the pack is replaced" $PY -c '
import hashlib, mmap, os, sys
ro, back, tmp, src = sys.argv[1:5]
f = open(os.path.join(ro, "gen/blob.bin"), "rb")
m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
head = m[:4096]
os.replace(os.path.join(tmp, "gen-next.tpack"), os.path.join(back, "gen.tpack"))
names = os.listdir(os.path.join(ro, "gen"))
assert "blob.bin" not in names, names
os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)  # what is read next comes from the daemon
want = hashlib.sha256(open(os.path.join(src, "blob.bin"), "rb").read()).hexdigest()
f.seek(0)
assert hashlib.sha256(f.read()).hexdigest() == want, "read() after the replacement"
assert hashlib.sha256(m[:]).hexdigest() == want, "the mapping after the replacement"
' "$RO" "$BACK" "$TMP" "$SRC"
    rm -f "$BACK/gen.tpack"
    # manifest.json and tensors/ tell of every file: readable by whom
    # every file is (with -o allow_other, another user), no further.
    for d in priv pub; do
        mkdir -p "$TMP/$d"
        cp "$SRC/model.safetensors" "$TMP/$d/" && echo '{}' >"$TMP/$d/config.json"
        chmod 644 "$TMP/$d/model.safetensors" "$TMP/$d/config.json"
    done
    chmod 600 "$TMP/priv/model.safetensors"
    expect_ok "pack a checkpoint with a 0600 file" "$CKPT" pack "$TMP/priv" -o "$BACK/priv.tpack"
    expect_ok "and one with 0644 files only" "$CKPT" pack "$TMP/pub" -o "$BACK/pub.tpack"
    got=$(stat -c %a "$RO/priv/manifest.json" "$RO/priv/tensors" | tr '\n' ' ')
    [ "$got" = "400 500 " ] && pass "  its manifest.json is 0400 and tensors/ 0500" ||
        fail "  its manifest.json is 0400 and tensors/ 0500" "$got"
    got=$(stat -c %a "$RO/pub/manifest.json" "$RO/pub/tensors" | tr '\n' ' ')
    [ "$got" = "444 555 " ] && pass "  where every file is readable: 0444 and 0555" ||
        fail "  where every file is readable: 0444 and 0555" "$got"
    rm -rf "$BACK/pub.tpack" "$TMP/pub"
    rm -rf "$BACK/priv.tpack" "$TMP/priv"
    unmount_ckptfs "$RO"
else
    fail "a read-only mount beside the writable one" "$(tail -3 "$TMP/ro.log")"
fi
expect_fail "the views stay read-only on the writable mount" touch "$MNT/comp/manifest.json"

# ------------------------------------------------------------- concurrency

expect_ok "8 processes reading the same and different tensors" $PY "$CLIENTS" concurrent "$MNT/both" "$SRC" 8
pids=()
for p in plain comp enc both dflt; do
    for f in big.safetensors blob.bin; do
        (cmp -s "$SRC/$f" "$MNT/$p/$f" || echo "$p/$f" >>"$TMP/conc.bad") &
        pids+=($!)
    done
done
wait "${pids[@]}"
if [ ! -s "$TMP/conc.bad" ]; then pass "10 cmp processes over 5 packs at once"
else fail "10 cmp processes over 5 packs at once" "$(cat "$TMP/conc.bad")"; fi

# A second read is answered from the kernel page cache.
cat "$MNT/comp/big.safetensors" >/dev/null
expect_same_sha256 "re-read through the page cache is intact" "$SRC/big.safetensors" "$MNT/comp/big.safetensors"

# The one line the rm above earns is expected, and the one saying it mounted.
if grep -v -e "only hides them" -e "^ckptfs: mounted " "$TMP/ckptfs.log" | grep -q .; then
    fail "no log lines while everything is healthy" "$(head -5 "$TMP/ckptfs.log")"
else pass "no log lines while everything is healthy"; fi
if unmount_ckptfs "$MNT"; then pass "unmount ends the daemon with status 0"
else fail "unmount ends the daemon with status 0" "$(tail -3 "$TMP/ckptfs.log")"; fi
expect_ok "nothing is left mounted" bash -c "! mountpoint -q '$MNT'"

# ------------------------------------------------------------- cache bound

# 64 MiB of data through an 8M cache: the daemon must stay near its bound.
mkdir -p "$TMP/bigsrc" "$TMP/bigback"
head -c $((64 << 20)) /dev/urandom >"$TMP/bigsrc/random.bin"
$PY -c 'import numpy as np, sys; np.save(sys.argv[1], np.linspace(0, 1, 8 << 20, dtype=np.float32))' "$TMP/bigsrc/ramp.npy"
"$CKPT" pack "$TMP/bigsrc" -o "$TMP/bigback/big.tpack" --key-file "$TMP/key" >/dev/null
if mount_ckptfs "$TMP/bigback" "$MNT" "$TMP/big.log" -o key_file="$TMP/key",cache_size=8M,threads=2; then
    expect_same_sha256 "64 MiB file through an 8M cache" "$TMP/bigsrc/random.bin" "$MNT/big/random.bin"
    expect_same_sha256 "32 MiB tensor file through an 8M cache" "$TMP/bigsrc/ramp.npy" "$MNT/big/ramp.npy"
    hwm=$(awk '/VmHWM/ {print $2}' "/proc/${DAEMON_OF[$MNT]}/status")
    # 8M of cache plus libraries, threads and one read's chunks in flight.
    if [ "$hwm" -lt $((40 << 10)) ]; then pass "daemon peak memory ${hwm} KiB stays within cache + constant"
    else fail "daemon peak memory stays within cache + constant" "VmHWM ${hwm} KiB"; fi
    unmount_ckptfs "$MNT"
else
    fail "mount with cache_size=8M" "$(cat "$TMP/big.log")"
fi

# ----------------------------------------------------------------- options

expect_ok "--help" "$CKPTFS" --help
last_stdout_has "--help describes the options" "BACKING_DIR MOUNTPOINT" key_file passphrase_file cache_size threads
# It said "Committed checkpoints are read-only" (writing reopens them) and
# "K/M/G" (T is taken too), and left -r out.
last_stdout_has "--help: writing reopens a committed checkpoint; T sizes; -r" "writing into it reopens it" "K/M/G/T" "-o ro, -r"
if grep -q "Committed checkpoints are read-only" "$LAST_OUT"; then fail "--help claims committed checkpoints are read-only"; else pass "--help does not claim committed checkpoints are read-only"; fi
expect_ok "--version" "$CKPTFS" --version
last_stdout_has "--version names the version" "ckptfs 0."
expect_exit "no arguments is a usage error" 2 "$CKPTFS"
last_stderr_has "no arguments says what is missing" "BACKING_DIR"
expect_exit "one argument is a usage error" 2 "$CKPTFS" "$BACK"
expect_exit "three arguments is a usage error" 2 "$CKPTFS" "$BACK" "$MNT" extra
expect_exit "bad cache_size is a usage error" 2 "$CKPTFS" -o cache_size=lots "$BACK" "$MNT"
last_stderr_has "bad cache_size is named" "cache_size" "lots"
expect_exit "cache_size below 1M is refused" 2 "$CKPTFS" -o cache_size=10K "$BACK" "$MNT"
expect_exit "bad threads is a usage error" 2 "$CKPTFS" -o threads=0 "$BACK" "$MNT"
last_stderr_has "bad threads is named" "threads"
expect_exit "unknown option is a usage error" 2 "$CKPTFS" -o no_such_option "$BACK" "$MNT"
expect_exit "an unknown option is named before the backing directory is opened" 2 \
    "$CKPTFS" -f -o no_such_option "$TMP/nope" "$MNT"
last_stderr_has "the unknown option is named" "no_such_option"
expect_exit "key_file with passphrase_file is a usage error" 2 \
    "$CKPTFS" -o key_file="$TMP/key",passphrase_file="$TMP/pass" "$BACK" "$MNT"
expect_exit "a missing key file fails before mounting" 1 "$CKPTFS" -f -o key_file="$TMP/nokey" "$BACK" "$MNT"
last_stderr_has "the key error names the file" "nokey"
chmod 644 "$TMP/key"
expect_exit "a world-readable key file is refused" 1 "$CKPTFS" -f -o key_file="$TMP/key" "$BACK" "$MNT"
chmod 600 "$TMP/key"
if [ "$(id -u)" = 0 ] && id nobody >/dev/null 2>&1; then
    chown nobody "$TMP/key"
    expect_exit "a key file another user owns is refused" 1 "$CKPTFS" -f -o key_file="$TMP/key" "$BACK" "$MNT"
    last_stderr_has "  naming the file and its owner" "$TMP/key" "owned by nobody"
    chown 0 "$TMP/key"
else
    skip "a key file another user owns is refused" "needs root and a user nobody"
fi
expect_exit "a missing backing directory fails" 1 "$CKPTFS" -f "$TMP/nope" "$MNT"
last_stderr_has "the backing error names the directory" "$TMP/nope"
expect_ok "no mount was left by the failures" bash -c "! mountpoint -q '$MNT'"
expect_ok "ro with a write-side option mounts" "$CKPTFS" -o ro,commit_delay=5 "$BACK" "$MNT"
last_stderr_has "ro says the write-side option does nothing" "commit_delay does nothing on a read-only mount"
mountpoint -q "$MNT" && fusermount3 -u "$MNT"

# ------------------------------------------------------------- daemon mode

"$CKPT" pack "$SRC" -o "$BACK/pp.tpack" --passphrase-file "$TMP/pass" --chunk-size 64K >/dev/null
expect_ok "daemon mode: starts and returns" "$CKPTFS" -o passphrase_file="$TMP/pass" "$BACK" "$MNT"
if mountpoint -q "$MNT"; then
    pass "daemon mode: mounted"
    expect_same_sha256 "daemon mode: passphrase pack reads" "$SRC/big.safetensors" "$MNT/pp/big.safetensors"
    pid=$(ps -eo pid=,args= | awk -v m="$MNT" '$2 ~ /ckptfs$/ && index($0, m) {print $1}' | head -n 1)
    if [ -n "$pid" ] && grep -Eq '^Max core file size +0 +0' "/proc/$pid/limits"; then
        pass "daemon mode: core dumps are off while a key is loaded"
    else
        fail "daemon mode: core dumps are off while a key is loaded" "pid '$pid'"
    fi
    fusermount3 -u "$MNT"
    for _ in $(seq 100); do [ -n "$pid" ] && [ -d "/proc/$pid" ] || break; sleep 0.05; done
    if [ -z "$pid" ] || [ ! -d "/proc/$pid" ]; then pass "daemon mode: exits at unmount"
    else fail "daemon mode: exits at unmount" "pid $pid still running"; kill "$pid"; fi
else
    fail "daemon mode: mounted"
fi

finish
