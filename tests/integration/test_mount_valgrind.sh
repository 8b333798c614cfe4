#!/usr/bin/env bash
# ckptfs under valgrind: a mount that reads every kind of file, hits a
# damaged chunk, a wrong-key pack and a garbage pack, and sees a pack
# replaced and another removed, must unmount with no leaks and no memory
# errors (valgrind --leak-check=full --error-exitcode=9).
. "$(dirname "$0")/lib.sh"

CKPTFS=${CKPTFS:-$BUILD/bin/ckptfs}
CLIENTS=$ROOT/tests/integration/mount_clients.py

[ -c /dev/fuse ] || skip_all "no /dev/fuse"
command -v fusermount3 >/dev/null || skip_all "no fusermount3"
command -v valgrind >/dev/null || skip_all "no valgrind"
if [ ! -x "$CKPTFS" ] || [ ! -x "$CKPT" ]; then
    fail "binaries built" "$CKPTFS or $CKPT is missing; run make first"
    finish
fi

MNT=$TMP/mnt
DAEMON=
# Never leave a stale mount behind, whatever happened.
trap 'mountpoint -q "$MNT" && fusermount3 -u -z "$MNT"; [ -n "$DAEMON" ] && kill "$DAEMON" 2>/dev/null; cleanup_tmp' EXIT

cd "$TMP" || exit 1
SRC=$TMP/src
BACK=$TMP/back
mkdir -p "$SRC/sub" "$BACK" "$MNT"
$PY - "$SRC" <<'EOF'
import json, struct, sys
import numpy as np
src = sys.argv[1]
rng = np.random.default_rng(3)
w = (rng.standard_normal((256, 300)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
b = rng.standard_normal(300).astype(np.float32)
header = {"w": {"dtype": "BF16", "shape": [256, 300], "data_offsets": [0, w.nbytes]},
          "layer/b": {"dtype": "F32", "shape": [300], "data_offsets": [w.nbytes, w.nbytes + b.nbytes]}}
text = json.dumps(header).encode()
text += b" " * (-len(text) % 8)
with open(src + "/model.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(text)) + text + w.tobytes() + b.tobytes())
np.save(src + "/sub/x.npy", np.arange(50000, dtype=np.float32))
EOF
head -c 400000 /dev/urandom >"$SRC/blob.bin"
echo "config" >"$SRC/config.txt"
"$CKPT" keygen -o "$TMP/key" >/dev/null
"$CKPT" keygen -o "$TMP/key2" >/dev/null
"$CKPT" pack "$SRC" -o "$BACK/comp.tpack" --chunk-size 64K >/dev/null
"$CKPT" pack "$SRC" -o "$BACK/enc.tpack" --chunk-size 64K --key-file "$TMP/key" >/dev/null
"$CKPT" pack "$SRC" -o "$BACK/other-key.tpack" --key-file "$TMP/key2" >/dev/null
"$CKPT" pack "$SRC" -o "$BACK/gone.tpack" >/dev/null
cp "$BACK/comp.tpack" "$BACK/bad.tpack"
$PY -c '
import sys
with open(sys.argv[1], "r+b") as f:
    f.seek(200000); b = f.read(1); f.seek(200000); f.write(bytes([b[0] ^ 1]))' "$BACK/bad.tpack"
head -c 3000 /dev/urandom >"$BACK/garbage.tpack"

valgrind --leak-check=full --show-leak-kinds=definite,indirect,possible --errors-for-leak-kinds=definite,indirect,possible \
    --error-exitcode=9 --log-file="$TMP/valgrind.log" \
    "$CKPTFS" -f -o key_file="$TMP/key",cache_size=4M,threads=2 "$BACK" "$MNT" 2>"$TMP/ckptfs.log" &
DAEMON=$!
for _ in $(seq 600); do
    mountpoint -q "$MNT" && break
    kill -0 "$DAEMON" 2>/dev/null || break
    sleep 0.1
done
if ! mountpoint -q "$MNT"; then
    fail "ckptfs mounts under valgrind" "$(tail -5 "$TMP/valgrind.log")"
    finish
fi
pass "ckptfs mounts under valgrind"

for p in comp enc; do
    for f in model.safetensors sub/x.npy blob.bin config.txt; do
        expect_same_sha256 "$p: $f reads under valgrind" "$SRC/$f" "$MNT/$p/$f"
    done
    expect_ok "$p: manifest.json parses" $PY -c 'import json,sys; json.load(open(sys.argv[1]))' "$MNT/$p/manifest.json"
    expect_ok "$p: tensors read through numpy" $PY "$CLIENTS" tensors "$MNT/$p" "$SRC"
    expect_ok "$p: xattrs" getfattr -d "$MNT/$p/tensors/w"
done
expect_ok "ls -lR of the whole mount" ls -lR "$MNT/comp" "$MNT/enc"
expect_fail "damaged chunk: read fails" cat "$MNT/bad/blob.bin"
expect_fail "wrong key: listing fails" ls "$MNT/other-key"
expect_fail "garbage pack: listing fails" ls "$MNT/garbage"
# Committed checkpoints reopen on a write; their views never take one.
expect_fail "writes into manifest.json are refused" sh -c 'echo x >"$1"' sh "$MNT/comp/manifest.json"
expect_fail "writes into tensors/ are refused" touch "$MNT/comp/tensors/new"
# A pack replaced and one removed while their files are known to the kernel.
cat "$MNT/gone/config.txt" >/dev/null
rm "$BACK/gone.tpack"
ls "$MNT" >/dev/null
"$CKPT" pack "$SRC" -o "$BACK/comp.tpack" --force >/dev/null
expect_same_sha256 "replaced pack reads under valgrind" "$SRC/blob.bin" "$MNT/comp/blob.bin"
fusermount3 -u "$MNT"
wait "$DAEMON"
rc=$?
DAEMON=
if [ "$rc" -eq 0 ]; then
    pass "valgrind: exit status 0 after unmount"
else
    fail "valgrind: exit status 0 after unmount" "status $rc" "$(grep -E 'lost|ERROR SUMMARY|Invalid' "$TMP/valgrind.log" | head -8)"
fi
if grep -q "ERROR SUMMARY: 0 errors" "$TMP/valgrind.log"; then pass "valgrind: no memory errors"
else fail "valgrind: no memory errors" "$(grep -E 'ERROR SUMMARY|Invalid|uninitialised' "$TMP/valgrind.log" | head -5)"; fi
if grep -qE "All heap blocks were freed|definitely lost: 0 bytes" "$TMP/valgrind.log" &&
    ! grep -qE "(definitely|indirectly|possibly) lost: [1-9]" "$TMP/valgrind.log"; then
    pass "valgrind: no leaks"
else
    fail "valgrind: no leaks" "$(grep -E 'lost:' "$TMP/valgrind.log")"
fi

finish
