#!/usr/bin/env bash
# End to end tests of `ckpt-cuda`: usage and source errors everywhere; on a
# machine without a GPU, the clean "no CUDA device" failure; with one, loads
# that verify every tensor's SHA-256 on the device, from a .tpack (plain,
# encrypted, a subset) and through a real ckptfs mount, plus the benchmark.
. "$(dirname "$0")/lib.sh"

CKPT_CUDA=${CKPT_CUDA:-$BUILD/bin/ckpt-cuda}
CKPTFS=${CKPTFS:-$BUILD/bin/ckptfs}

[ -x "$CKPT_CUDA" ] || skip_all "ckpt-cuda not built (no CUDA toolkit found)"
if [ ! -x "$CKPT" ] || [ ! -x "$CKPT_GEN" ]; then
    fail "binaries built" "$CKPT or $CKPT_GEN is missing; run make first"
    finish
fi

MNT=$TMP/mnt
DAEMON=
unmount() {
    if [ -n "$DAEMON" ]; then
        mountpoint -q "$MNT" && fusermount3 -u -z "$MNT" 2>/dev/null
        kill "$DAEMON" 2>/dev/null
        DAEMON=
    fi
}
trap 'unmount; cleanup_tmp' EXIT

cd "$TMP" || exit 1
"$CKPT_GEN" src --preset tiny >/dev/null || { fail "ckpt-gen"; finish; }
mkdir back
"$CKPT" pack src -o back/tiny.tpack >/dev/null || { fail "pack"; finish; }
"$CKPT" keygen -o key >/dev/null
"$CKPT" pack src -o enc.tpack --key-file key >/dev/null || { fail "pack encrypted"; finish; }
NT=$("$CKPT" ls back/tiny.tpack --tensors | grep -c .)

# --------------------------------------------------------------- usage

expect_ok "--help" "$CKPT_CUDA" --help
last_stdout_has "--help names the commands" "ckpt-cuda load SRC" "bench" "--verify" "--pinned"
expect_ok "load --help" "$CKPT_CUDA" load --help
expect_ok "--version" "$CKPT_CUDA" --version
expect_exit "no command" 2 "$CKPT_CUDA"
expect_exit "unknown command" 2 "$CKPT_CUDA" frob
last_stderr_has "unknown command is named" "unknown command 'frob'"
expect_exit "missing SRC" 2 "$CKPT_CUDA" load
last_stderr_has "missing SRC says so" "missing SRC"
expect_exit "bad --device" 2 "$CKPT_CUDA" load back/tiny.tpack --device x
expect_exit "negative --device" 2 "$CKPT_CUDA" load back/tiny.tpack --device -1
expect_exit "bad --pinned" 2 "$CKPT_CUDA" load back/tiny.tpack --pinned 1K
last_stderr_has "--pinned minimum" "at least 128K"
expect_exit "bad --align" 2 "$CKPT_CUDA" load back/tiny.tpack --align 3
expect_exit "unknown option" 2 "$CKPT_CUDA" load back/tiny.tpack --frob
expect_exit "--select is for load" 2 "$CKPT_CUDA" bench back/tiny.tpack --select x
expect_exit "two keys" 2 "$CKPT_CUDA" load enc.tpack --key-file key --passphrase-file key
expect_exit "a key for a directory" 2 "$CKPT_CUDA" load src --key-file key
last_stderr_has "a key for a directory: the daemon decrypts it" "src is a mounted checkpoint" "for .tpack files"

# --------------------------------------------- source errors (any machine)

expect_exit "missing source" 1 "$CKPT_CUDA" load nope.tpack
last_stderr_has "missing source is named" "ckpt-cuda: nope.tpack: No such file"
expect_exit "plain directory" 1 "$CKPT_CUDA" load src
last_stderr_has "plain directory explained" "no manifest.json"
expect_exit "not a pack" 1 "$CKPT_CUDA" load src/config.json
expect_exit "encrypted without key" 1 "$CKPT_CUDA" load enc.tpack
last_stderr_has "encrypted without key says so" "no key"
expect_exit "selection typo" 1 "$CKPT_CUDA" load back/tiny.tpack --select 'h.9.*'
last_stderr_has "selection typo named" "no tensor matches 'h.9.*'"

# ------------------------------------------------------------- device

if ! "$CKPT_CUDA" devices >"$TMP/devices" 2>"$TMP/devices.err"; then
    reason=$(sed 's/^ckpt-cuda: //' "$TMP/devices.err")
    expect_exit "no device: load fails cleanly" 1 "$CKPT_CUDA" load back/tiny.tpack
    last_stderr_has "no device: load says why" "ckpt-cuda: no CUDA device"
    expect_exit "no device: bench fails cleanly" 1 "$CKPT_CUDA" bench back/tiny.tpack
    last_stderr_has "no device: bench says why" "no CUDA device"
    expect_exit "no device: devices fails cleanly" 1 "$CKPT_CUDA" devices
    skip "loads on a GPU" "$reason"
    finish
fi
pass "devices lists $(grep -c . "$TMP/devices") device(s)"

expect_ok "load --verify" "$CKPT_CUDA" load back/tiny.tpack --verify
last_stdout_has "load reports the rate" "loaded $NT tensors" "GB/s"
last_stdout_has "verify passes" "verify: $NT tensors match"
expect_ok "small ring" "$CKPT_CUDA" load back/tiny.tpack --verify --pinned 128K --threads 3 --streams 2
expect_ok "subset" "$CKPT_CUDA" load back/tiny.tpack --verify --select 'h.0.*' --select wte.weight
last_stdout_has "subset verifies" "verify:"
expect_ok "encrypted" "$CKPT_CUDA" load enc.tpack --key-file key --verify
n=$(grep -c . "$TMP/devices")
expect_exit "device index out of range" 1 "$CKPT_CUDA" load back/tiny.tpack --device "$n"
last_stderr_has "out of range explained" "device $n does not exist ($n device"
expect_ok "bench" "$CKPT_CUDA" bench back/tiny.tpack
last_stdout_has "bench prints ratios" "pipeline / link" "pipeline / naive"

if [ -c /dev/fuse ] && command -v fusermount3 >/dev/null && [ -x "$CKPTFS" ]; then
    mkdir -p "$MNT"
    "$CKPTFS" -f back "$MNT" 2>"$TMP/ckptfs.log" &
    DAEMON=$!
    for _ in $(seq 200); do mountpoint -q "$MNT" && break; sleep 0.05; done
    if mountpoint -q "$MNT"; then
        expect_ok "load through the mount" "$CKPT_CUDA" load "$MNT/tiny" --verify --threads 4
        last_stdout_has "mount load verifies" "verify: $NT tensors match"
        expect_ok "bench through the mount" "$CKPT_CUDA" bench "$MNT/tiny"
    else
        fail "ckptfs mounts" "$(cat "$TMP/ckptfs.log")"
    fi
    unmount
else
    skip "load through the mount" "no FUSE here"
fi

finish
