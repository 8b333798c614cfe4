#!/usr/bin/env bash
# Every container format through the real mount, written and read by its own
# client (tests/integration/format_clients.py, run with the pinned venv of
# scripts/venv.sh): torch.save (a nested state_dict with optimizer state,
# one bare tensor per file, tied weights, a non-contiguous view, dtypes a
# pack has no element type for, each skipped with its dtype named), tensorizer
# (TensorSerializer into the mount, TensorDeserializer plain and lazy back),
# GGUF (F32, F16, BF16 and Q8_0; mmap through the mount), DCP (dcp.save and
# dcp.async_save into the mount, and dcp.save from 2 gloo ranks of DTensors
# sharded Shard(0), each tensor then one tensors/FQN assembled from its
# chunks, or Shard(1), chunks keeping their FQN@offsets names; every item
# compressed by a stream transform, as torch's ZStandard extension does: no
# tensor, each FQN in the manifest's skipped list; dcp.load
# back), safetensors and a raw fp32
# blob. Each is one checkpoint in the writable mount, committed, and checked
# against a plain copy written by the same client: every file byte-identical,
# each file's container, every tensors/NAME against its source tensor
# (sha256 in the manifest and recomputed; values through torch.from_file and
# np.memmap with the manifest's dtypes), and `ckpt pack` of the plain copy
# finding the same tensors. Then hostile files (an unknown global in a
# pickle, a truncated zip, an absurd GGUF tensor count, tensor names another
# file already has) are stored opaque with a warning naming the file and the
# fault: in `ckpt pack`'s stderr, the manifest and the daemon's log, while
# the rest of the checkpoint still packs.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/write_lib.sh"

# formats/dcp.c has landed: a missing DCP tensor fails (DCP_REQUIRED=0 in
# the environment turns those checks into "pending" reports).
DCP_REQUIRED=${DCP_REQUIRED:-1}
export DCP_REQUIRED

VPY=$(cd "$ROOT" && B=$B scripts/venv.sh 2>"$LAST_ERR") ||
    skip_all "scripts/venv.sh could not make the pinned venv: $(tail -n 1 "$LAST_ERR")"
case $VPY in /*) ;; *) VPY=$ROOT/$VPY ;; esac
FC=$ROOT/tests/integration/format_clients.py
SRC=$TMP/src
SEED=7
FORMATS=(${FORMATS:-torch tensorizer gguf dcp dcp_async dcp_ranks dcp_ranks_dim1 dcp_zlib safetensors raw})
mkdir -p "$BACK" "$SRC" "$TMP/packs"

# driver NAME ARGS...: runs format_clients.py; its PASS/FAIL/SKIP lines
# count as this file's assertions. A driver that dies counts as a failure.
driver() {
    local name=$1 line
    shift
    "$VPY" "$FC" "$@" >"$LAST_OUT" 2>"$LAST_ERR"
    LAST_RC=$?
    while IFS= read -r line; do
        case $line in
        "PASS "*) pass "${line#PASS }" ;;
        "FAIL "*) T_FAIL=$((T_FAIL + 1)); echo "$line" ;;
        "SKIP "*) T_SKIP=$((T_SKIP + 1)); echo "$line" ;;
        *) echo "$line" ;;
        esac
    done <"$LAST_OUT"
    if [ "$LAST_RC" -ne 0 ]; then
        fail "$name: the driver ran to the end" "exit $LAST_RC"
        tail -n 6 "$LAST_ERR" | sed 's/^/     stderr: /'
    fi
}

# same_tensors NAME PACK CKPT: `ckpt ls --json` of PACK lists the tensors
# (names, files, sha256) and containers that CKPT's manifest.json does.
same_tensors() {
    run_cmd "$CKPT" ls "$2" --json
    if "$VPY" - "$LAST_OUT" "$3/manifest.json" <<'EOF'; then pass "$1"; else fail "$1"; fi
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
key = lambda j: (sorted((t["name"], t["file"], t["sha256"], t["container"]) for t in j["tensors"]),
                 sorted((f["path"], f["container"], f.get("warning", "")) for f in j["files"]))
ka, kb = key(a), key(b)
if ka != kb:
    print("     ckpt pack: %d tensors, the mount: %d" % (len(ka[0]), len(kb[0])))
    sys.exit(1)
EOF
}

if ! mount_ckptfs "$BACK" "$MNT" "$LOG" -o commit_delay=0; then
    fail "ckptfs mounts writable" "$(cat "$LOG")"
    finish
fi
pass "ckptfs mounts writable"

# --------------------------------------------------- one checkpoint a format

for fmt in "${FORMATS[@]}"; do
    driver "$fmt: plain write" write "$fmt" "$SRC/$fmt" "$SEED"
    mkdir "$MNT/$fmt"
    driver "$fmt: write into the mount" write "$fmt" "$MNT/$fmt" "$SEED"
    case $fmt in
    dcp*)
        # .metadata carries a fresh save id each time: the shards must
        # match the plain save, and the metadata as written (read back
        # before commit) is the source of the round trip.
        for s in "$SRC/$fmt"/*.distcp; do
            expect_same_sha256 "$fmt: $(basename "$s") as the plain save wrote it" "$s" "$MNT/$fmt/$(basename "$s")"
        done
        cp "$MNT/$fmt/.metadata" "$SRC/$fmt/.metadata"
        ;;
    esac
    expect_ok "$fmt: read-your-writes before commit" $PY "$WCLIENTS" same-tree "$SRC/$fmt" "$MNT/$fmt"
    expect_ok "$fmt: ckpt commit --wait" "$CKPT" commit --wait "$MNT/$fmt"
    [ "$(state_of "$MNT/$fmt")" = committed ] && pass "$fmt: committed" || fail "$fmt: committed" "$(state_of "$MNT/$fmt")"
    driver "$fmt: check" check "$fmt" "$MNT/$fmt" "$SRC/$fmt" "$SEED"
    expect_ok "$fmt: ckpt pack of the plain copy" "$CKPT" pack "$SRC/$fmt" -o "$TMP/packs/$fmt.tpack"
    same_tensors "$fmt: ckpt pack finds the tensors and containers the mount's commit did" "$TMP/packs/$fmt.tpack" "$MNT/$fmt"
    expect_ok "$fmt: ckpt verify" "$CKPT" verify "$TMP/packs/$fmt.tpack"
done

# dcp_zlib's shards (every item compressed) beside a .metadata this reader
# refuses: the scan finds no torch archive either, and each shard's
# ".metadata" skipped entry still says why it shows no tensor (that note
# was dropped: container dcp, no tensor, no reason).
if [[ " ${FORMATS[*]} " == *" dcp_zlib "* ]]; then
    Z=$TMP/dcp_zlib_junk_metadata
    mkdir -p "$Z"
    cp "$SRC/dcp_zlib"/*.distcp "$Z/"
    printf '\x80\x02N.' >"$Z/.metadata"
    expect_ok "dcp_zlib with a refused .metadata: ckpt pack" "$CKPT" pack "$Z" -o "$TMP/packs/dcp_zlib_junk.tpack"
    run_cmd "$CKPT" ls "$TMP/packs/dcp_zlib_junk.tpack" --json
    if "$VPY" - "$LAST_OUT" >"$TMP/zj.out" 2>&1 <<'EOF'; then pass "dcp_zlib with a refused .metadata: every shard says why it shows no tensor"; else fail "dcp_zlib with a refused .metadata: every shard says why it shows no tensor" "$(cat "$TMP/zj.out")"; fi
import json, sys
j = json.load(open(sys.argv[1]))
shards = sorted(f["path"] for f in j["files"] if f["path"].endswith(".distcp"))
assert shards and all(f["container"] == "dcp" for f in j["files"] if f["path"] in shards), j["files"]
assert not j["tensors"], j["tensors"]
why = "ignored: the pickle holds a None, not a torch.distributed.checkpoint.metadata.Metadata"
got = sorted(s["file"] for s in j.get("skipped", []) if s["name"] == ".metadata" and s["reason"] == why)
assert got == shards, (got, shards, j.get("skipped"))
EOF
fi

# ---------------------------------------------------------- hostile files

H=$SRC/hostile
driver "hostile: write" hostile "$H" "$SEED"
# fault FILE TEXT: what the warning for FILE must name
declare -A FAULT=(
    [evil.pt]="posix.system"
    [truncated.pt]="end of central directory"
    [absurd.gguf]="tensor count"
)
expect_ok "ckpt pack of a checkpoint with hostile files succeeds" "$CKPT" pack "$H" -o "$TMP/packs/hostile.tpack"
for f in "${!FAULT[@]}"; do
    if grep -F "warning: $H/$f: stored opaque:" "$LAST_ERR" | grep -qF -- "${FAULT[$f]}"; then
        pass "ckpt pack warns: $f stored opaque (${FAULT[$f]})"
    else
        fail "ckpt pack warns: $f stored opaque (${FAULT[$f]})" "$(grep -F "$f" "$LAST_ERR" | head -n 2)"
    fi
done
n_warn=$(grep -c '^warning: ' "$LAST_ERR")
[ "$n_warn" -eq ${#FAULT[@]} ] && pass "and no other warning" || fail "and no other warning" "$(cat "$LAST_ERR")"

mkdir "$MNT/hostile"
expect_ok "hostile files copied into the mount" cp -a "$H/." "$MNT/hostile/"
expect_ok "hostile: ckpt commit --wait" "$CKPT" commit --wait "$MNT/hostile"
[ "$(state_of "$MNT/hostile")" = committed ] && pass "hostile: the checkpoint commits" ||
    fail "hostile: the checkpoint commits" "$(state_of "$MNT/hostile")"
driver "hostile: check" check-hostile "$MNT/hostile" "$H"
same_tensors "hostile: ckpt pack and the mount agree" "$TMP/packs/hostile.tpack" "$MNT/hostile"
for f in "${!FAULT[@]}"; do
    if grep -F "$f" "$LOG" | grep -qF -- "${FAULT[$f]}"; then
        pass "the daemon's log names $f and its fault"
    else
        fail "the daemon's log names $f and its fault" "$(grep -iE 'warn|opaque' "$LOG" | head -n 3)"
    fi
done

# ------------------------------------------------------ damaged torch.save

# torch.load refuses an archive whose storage record is missing or cut
# short. It is packed as it is, its other tensors indexed, with one warning
# per file naming the file and the first fault (it used to be silent: only
# the manifest's skipped list said why). A dtype a pack has no element type
# for (torch.complex32), which torch.load reads, is skipped by design and
# stays silent.
D=$SRC/damaged
mkdir -p "$D"
expect_ok "damaged: torch.load reads ok.pt and refuses missing.pt, short.pt and only.pt" "$VPY" -c '
import os, sys, zipfile, warnings
import torch
warnings.simplefilter("ignore")  # ComplexHalf is experimental
d = sys.argv[1]
ok = os.path.join(d, "ok.pt")
torch.save({"a": torch.arange(4.0), "b": torch.ones(3), "c": torch.zeros(2, dtype=torch.complex32)}, ok)
def rewrite(name, edit):
    with zipfile.ZipFile(ok) as zi, zipfile.ZipFile(os.path.join(d, name), "w") as zo:
        for i in zi.infolist():
            data = edit(i.filename, zi.read(i.filename))
            if data is not None:
                zo.writestr(i, data)
rewrite("missing.pt", lambda n, b: None if n.endswith("/data/1") else b)  # the storage of b
rewrite("short.pt", lambda n, b: b[: len(b) // 2] if n.endswith("/data/1") else b)
# one bare tensor, its only storage gone: nothing readable is left
one = os.path.join(d, "one.pt")
torch.save(torch.ones(3), one)
with zipfile.ZipFile(one) as zi, zipfile.ZipFile(os.path.join(d, "only.pt"), "w") as zo:
    for i in zi.infolist():
        if not i.filename.endswith("/data/0"):
            zo.writestr(i, zi.read(i.filename))
os.remove(one)
torch.load(ok, weights_only=True)
for f in ("missing.pt", "short.pt", "only.pt"):
    try:
        torch.load(os.path.join(d, f), weights_only=True)
        sys.exit("torch.load read " + f)
    except RuntimeError:
        pass
' "$D"
expect_ok "ckpt pack of damaged torch.save files succeeds" "$CKPT" pack "$D" -o "$TMP/packs/damaged.tpack"
got=$(grep '^warning: ' "$LAST_ERR" | sort)
want="warning: $D/missing.pt: stored as it is, but damaged: tensor 'b': its storage record is missing
warning: $D/only.pt: stored as it is, but damaged: tensor 'only': its storage record is missing
warning: $D/short.pt: stored as it is, but damaged: tensor 'b': its storage record's size does not match the storage"
[ "$got" = "$want" ] && pass "ckpt pack warns once per damaged file, naming it and the fault; not for ok.pt" ||
    fail "ckpt pack warns once per damaged file, naming it and the fault; not for ok.pt" "$(cat "$LAST_ERR")"
mkdir "$MNT/damaged"
expect_ok "damaged files copied into the mount" cp -a "$D/." "$MNT/damaged/"
expect_ok "damaged: ckpt commit --wait" "$CKPT" commit --wait "$MNT/damaged"
got=$(grep -F -e '.pt: ' "$LOG" | grep -F -e 'ok.pt' -e 'missing.pt' -e 'short.pt' -e 'only.pt' | sort)
want="ckptfs: warning: damaged/missing.pt: stored as it is, but damaged: tensor 'b': its storage record is missing
ckptfs: warning: damaged/only.pt: stored as it is, but damaged: tensor 'only': its storage record is missing
ckptfs: warning: damaged/short.pt: stored as it is, but damaged: tensor 'b': its storage record's size does not match the storage"
[ "$got" = "$want" ] && pass "the daemon's log says the same" || fail "the daemon's log says the same" "$got"
same_tensors "damaged: ckpt pack and the mount agree" "$TMP/packs/damaged.tpack" "$MNT/damaged"

unmount_ckptfs "$MNT" && pass "unmount ends the daemon with status 0" || fail "unmount ends the daemon with status 0" "$(tail -3 "$LOG")"
if grep -qiE "assert|sanitizer|segfault" "$LOG"; then fail "no crash traces in the log" "$(grep -iE 'assert|sanitizer' "$LOG" | head -3)"
else pass "no crash traces in the log"; fi
finish
