#!/usr/bin/env bash
# End to end tests of the `ckpt` command, run against the real binaries:
# round trips in every storage mode, listings, cat, keys and usage errors,
# then damaged and hostile input, each of which must fail with a message
# that names the file and the fault.
. "$(dirname "$0")/lib.sh"

if [ ! -x "$CKPT" ] || [ ! -x "$CKPT_GEN" ]; then
    fail "binaries built" "$CKPT or $CKPT_GEN is missing; run make first"
    finish
fi
cd "$TMP" || exit 1

# Flips the low bit of the byte at OFFSET (negative: from the end) in place.
flip_bit() {
    $PY - "$1" "$2" <<'EOF'
import sys
path, off = sys.argv[1], int(sys.argv[2])
with open(path, 'r+b') as f:
    f.seek(off, 0 if off >= 0 else 2)
    pos = f.tell()
    b = f.read(1)
    f.seek(pos)
    f.write(bytes([b[0] ^ 1]))
EOF
}

# Where SRC_FILE's bytes [OFF, OFF+4096) sit inside an uncompressed,
# unencrypted pack; prints the offset.
find_in_pack() {
    $PY - "$1" "$2" "$3" <<'EOF'
import sys
pack, src, off = open(sys.argv[1], 'rb').read(), open(sys.argv[2], 'rb').read(), int(sys.argv[3])
pos = pack.find(src[off:off + 4096])
assert pos >= 0, "bytes not found in the pack"
print(pos)
EOF
}

# Writes the bytes of one tensor of a safetensors file to OUT and prints its
# name: the reference that `ckpt cat --tensor` must match.
extract_tensor() {
    $PY - "$1" "$2" <<'EOF'
import json, struct, sys
with open(sys.argv[1], 'rb') as f:
    n = struct.unpack('<Q', f.read(8))[0]
    header = json.loads(f.read(n))
    names = sorted(k for k in header if k != '__metadata__')
    name = names[len(names) // 2]
    start, end = header[name]['data_offsets']
    f.seek(8 + n + start)
    open(sys.argv[2], 'wb').write(f.read(end - start))
print(name)
EOF
}

# ------------------------------------------------------------------ inputs

SRC=$TMP/src
mkdir -p "$SRC/sub/deeper"
expect_ok "ckpt-gen makes a tiny checkpoint" "$CKPT_GEN" "$SRC/model" --preset tiny
$PY -c 'import numpy as np, sys; np.save(sys.argv[1], np.arange(60000, dtype=np.float32).reshape(200, 300))' \
    "$SRC/sub/arr.npy"
: >"$SRC/empty.txt"
: >"$SRC/sub/deeper/empty2"
head -c 300000 /dev/urandom >"$SRC/sub/random.bin"
printf 'the quick brown tpack jumps over the lazy index\n' >"$SRC/sub/deeper/hello.txt"
chmod 0755 "$SRC/sub/random.bin"
chmod 0600 "$SRC/sub/deeper/hello.txt"
chmod 0444 "$SRC/empty.txt"
touch -d '2001-02-03 04:05:06.123456789' "$SRC/sub/deeper/hello.txt"
ST=$(find "$SRC" -name '*.safetensors' | LC_ALL=C sort | head -n 1)
NFILES=$(find "$SRC" -type f | wc -l)
if [ -z "$ST" ]; then
    fail "ckpt-gen wrote a .safetensors file"
    finish
fi

"$CKPT" keygen -o "$TMP/key" >/dev/null
"$CKPT" keygen -o "$TMP/key2" >/dev/null
printf 'correct horse battery staple\n' >"$TMP/pass"
chmod 600 "$TMP/pass"

SUMMARY_RE='^packed [0-9]+ files?, [0-9]+ tensors?: [0-9.]+ [kMGT]?B -> [0-9.]+ [kMGT]?B \(ratio [0-9]+\.[0-9]{3}\) in [0-9.]+ s, [0-9.]+ MB/s$'

# ------------------------------------------------------------- round trips

# roundtrip NAME [pack options...]; $KEYS (an array) is given to every command.
KEYS=()
roundtrip() {
    local name=$1
    shift
    local p=$TMP/$name.tpack out=$TMP/$name.out
    expect_ok "$name: pack" "$CKPT" pack "$SRC" -o "$p" ${KEYS[@]+"${KEYS[@]}"} "$@"
    last_stdout_matches "$name: pack prints a summary line" "$SUMMARY_RE"
    expect_absent "$name: no temporary file is left" "$p.tmp"
    expect_ok "$name: verify" "$CKPT" verify "$p" ${KEYS[@]+"${KEYS[@]}"}
    last_stdout_matches "$name: verify says OK" "^OK: $NFILES files, [0-9]+ tensors, [0-9]+ chunks verified$"
    expect_ok "$name: unpack" "$CKPT" unpack "$p" -o "$out" ${KEYS[@]+"${KEYS[@]}"}
    last_stdout_matches "$name: unpack prints a summary" "^unpacked $NFILES files .* MB/s$"
    expect_same_tree "$name: unpacked tree equals the source (bytes, modes, mtimes)" "$SRC" "$out"
    rm -rf "$out"
}

roundtrip default
roundtrip stored --no-compress
roundtrip level9-64k --level 9 --chunk-size 64K
roundtrip chunk16m --chunk-size 16M --threads 1
KEYS=(--key-file "$TMP/key")
roundtrip xchacha --cipher xchacha20poly1305
run_cmd "$CKPT" pack "$SRC" -o "$TMP/aesprobe.tpack" --key-file "$TMP/key" --cipher aes256gcm
if [ "$LAST_RC" -eq 0 ]; then
    rm -f "$TMP/aesprobe.tpack"
    roundtrip aes256gcm --cipher aes256gcm --chunk-size 64K
elif grep -q 'not available' "$LAST_ERR"; then
    skip "aes256gcm round trip" "$(head -n 1 "$LAST_ERR")"
else
    fail "aes256gcm pack" "$(head -n 1 "$LAST_ERR")"
fi
KEYS=(--passphrase-file "$TMP/pass")
roundtrip passphrase
KEYS=()
expect_ok "info on a pack with a key and no --cipher" "$CKPT" info "$TMP/passphrase.tpack"
last_stdout_has "it has the default cipher for this CPU" "cipher:       $(default_cipher)"

# What the key protects must not be readable without it.
if grep -q 'quick brown tpack' "$TMP/stored.tpack" && ! grep -q 'quick brown tpack' "$TMP/xchacha.tpack"; then
    pass "encryption hides file contents that a stored pack shows"
else
    fail "encryption hides file contents that a stored pack shows"
fi

expect_ok "single file: pack" "$CKPT" pack "$ST" -o "$TMP/single.tpack"
last_stdout_matches "single file: one file packed" '^packed 1 file, [0-9]+ tensors?:'
expect_ok "single file: ls" "$CKPT" ls "$TMP/single.tpack"
last_stdout_matches "single file: stored under its base name" "  $(basename "$ST")\$"
expect_ok "single file: unpack" "$CKPT" unpack "$TMP/single.tpack" -o "$TMP/single.out"
expect_same_sha256 "single file: bytes equal" "$ST" "$TMP/single.out/$(basename "$ST")"

# With 3 cores or more, files of more than one chunk are decoded straight
# into a mapping of the output (with fewer they are written with pwrite):
# a full file system must still be a write error naming the file, never a
# SIGBUS, and leave no partial file, at any thread count.
mkdir -p "$TMP/nospace.src" "$TMP/nospace"
head -c 12582912 /dev/urandom >"$TMP/nospace.src/big.bin"
expect_ok "a 12 MiB file: pack" "$CKPT" pack "$TMP/nospace.src" -o "$TMP/nospace.tpack"
if mount -t tmpfs -o size=4m tmpfs "$TMP/nospace" 2>/dev/null; then
    for map in 0 1; do
        for t in 1 2 16; do
            expect_exit "unpack onto a full tmpfs, $t threads, CKPT_UNPACK_MAP=$map: exit 1" 1 \
                env CKPT_UNPACK_MAP=$map "$CKPT" unpack "$TMP/nospace.tpack" -o "$TMP/nospace/out" --threads "$t"
            last_stderr_has "  it says so and names the file" "nospace/out/big.bin: write failed: No space left on device"
            expect_absent "  the partial file is removed" "$TMP/nospace/out/big.bin"
        done
    done
    umount "$TMP/nospace"
else
    skip "unpack onto a full tmpfs" "cannot mount a tmpfs (needs root)"
fi
for t in 1 2 16; do
    expect_ok "unpack a multi-chunk file, $t threads" "$CKPT" unpack "$TMP/nospace.tpack" -o "$TMP/nospace.t$t" --threads "$t"
    expect_same_sha256 "  bytes equal" "$TMP/nospace.src/big.bin" "$TMP/nospace.t$t/big.bin"
    expect_ok "  through a mapping (CKPT_UNPACK_MAP=1)" env CKPT_UNPACK_MAP=1 "$CKPT" unpack "$TMP/nospace.tpack" -o "$TMP/nospace.m$t" --threads "$t"
    expect_same_sha256 "  bytes equal" "$TMP/nospace.src/big.bin" "$TMP/nospace.m$t/big.bin"
    # cat's workers decode ahead of it in a window of 2 chunks per worker
    # + 2: at 2 threads 12 chunks fill it, so workers wait for the writer
    # to free a slot, and one is woken for each.
    "$CKPT" cat "$TMP/nospace.tpack" big.bin --threads "$t" >"$TMP/nospace.cat"
    expect_same_sha256 "  cat --threads $t: bytes equal" "$TMP/nospace.src/big.bin" "$TMP/nospace.cat"
done
expect_exit "CKPT_UNPACK_MAP=yes: refused" 2 env CKPT_UNPACK_MAP=yes "$CKPT" unpack "$TMP/nospace.tpack" -o "$TMP/nospace.bad"
last_stderr_has "  it says what it wants" "CKPT_UNPACK_MAP='yes': want 0 (pwrite) or 1 (a mapping)"

# A pack is data: unpacking must not recreate setuid or setgid programs.
mkdir -p "$TMP/suid"
printf '#!/bin/sh\n' >"$TMP/suid/tool"
chmod 6755 "$TMP/suid/tool"
"$CKPT" pack "$TMP/suid" -o "$TMP/suid.tpack" >/dev/null
expect_ok "setuid file: unpack" "$CKPT" unpack "$TMP/suid.tpack" -o "$TMP/suid.out"
if [ "$(stat -c %a "$TMP/suid.out/tool")" = 755 ]; then pass "setuid file: set-id bits dropped on unpack"
else fail "setuid file: set-id bits dropped on unpack" "mode $(stat -c %a "$TMP/suid.out/tool")"; fi

# Options may come before or after the positional arguments.
expect_ok "options after positionals" "$CKPT" ls "$TMP/default.tpack" --tensors
expect_ok "options before positionals" "$CKPT" ls --tensors "$TMP/default.tpack"

expect_exit "pack refuses to replace an existing pack" 1 "$CKPT" pack "$SRC" -o "$TMP/default.tpack"
last_stderr_has "pack refusal names the pack and suggests --force" "$TMP/default.tpack" "already exists" "--force"
expect_ok "pack --force replaces it" "$CKPT" pack "$SRC" -o "$TMP/default.tpack" --force
mkdir -p "$TMP/again"
echo keep >"$TMP/again/empty.txt"
expect_exit "unpack refuses to overwrite files" 1 "$CKPT" unpack "$TMP/default.tpack" -o "$TMP/again"
last_stderr_has "unpack refusal names the file" "empty.txt" "already exists"
if [ "$(cat "$TMP/again/empty.txt")" = keep ] && [ ! -e "$TMP/again/sub" ]; then
    pass "a refused unpack writes nothing"
else
    fail "a refused unpack writes nothing"
fi
expect_ok "unpack --force overwrites" "$CKPT" unpack "$TMP/default.tpack" -o "$TMP/again" --force
expect_same_tree "unpack --force result equals the source" "$SRC" "$TMP/again"

# A name of NAME_MAX (255) bytes: its temporary file, NAME.tmp, would be
# over it, so a shortened name with a hash is written and renamed.
LONG=$(printf 'l%.0s' $(seq 249)).tpack
mkdir "$TMP/long"
expect_ok "pack -o a 255-byte name" "$CKPT" pack "$SRC" -o "$TMP/long/$LONG"
[ "$(ls -A "$TMP/long")" = "$LONG" ] && pass "  the pack, and no temporary file, is there" ||
    fail "  the pack, and no temporary file, is there" "$(ls -A "$TMP/long" | cut -c1-40)"
expect_ok "  it unpacks" "$CKPT" unpack "$TMP/long/$LONG" -o "$TMP/long.out"
expect_same_tree "  to the source" "$SRC" "$TMP/long.out"
expect_ok "  and is replaced with --force" "$CKPT" pack "$SRC" -o "$TMP/long/$LONG" --force

# --------------------------------------------------------------- listings

expect_ok "ls" "$CKPT" ls "$TMP/default.tpack"
last_stdout_has "ls shows every kind of file" "sub/deeper/hello.txt" "sub/arr.npy" "empty.txt" \
    "${ST#"$SRC"/}"
last_stdout_matches "ls shows size and mode" '^ +300000  0755  sub/random\.bin$'
TNAME=$(extract_tensor "$ST" "$TMP/tensor.ref")
expect_ok "ls --tensors" "$CKPT" ls --tensors "$TMP/default.tpack"
last_stdout_has "ls --tensors shows a safetensors tensor" "$TNAME"
last_stdout_matches "ls --tensors shows the npy array" '^F32 +\[200, 300\] +240000  '
expect_ok "ls -l" "$CKPT" ls -l "$TMP/xchacha.tpack" --key-file "$TMP/key"
last_stdout_has "ls -l shows how the pack is stored" "xchacha20poly1305" "chunk size"
expect_ok "info without a key shows the header" "$CKPT" info "$TMP/xchacha.tpack"
last_stdout_has "info names the cipher" "xchacha20poly1305"
expect_ok "ls --json" "$CKPT" ls --json "$TMP/xchacha.tpack" --key-file "$TMP/key"
cp "$LAST_OUT" "$TMP/ls.json"
expect_ok "ls --json is valid JSON" $PY -c 'import json,sys; json.load(sys.stdin)' <"$TMP/ls.json"
# The listing must describe the source exactly: every file with its size,
# mode and digest, every tensor with the fields callers rely on.
expect_ok "ls --json matches the source files" $PY - "$TMP/ls.json" "$SRC" <<'EOF'
import hashlib, json, os, sys
doc, src = json.load(open(sys.argv[1])), sys.argv[2]
files = {f['path']: f for f in doc['files']}
on_disk = {os.path.relpath(os.path.join(d, n), src) for d, _, ns in os.walk(src) for n in ns}
assert set(files) == on_disk, (set(files) ^ on_disk)
for path, f in files.items():
    full = os.path.join(src, path)
    st = os.stat(full)
    assert f['size'] == st.st_size, path
    assert f['mode'] == st.st_mode & 0o7777, path
    assert f['mtime'] == int(st.st_mtime), path
    assert f['sha256'] == hashlib.sha256(open(full, 'rb').read()).hexdigest(), path
assert doc['pack']['cipher'] == 'xchacha20poly1305'
assert doc['tensors'], 'no tensors'
for t in doc['tensors']:
    assert set(t) >= {'name', 'dtype', 'shape', 'nbytes', 'file', 'offset', 'sha256'}, t
    data = open(os.path.join(src, t['file']), 'rb').read()[t['offset']:t['offset'] + t['nbytes']]
    assert len(data) == t['nbytes'] and hashlib.sha256(data).hexdigest() == t['sha256'], t['name']
EOF

# -------------------------------------------------------------------- cat

"$CKPT" cat "$TMP/default.tpack" sub/random.bin >"$TMP/cat.out"
expect_same_sha256 "cat of a file equals the original" "$SRC/sub/random.bin" "$TMP/cat.out"
"$CKPT" cat "$TMP/xchacha.tpack" "${ST#"$SRC"/}" --key-file "$TMP/key" >"$TMP/cat.out"
expect_same_sha256 "cat from an encrypted pack equals the original" "$ST" "$TMP/cat.out"
"$CKPT" cat "$TMP/level9-64k.tpack" --tensor "$TNAME" >"$TMP/tensor.out"
expect_same_sha256 "cat --tensor equals the tensor's bytes in the safetensors file" \
    "$TMP/tensor.ref" "$TMP/tensor.out"
"$CKPT" cat "$TMP/default.tpack" empty.txt >"$TMP/cat.out"
expect_same_sha256 "cat of an empty file is empty" "$SRC/empty.txt" "$TMP/cat.out"
expect_exit "cat of a missing path fails" 1 "$CKPT" cat "$TMP/default.tpack" no/such/file
last_stderr_has "cat names the missing path" "no/such/file"
expect_exit "cat of a missing tensor fails" 1 "$CKPT" cat "$TMP/default.tpack" --tensor no.such.tensor
last_stderr_has "cat names the missing tensor" "no.such.tensor"

# ------------------------------------------------------------------- keys

expect_ok "keygen" "$CKPT" keygen -o "$TMP/k3"
if [ "$(stat -c '%a %s' "$TMP/k3")" = "600 32" ]; then pass "keygen writes 32 bytes with mode 0600"
else fail "keygen writes 32 bytes with mode 0600" "got $(stat -c '%a %s' "$TMP/k3")"; fi
before=$(sha256sum <"$TMP/k3")
expect_exit "keygen refuses to overwrite" 1 "$CKPT" keygen -o "$TMP/k3"
last_stderr_has "keygen refusal names the file" "$TMP/k3"
[ "$(sha256sum <"$TMP/k3")" = "$before" ] && pass "refused keygen leaves the key alone" ||
    fail "refused keygen leaves the key alone"
expect_exit "keygen without -o is a usage error" 2 "$CKPT" keygen
"$CKPT" ls -l --key-file "$TMP/key" "$TMP/xchacha.tpack" >"$TMP/ls-l.out" 2>&1
"$CKPT" ls --json --key-file "$TMP/key" "$TMP/xchacha.tpack" >>"$TMP/ls-l.out" 2>&1
expect_ok "the key appears neither in the pack nor in listings" $PY - "$TMP/key" "$TMP/xchacha.tpack" \
    "$TMP/ls-l.out" <<'EOF'
import sys
key = open(sys.argv[1], 'rb').read()
for path in sys.argv[2:]:
    data = open(path, 'rb').read()
    assert key not in data and key.hex().encode() not in data, path
EOF

# ------------------------------------------------------------ usage errors

# usage NAME ARGS...: exit status 2 and a pointer at the help.
usage() {
    local name=$1
    shift
    expect_exit "usage error: $name" 2 "$CKPT" "$@"
    last_stderr_has "usage error explains and hints: $name" "ckpt --help"
}
usage "no command"
usage "unknown command" frobnicate
usage "unknown option" pack "$SRC" -o "$TMP/u.tpack" --bogus
usage "missing SRC" pack -o "$TMP/u.tpack"
usage "missing -o" pack "$SRC"
usage "-o without a value" pack "$SRC" -o
usage "an empty -o to pack" pack "$SRC" -o ""
usage "ls --json with --tensors" ls --json --tensors "$TMP/default.tpack"
usage "ls --json with -l" ls --json -l "$TMP/default.tpack"
usage "status --interval without --watch" status "$TMP" --interval 2
usage "an empty -o to unpack" unpack "$TMP/default.tpack" -o ""
usage "chunk size not a power of two" pack "$SRC" -o "$TMP/u.tpack" --chunk-size 3M
usage "chunk size too small" pack "$SRC" -o "$TMP/u.tpack" --chunk-size 32K
usage "chunk size too large" pack "$SRC" -o "$TMP/u.tpack" --chunk-size 32M
usage "chunk size not a number" pack "$SRC" -o "$TMP/u.tpack" --chunk-size lots
usage "level 0" pack "$SRC" -o "$TMP/u.tpack" --level 0
usage "level 10" pack "$SRC" -o "$TMP/u.tpack" --level 10
usage "--level with --no-compress" pack "$SRC" -o "$TMP/u.tpack" --level 3 --no-compress
usage "--cipher without a key" pack "$SRC" -o "$TMP/u.tpack" --cipher xchacha20poly1305
usage "unknown cipher" pack "$SRC" -o "$TMP/u.tpack" --key-file "$TMP/key" --cipher rot13
usage "two kinds of key" ls "$TMP/xchacha.tpack" --key-file "$TMP/key" --passphrase-file "$TMP/pass"
usage "bad --threads" unpack "$TMP/default.tpack" -o "$TMP/u" --threads many
usage "unpack without -o" unpack "$TMP/default.tpack"
usage "cat without a path" cat "$TMP/default.tpack"
usage "verify with two packs" verify "$TMP/default.tpack" "$TMP/stored.tpack"
usage "ls option on verify" verify "$TMP/default.tpack" --tensors
expect_absent "usage errors write nothing" "$TMP/u.tpack" "$TMP/u.tpack.tmp" "$TMP/u"
expect_ok "--help" "$CKPT" --help
last_stdout_has "--help lists the commands" pack unpack ls cat verify keygen
expect_ok "pack --help" "$CKPT" pack --help
last_stdout_has "pack --help shows its usage" "usage: ckpt pack" "--chunk-size"
# Late writes reopen a committed checkpoint and stop a packing one (README,
# ckptfs(8)): the helps said "becomes read-only" and "read-only meanwhile".
expect_ok "commit --help" "$CKPT" commit --help
last_stdout_has "commit --help: writing reopens a committed checkpoint" "reopens it"
expect_ok "status --help" "$CKPT" status --help
last_stdout_has "status --help: a write stops the packing" "a write into it stops the"
if grep -q "read-only" "$LAST_OUT"; then fail "status --help claims read-only"; else pass "status --help claims no read-only"; fi
expect_ok "ls --help" "$CKPT" ls --help
last_stdout_has "ls --help names --long and the manifest's fields" "-l, --long" "container"
expect_ok "--version" "$CKPT" --version
last_stdout_matches "--version names the format" '^ckpt [0-9]+\.[0-9]+\.[0-9]+ \(format [0-9]+\)$'

# -------------------------------------------------------------- bad input

# A small pack whose chunks can be found and damaged: stored raw, 64 KiB
# chunks, a.bin (4 chunks) before b.bin.
BAD=$TMP/badsrc
mkdir -p "$BAD"
head -c 262144 /dev/urandom >"$BAD/a.bin"
head -c 100000 /dev/urandom >"$BAD/b.bin"
"$CKPT" pack "$BAD" -o "$TMP/raw.tpack" --no-compress --chunk-size 64K >/dev/null
"$CKPT" pack "$BAD" -o "$TMP/enc.tpack" --no-compress --chunk-size 64K --key-file "$TMP/key" >/dev/null

# damaged NAME COPY_FROM: a fresh copy to break, in $P.
damaged() { P=$TMP/$1.tpack; cp "$2" "$P"; }

damaged truncated "$TMP/raw.tpack"
truncate -s 100 "$P"
expect_fail "truncated to 100 bytes: rejected" "$CKPT" ls "$P"
last_stderr_has "truncated to 100 bytes: names the file and the fault" "$P" "truncated"
damaged cut "$TMP/raw.tpack"
truncate -s $(( $(stat -c %s "$P") / 2 )) "$P"
expect_fail "cut in half: rejected" "$CKPT" verify "$P"
last_stderr_has "cut in half: names the file and the fault" "$P" "truncated"

damaged magic "$TMP/raw.tpack"
printf 'XXXX' | dd of="$P" bs=1 seek=0 conv=notrunc status=none
expect_fail "bad magic: rejected" "$CKPT" ls "$P"
last_stderr_has "bad magic: names the file and the fault" "$P" "magic"

damaged version "$TMP/raw.tpack"
# The header is 8 magic bytes, then the format version as a u32 LE.
printf '\143\000\000\000' | dd of="$P" bs=1 seek=8 conv=notrunc status=none
expect_fail "unknown version: rejected" "$CKPT" ls "$P"
last_stderr_has "unknown version: names the file and the version" "$P" "version 99"

damaged header "$TMP/raw.tpack"
flip_bit "$P" 20
expect_fail "flipped bit in the header: rejected" "$CKPT" ls "$P"
last_stderr_has "flipped bit in the header: names the file and the fault" "$P" "header"

# The index starts where the u64 LE at the start of the 64-byte footer says.
damaged index "$TMP/raw.tpack"
idx=$($PY -c 'import struct,sys; d=open(sys.argv[1],"rb").read(); print(struct.unpack("<Q", d[-64:-56])[0])' "$P")
flip_bit "$P" $((idx + 40))
expect_fail "flipped bit in the index: rejected" "$CKPT" ls "$P"
last_stderr_has "flipped bit in the index: names the file and the fault" "$P" "index"
damaged index-enc "$TMP/enc.tpack"
idx=$($PY -c 'import struct,sys; d=open(sys.argv[1],"rb").read(); print(struct.unpack("<Q", d[-64:-56])[0])' "$P")
flip_bit "$P" $((idx + 40))
expect_fail "flipped bit in an encrypted index: rejected" "$CKPT" ls "$P" --key-file "$TMP/key"
last_stderr_has "flipped bit in an encrypted index: names the file and the fault" "$P" "index"

damaged chunk "$TMP/raw.tpack"
at=$(find_in_pack "$P" "$BAD/a.bin" 131072)
flip_bit "$P" $((at + 100))
expect_exit "flipped bit in a chunk: verify exits 1" 1 "$CKPT" verify "$P"
last_stdout_has "flipped bit in a chunk: verify names the file, chunk, offset and fault" \
    "$P: chunk 2 " "file 'a.bin' at offset 131072" "checksum mismatch" "FAILED: "
"$CKPT" cat "$P" b.bin >"$TMP/b.out"
expect_same_sha256 "flipped bit in a chunk: other files still read" "$BAD/b.bin" "$TMP/b.out"
expect_exit "flipped bit in a chunk: cat of that file fails" 1 "$CKPT" cat "$P" a.bin
last_stderr_has "flipped bit in a chunk: cat names the file and the fault" "$P" "a.bin" "checksum"
expect_exit "flipped bit in a chunk: unpack fails" 1 "$CKPT" unpack "$P" -o "$TMP/chunk.out"
last_stderr_has "flipped bit in a chunk: unpack names the file" "a.bin"
expect_absent "flipped bit in a chunk: no half-written file" "$TMP/chunk.out/a.bin"
expect_same_sha256 "flipped bit in a chunk: the intact file is unpacked" "$BAD/b.bin" "$TMP/chunk.out/b.bin"

damaged chunk-enc "$TMP/enc.tpack"
# Chunk 0 of a.bin follows the 128-byte header.
flip_bit "$P" 1000
expect_exit "flipped bit in an encrypted chunk: verify exits 1" 1 "$CKPT" verify "$P" --key-file "$TMP/key"
last_stdout_has "flipped bit in an encrypted chunk: verify names the file and the fault" \
    "$P: chunk 0 " "file 'a.bin' at offset 0" "authentication failed"
"$CKPT" cat "$P" b.bin --key-file "$TMP/key" >"$TMP/b.out"
expect_same_sha256 "flipped bit in an encrypted chunk: other files still read" "$BAD/b.bin" "$TMP/b.out"

expect_exit "wrong key: rejected" 1 "$CKPT" ls "$TMP/enc.tpack" --key-file "$TMP/key2"
last_stderr_has "wrong key: names the file and the fault" "$TMP/enc.tpack" "wrong key"
expect_exit "missing key: rejected" 1 "$CKPT" verify "$TMP/enc.tpack"
last_stderr_has "missing key: names the file and the fault" "$TMP/enc.tpack" "no key"
printf 'incorrect horse battery staple\n' >"$TMP/pass2"
chmod 600 "$TMP/pass2"
expect_exit "wrong passphrase: rejected" 1 "$CKPT" ls "$TMP/passphrase.tpack" --passphrase-file "$TMP/pass2"
last_stderr_has "wrong passphrase: names the file and the fault" "$TMP/passphrase.tpack" "wrong key"
chmod 644 "$TMP/key2"
expect_exit "world-readable key file: refused" 1 "$CKPT" ls "$TMP/enc.tpack" --key-file "$TMP/key2"
last_stderr_has "world-readable key file: names the key file" "$TMP/key2"
# A secret file someone else owns is refused even at mode 0600, as ssh
# refuses such a config: its owner could swap in a key they know. Root's
# own files are accepted, and a user's own key works for that user.
if [ "$(id -u)" = 0 ] && id nobody >/dev/null 2>&1; then
    cp "$TMP/key" "$TMP/key.nobody"
    cp "$TMP/pass" "$TMP/pass.nobody"
    chmod 600 "$TMP/key.nobody" "$TMP/pass.nobody"
    chown nobody "$TMP/key.nobody" "$TMP/pass.nobody"
    expect_exit "a key file owned by another user (0600): refused" 1 \
        "$CKPT" ls "$TMP/xchacha.tpack" --key-file "$TMP/key.nobody"
    last_stderr_has "  naming the file and its owner" "$TMP/key.nobody" "owned by nobody (uid $(id -u nobody))"
    expect_exit "a passphrase file owned by another user: refused" 1 \
        "$CKPT" ls "$TMP/passphrase.tpack" --passphrase-file "$TMP/pass.nobody"
    last_stderr_has "  naming the file and its owner" "$TMP/pass.nobody" "owned by nobody"
    # The same key and pack, read by nobody itself.
    mkdir -m 755 "$TMP/asnobody"
    cp "$TMP/xchacha.tpack" "$TMP/asnobody/"
    mv "$TMP/key.nobody" "$TMP/asnobody/key"
    chmod o+x "$TMP"
    expect_ok "its owner (nobody) may use it" setpriv --reuid=nobody --regid=nogroup --clear-groups \
        "$CKPT" ls "$TMP/asnobody/xchacha.tpack" --key-file "$TMP/asnobody/key"
    chmod o-x "$TMP"
else
    skip "a key file owned by another user" "needs root and a user nobody"
fi

# bad_source NAME MAKER TEXT...: packing a directory in which the function
# MAKER (run inside it) left something bad must fail, name TEXT..., and leave
# no output behind.
bad_source() {
    local name=$1 maker=$2 d=$TMP/$1.src
    shift 2
    mkdir -p "$d"
    echo fine >"$d/fine.txt"
    (cd "$d" && "$maker")
    expect_fail "$name: pack refuses" "$CKPT" pack "$d" -o "$TMP/$name.tpack"
    last_stderr_has "$name: names the file and the fault" "$@"
    expect_absent "$name: leaves no pack and no temporary file" "$TMP/$name.tpack" "$TMP/$name.tpack.tmp"
}
header_not_json() { printf '\020\000\000\000\000\000\000\000{not json at all' >bad.safetensors; }
# A valid header whose tensor claims more bytes than the file holds.
offsets_past_end() {
    $PY -c 'import json, struct
h = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 99]}}).encode()
open("w.safetensors", "wb").write(struct.pack("<Q", len(h)) + h + bytes(16))'
}
npy_garbage() { printf '\223NUMPY\001\000\020\000{garbage       \n' >bad.npy; }
a_symlink() { ln -s fine.txt link.txt; }
# opaque_source NAME MAKER FILE TEXT...: a file whose container parser
# rejects it (made by MAKER, as above) no longer fails the pack: it is stored
# opaque and byte-identical, `ckpt pack` warns "warning: PATH: stored opaque:
# REASON" naming the file and the fault, and ls --json keeps the warning.
opaque_source() {
    local name=$1 maker=$2 file=$3 d=$TMP/$1.src
    shift 3
    mkdir -p "$d"
    echo fine >"$d/fine.txt"
    (cd "$d" && "$maker")
    expect_ok "$name: pack stores the file opaque" "$CKPT" pack "$d" -o "$TMP/$name.tpack"
    last_stderr_has "$name: warns, naming the file and the fault" "warning: $d/$file: stored opaque:" "$@"
    expect_ok "$name: unpacks" "$CKPT" unpack "$TMP/$name.tpack" -o "$TMP/$name.out"
    expect_same_tree "$name: byte-identical" "$d" "$TMP/$name.out"
    expect_ok "$name: ls --json" "$CKPT" ls --json "$TMP/$name.tpack"
    last_stdout_has "$name: ls --json keeps the warning" "\"warning\": \"$file: stored opaque:" "$@"
}
opaque_source bad-safetensors header_not_json "bad.safetensors" "header"
opaque_source bad-safetensors-offsets offsets_past_end "w.safetensors" "data_offsets"
opaque_source bad-npy npy_garbage "bad.npy" "npy header"
bad_source link-in-tree a_symlink "link.txt" "symbolic link"

# ------------------------------------------------------------ packing into itself

# A pack written inside the tree it packs leaves itself out, and, with
# --force, the pack it replaces too (that old pack was nested in the new
# one, and again at each repack).
mkdir -p "$TMP/self"
echo a >"$TMP/self/a"
expect_ok "a pack inside its own source" "$CKPT" pack "$TMP/self" -o "$TMP/self/x.tpack"
expect_ok "packed again over itself" "$CKPT" pack "$TMP/self" -o "$TMP/self/x.tpack" --force
expect_ok "ls of it" "$CKPT" ls "$TMP/self/x.tpack"
if grep -q "x.tpack" "$LAST_OUT" || [ "$(wc -l <"$LAST_OUT")" -ne 1 ]; then
    fail "the repacked pack holds only the source's own file" "$(cat "$LAST_OUT")"
else
    pass "the repacked pack holds only the source's own file"
fi

# ------------------------------------------------------------ a stalled store

# An S3 pack whose gateway answers listings but never answers an upload:
# the first signal waits for the next progress callback, which a stalled
# request does not make; a second one must end the command at once (it
# did nothing, and the command waited out the retries).
$PY -c 'import http.server, sys, time
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"<ListBucketResult><IsTruncated>false</IsTruncated></ListBucketResult>"
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def do_HEAD(self):
        self.send_response(404); self.send_header("Content-Length", "0"); self.end_headers()
    def stall(self):
        time.sleep(120)
    do_POST = do_PUT = stall
    def log_message(self, *a):
        pass
s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()' >"$TMP/stall.port" &
stall_pid=$!
for _ in $(seq 50); do [ -s "$TMP/stall.port" ] && break; sleep 0.1; done
AWS_ACCESS_KEY_ID=x AWS_SECRET_ACCESS_KEY=y "$CKPT" pack "$SRC" -o s3://bkt/stalled.tpack \
    --endpoint "http://127.0.0.1:$(cat "$TMP/stall.port")" >/dev/null 2>"$TMP/stall.err" &
pack_pid=$!
sleep 1.5
kill -TERM "$pack_pid"
sleep 0.3
kill -TERM "$pack_pid"
for _ in $(seq 30); do kill -0 "$pack_pid" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$pack_pid" 2>/dev/null; then
    fail "a second signal ends a pack stalled on its store" "still running 3 s later"
    kill -9 "$pack_pid"
    wait "$pack_pid"
else
    wait "$pack_pid"
    rc=$?
    if [ "$rc" -eq 143 ] && grep -q "s3-cleanup" "$TMP/stall.err"; then
        pass "a second signal ends a pack stalled on its store (exit 143, naming s3-cleanup)"
    else
        fail "a second signal ends a pack stalled on its store" "exit $rc: $(cat "$TMP/stall.err")"
    fi
fi
kill "$stall_pid" 2>/dev/null
wait "$stall_pid" 2>/dev/null

# ------------------------------------------------------------ hostile names

# Names come from the pack: a tensor named with a terminal escape (it set
# the window title and cleared the screen) or a newline (it faked a line of
# the listing) is listed with '?' for each control byte, as ls does.
mkdir -p "$TMP/esc.src"
$PY -c 'import json, struct
names = ["w\x1b]0;owned\x07\x1b[2J", "a\nfake 1 2 3", "c\u009b2J"]
h = {n: {"dtype": "F32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4]} for i, n in enumerate(names)}
h = json.dumps(h).encode()
open("'"$TMP"'/esc.src/m.safetensors", "wb").write(struct.pack("<Q", len(h)) + h + bytes(12))'
expect_ok "a pack with control bytes in tensor names" "$CKPT" pack "$TMP/esc.src" -o "$TMP/esc.tpack"
for flags in "--tensors" "--tensors -l"; do
    # shellcheck disable=SC2086
    expect_ok "ls $flags of it" "$CKPT" ls $flags "$TMP/esc.tpack"
    if grep -q "$(printf '\033')" "$LAST_OUT" || grep -q "^fake" "$LAST_OUT" ||
        grep -q "$(printf '\302\233')" "$LAST_OUT"; then
        fail "ls $flags: no control byte reaches the terminal, no faked line" "$(od -c "$LAST_OUT" | head -5)"
    else
        pass "ls $flags: no control byte reaches the terminal, no faked line"
    fi
    last_stdout_has "ls $flags: each control byte shows as ?" "w?]0;owned??[2J" "a?fake 1 2 3" "c?2J"
done

# ------------------------------------------------------------ interruption

# A checkpoint big enough that packing it takes a while on one thread.
BIG=$TMP/big
if run_cmd "$CKPT_GEN" "$BIG" --preset gpt2-medium --layers 4; then :; fi
interrupt() {
    local sig=$1 out=$TMP/big-$1.tpack pid rc i
    "$CKPT" pack "$BIG" -o "$out" --level 9 --threads 1 >/dev/null 2>"$TMP/int.err" &
    pid=$!
    for i in $(seq 1 200); do
        [ -f "$out.tmp" ] && [ "$(stat -c %s "$out.tmp" 2>/dev/null || echo 0)" -gt 1000000 ] && break
        sleep 0.05
    done
    kill -s "$sig" "$pid"
    wait "$pid"
    rc=$?
    if [ "$rc" -ne 0 ] && grep -q interrupted "$TMP/int.err"; then
        pass "SIG$sig during pack: reported and non-zero exit ($rc)"
    else
        fail "SIG$sig during pack: reported and non-zero exit" "exit $rc: $(cat "$TMP/int.err")"
    fi
    expect_absent "SIG$sig during pack: neither the pack nor its temporary file remains" "$out" "$out.tmp"
}
# Unpacking: the process is stopped as soon as the big file exists (its
# batch's decoding has then just begun), signalled, and let go, so the
# signal always lands mid-file. 70 small files come first in the pack, so
# the first batch of 64 is finished by then: those are kept, and must be
# whole; the big file's batch is removed.
interrupt_unpack() {
    local sig=$1 second=${2:-} pid rc i f
    local out=$TMP/big-un-$sig$second
    rm -rf "$out"
    "$CKPT" unpack "$TMP/big-int.tpack" -o "$out" --threads 1 >/dev/null 2>"$TMP/int.err" &
    pid=$!
    for i in $(seq 1 2000); do
        [ -e "$out/model.safetensors" ] && break
        sleep 0.005
    done
    kill -STOP "$pid"
    kill -s "$sig" "$pid"
    # Two signals at once: whichever handler runs second does not wait for
    # the workers; it removes the open files itself and exits with its own.
    [ -n "$second" ] && kill -s "$second" "$pid"
    kill -CONT "$pid"
    wait "$pid"
    rc=$?
    if [ -n "$second" ] && { [ "$rc" -eq "$((128 + $(kill -l "$sig")))" ] ||
        [ "$rc" -eq "$((128 + $(kill -l "$second")))" ]; } && ! grep -q "interrupted;" "$TMP/int.err"; then
        pass "SIG$sig and SIG$second during unpack: exit $rc at once, from the second handler"
    elif [ -n "$second" ]; then
        fail "SIG$sig and SIG$second during unpack: exit 128+signal" "exit $rc: $(cat "$TMP/int.err")"
    elif [ "$rc" -eq "$((128 + $(kill -l "$sig")))" ] && grep -q "interrupted" "$TMP/int.err"; then
        pass "SIG$sig during unpack: reported, exit $rc"
    else
        fail "SIG$sig during unpack: reported, exit 128+signal" "exit $rc: $(cat "$TMP/int.err")"
    fi
    local label=SIG$sig${second:+ and SIG$second}
    expect_absent "$label during unpack: the file being written is removed" "$out/model.safetensors"
    local kept=0 bad=""
    while IFS= read -r f; do
        kept=$((kept + 1))
        cmp -s "$out/$f" "$TMP/big-int/$f" || bad+=" $f"
    done < <(cd "$out" && find . -type f | sed 's|^\./||')
    if [ "$kept" -ge 64 ] && [ -z "$bad" ]; then
        pass "$label during unpack: the $kept files finished before are kept, whole"
    else
        fail "$label during unpack: the files finished before are kept, whole" "$kept kept; differ:$bad"
    fi
}
# A second pack to the name a first is still writing must not share its
# temporary file (each would truncate and overwrite the other's bytes).
two_packs_to_one_name() {
    local out=$TMP/twice.tpack pid rc i
    "$CKPT" pack "$BIG" -o "$out" --level 9 --threads 1 >/dev/null 2>"$TMP/twice1.err" &
    pid=$!
    for i in $(seq 1 200); do
        [ "$(stat -c %s "$out.tmp" 2>/dev/null || echo 0)" -gt 1000000 ] && break
        sleep 0.05
    done
    expect_fail "a second pack to the same name while the first writes" "$CKPT" pack "$BIG" -o "$out"
    last_stderr_has "the second pack says the temporary file is taken" "$out.tmp: another writer is writing it now"
    wait "$pid"
    rc=$?
    if [ "$rc" -eq 0 ]; then
        pass "the first pack finishes"
    else
        fail "the first pack finishes" "exit $rc: $(cat "$TMP/twice1.err")"
    fi
    expect_ok "the first pack is intact" "$CKPT" verify "$out"
    echo "left by a killed run" >"$out.tmp"
    expect_ok "a pack over a temporary file a killed run left" "$CKPT" pack "$BIG" -o "$out" --force
    expect_ok "that pack is intact" "$CKPT" verify "$out"
}
if [ "$LAST_RC" -eq 0 ]; then
    interrupt INT
    interrupt TERM
    cp -r "$BIG" "$TMP/big-int"
    mkdir "$TMP/big-int/aa"
    for i in $(seq -w 0 69); do echo "small file $i" >"$TMP/big-int/aa/f$i"; done
    expect_ok "a big pack to unpack" "$CKPT" pack "$TMP/big-int" -o "$TMP/big-int.tpack" --threads 2
    two_packs_to_one_name
    interrupt_unpack INT
    interrupt_unpack TERM
    interrupt_unpack INT TERM
else
    fail "ckpt-gen makes a gpt2-medium checkpoint with 4 layers" "$(head -n 3 "$LAST_ERR")"
fi

finish
