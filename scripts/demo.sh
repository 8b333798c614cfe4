#!/usr/bin/env bash
# `make demo`: the whole life of a checkpoint in a few commands. Generates a
# GPT-2-shaped checkpoint, packs it compressed and encrypted, lists and
# verifies the pack, unpacks it and proves every file came back identical.
#
#   DEMO_SIZE=tiny (default, a few MB) | full (gpt2-medium, ~700 MB in bf16)
#   B=build                    the build directory holding bin/
#
# Everything lands in demo/ (gitignored). Each step is a function so later
# steps (mounting the pack, say) slot in without disturbing the others.
set -euo pipefail

cd "$(dirname "$0")/.."
B=${B:-build}
CKPT=$B/bin/ckpt
GEN=$B/bin/ckpt-gen
DEMO=demo
SRC=$DEMO/checkpoint
PACKS=$DEMO/packs
PACK=$PACKS/checkpoint.tpack
MNT=$DEMO/mnt
CKPTFS=$B/bin/ckptfs
KEY=$DEMO/demo.key
OUT=$DEMO/unpacked

case ${DEMO_SIZE:-tiny} in
    tiny) PRESET=tiny ;;
    full) PRESET=gpt2-medium ;;
    *) echo "demo: DEMO_SIZE must be tiny or full, not '$DEMO_SIZE'" >&2; exit 2 ;;
esac

# Bold headings on a terminal, plain text in logs.
if [ -t 1 ]; then BOLD=$'\033[1m' GREEN=$'\033[1;32m' PLAIN=$'\033[0m'; else BOLD= GREEN= PLAIN=; fi
step() { printf '\n%s== %s%s\n' "$BOLD" "$*" "$PLAIN"; }
# Shows a command exactly as it runs, so the demo doubles as a tutorial.
run() { printf '$ %s\n' "$*"; "$@"; }

step_clean() {
    step "Start from a clean demo/ directory"
    mountpoint -q "$MNT" 2>/dev/null && fusermount3 -u "$MNT"
    run rm -rf "$SRC" "$PACKS" "$KEY" "$OUT" "$MNT"
    run mkdir -p "$DEMO" "$PACKS"
}

step_generate() {
    step "Generate a $PRESET checkpoint"
    run "$GEN" "$SRC" --preset "$PRESET"
    run du -sh "$SRC"
}

step_keygen() {
    step "Make a key (32 random bytes, mode 0600)"
    run "$CKPT" keygen -o "$KEY"
}

step_pack() {
    step "Pack it, compressed and encrypted"
    run "$CKPT" pack "$SRC" -o "$PACK" --key-file "$KEY" --level 6
}

step_inspect() {
    step "List the files, then the first tensors"
    run "$CKPT" ls -l "$PACK" --key-file "$KEY"
    # sed, not head: head would close the pipe early and, with pipefail,
    # fail the demo.
    printf '$ %s | sed -n 1,12p\n' "$CKPT ls --tensors $PACK --key-file $KEY"
    "$CKPT" ls --tensors "$PACK" --key-file "$KEY" | sed -n 1,12p
}

step_verify() {
    step "Verify every chunk, file and tensor"
    run "$CKPT" verify "$PACK" --key-file "$KEY"
}

step_unpack() {
    step "Unpack it"
    run "$CKPT" unpack "$PACK" -o "$OUT" --key-file "$KEY"
}

# The proof: the same SHA-256 for every file, listed side by side.
manifest() { (cd "$1" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum); }

step_compare() {
    step "Compare every file with the original (SHA-256)"
    printf '$ diff <(sha256sum of %s) <(sha256sum of %s)\n' "$SRC" "$OUT"
    if ! diff <(manifest "$SRC") <(manifest "$OUT"); then
        echo "demo: FAILED: the unpacked files differ from the originals" >&2
        exit 1
    fi
    echo "all $(manifest "$SRC" | wc -l) files identical"
}

step_mount() {
    step "Mount the packs and read the checkpoint through ckptfs"
    if [ ! -e /dev/fuse ] || ! command -v fusermount3 >/dev/null; then
        echo "skipped: no /dev/fuse or fusermount3 here (apt-get install fuse3)"
        return
    fi
    run mkdir -p "$MNT"
    run "$CKPTFS" -o key_file="$KEY" "$PACKS" "$MNT"
    trap 'fusermount3 -u "$MNT" 2>/dev/null' EXIT
    run ls -l "$MNT/checkpoint"
    printf '$ sed -n 1,12p %s\n' "$MNT/checkpoint/manifest.json"
    sed -n 1,12p "$MNT/checkpoint/manifest.json"
    run getfattr -d "$MNT/checkpoint/tensors/wte.weight"
    printf '$ diff <(sha256sum of %s) <(sha256sum of %s)\n' "$SRC" "$MNT/checkpoint (packed files)"
    for f in $(cd "$SRC" && find . -type f); do
        cmp -s "$SRC/$f" "$MNT/checkpoint/$f" || { echo "demo: FAILED: $f differs through the mount" >&2; exit 1; }
    done
    echo "every file reads back identical through the mount"
    run fusermount3 -u "$MNT"
    trap - EXIT
}

step_clean
step_generate
step_keygen
step_pack
step_inspect
step_verify
step_unpack
step_compare
step_mount

printf '\n%sdemo OK:%s %s packed to %s (%s), verified, and unpacked byte-identical into %s\n' \
    "$GREEN" "$PLAIN" "$SRC" "$PACK" "$(du -h "$PACK" | cut -f1)" "$OUT"

# Where the binaries are: make builds them into $B, not onto PATH.
step_where() {
    local b
    b=$(cd "$B" && pwd)
    step "The binaries are in $B/bin, not on your PATH"
    for f in ckpt ckptfs ckpt-cuda; do
        [ -x "$b/bin/$f" ] && printf '  %s\n' "$b/bin/$f"
    done
    printf '  %s\n' "$b/lib/libckpt.so" "$b/lib/libckpt.a"
    cat <<EOF
Use them from there (export PATH="$b/bin:\$PATH"), or install them:
  sudo make install                    # into /usr/local (PREFIX=/usr/local)
  make install PREFIX=\$HOME/.local SYSCONFDIR=\$HOME/.local/etc MOUNT_HELPER_DIR=   # as yourself
  packaging/build-deb.sh               # or Debian packages in $B/deb/, then: sudo apt install ./$B/deb/*.deb
The Python package: pip install ./python  (or make install / python3-ckptfs)
EOF
}
step_where
