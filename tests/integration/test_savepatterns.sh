#!/usr/bin/env bash
# Real trainers save into the writable mount with default options, as they
# would on a local disk (tests/integration/save_patterns.py): HF Trainer
# (safetensors and .bin, save_total_limit rotation, from_pretrained and
# resume_from_checkpoint through the mount), DCP (dcp.save, dcp.async_save),
# Lightning's ModelCheckpoint (save_top_k, save_last="link"), a Hugging Face
# cache tree copied with cp -a, DeepSpeed's save_checkpoint (ZeRO stage 2,
# on its CPU accelerator) and megatron-core's dist_checkpointing.save
# (torch_dist, two ranks on gloo; synchronous, and async_sharded_save=True
# as Megatron-LM's --async-save runs it), each loaded back its own way. Each pattern is saved by the same code into a plain directory
# too; after the final commit, and again after a remount, every file's
# sha256 (and every link's target) matches it, every pack is compressed, and
# no staging is left. Reports pack generations, time to the final commit
# and the ratio per pattern.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/write_lib.sh"

VPY=${CKPT_PYTHON:-$BUILD/venv/bin/python}
if [ ! -x "$VPY" ] || ! "$VPY" -c "import transformers, lightning, accelerate, importlib.util as u
assert u.find_spec('deepspeed') and u.find_spec('megatron.core')" 2>/dev/null; then
    skip_all "no venv with transformers, accelerate, lightning, deepspeed and megatron-core (make venv)"
fi
DRIVER=$ROOT/tests/integration/save_patterns.py
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONWARNINGS=ignore OMP_NUM_THREADS=2
PATTERNS=(${SAVE_PATTERNS:-hf-trainer-safetensors hf-trainer-bin dcp lightning hf-cache deepspeed megatron megatron-async})
PLAIN=$TMP/plain
mkdir -p "$BACK" "$PLAIN"

command -v unshare >/dev/null || skip_all "no unshare (util-linux)"
AT=$TMP/at
mkdir -p "$AT"

# save PATTERN DIR: the pattern saved into DIR, seen at the same path $AT
# both times (a bind mount in a private mount namespace), as savers record
# absolute paths; for the cache, cp -a of a tree made aside.
save() {
    local p=$1 dir=$2
    if [ "$p" = hf-cache ]; then
        [ -d "$TMP/hfsrc" ] || { mkdir -p "$TMP/hfsrc" && (cd "$TMP/hfsrc" && "$VPY" "$DRIVER" hf-cache); } || return 1
        cp -a "$TMP/hfsrc/." "$dir/"
    else
        unshare -m bash -c 'mount --bind "$1" "$2" && cd "$2" && exec "$3" "$4" "$5"' _ \
            "$dir" "$AT" "$VPY" "$DRIVER" "$p"
    fi
}

now() { date +%s.%N; }

if ! mount_ckptfs "$BACK" "$MNT" "$LOG"; then
    fail "ckptfs mounts with default options" "$(cat "$LOG")"
    finish
fi
pass "ckptfs mounts with default options"

# megatron-async writes the very bytes megatron does (the same seeded
# state and torch_dist writer, run in a forked process): its mount copy is
# compared with megatron's plain one, which spares a save (9 s).
declare -A COMMIT_S GENS PLAIN_OF SAME_AS=([megatron-async]=megatron)
for p in "${PATTERNS[@]}"; do
    ref=${SAME_AS[$p]:-}
    if [ -n "$ref" ] && [ -n "${PLAIN_OF[$ref]:-}" ]; then
        PLAIN_OF[$p]=${PLAIN_OF[$ref]}
    else
        mkdir -p "$PLAIN/$p"
        if ! save "$p" "$PLAIN/$p" >"$TMP/$p.plain.log" 2>&1; then
            fail "$p: saves into a plain directory" "$(tail -5 "$TMP/$p.plain.log")"
            continue
        fi
        PLAIN_OF[$p]=$PLAIN/$p
    fi
    mkdir "$MNT/$p"
    expect_ok "$p: saves into the mount" save "$p" "$MNT/$p"
    t_end=$(now)
    state=none
    for _ in $(seq 1200); do
        state=$(state_of "$MNT/$p")
        [ "$state" = committed ] && break
        sleep 0.1
    done
    t_commit=$(now)
    if [ "$state" = committed ]; then
        COMMIT_S[$p]=$(awk -v a="$t_end" -v b="$t_commit" 'BEGIN { printf "%.1f", b - a }')
        pass "$p: committed on its own, ${COMMIT_S[$p]} s after the save returned"
    else
        fail "$p: committed on its own" "state $state after 120 s"
    fi
    expect_ok "$p: every file identical to the plain copy" "$VPY" "$DRIVER" compare "${PLAIN_OF[$p]}" "$MNT/$p"
    last_stdout_has "$p: (sha256)" "identical"
    expect_ok "$p: loads back through the mount" bash -c "cd '$MNT/$p' && '$VPY' '$DRIVER' check $p"
    grep -q "differ" "$LAST_OUT" "$LAST_ERR" 2>/dev/null && cat "$LAST_OUT" "$LAST_ERR" | head -3
    GENS[$p]=$(grep -c "checkpoint '$p/.*' committed:" "$LOG")
done

if unmount_ckptfs "$MNT"; then pass "unmount ends the daemon with status 0"
else fail "unmount ends the daemon with status 0" "$(tail -3 "$LOG")"; fi
stray=$(find "$BACK/.ckptfs/stage" -mindepth 1 2>/dev/null | head -3; find "$BACK" -name '*.tmp' | head -3)
[ -z "$stray" ] && pass "no staging or temporary pack left after the final commits" ||
    fail "no staging or temporary pack left after the final commits" "$stray"

mount_ckptfs "$BACK" "$MNT" "$LOG" || { fail "remount" "$(tail -3 "$LOG")"; finish; }
for p in "${PATTERNS[@]}"; do
    [ -n "${PLAIN_OF[$p]:-}" ] || continue
    expect_ok "$p: after a remount, every file identical" "$VPY" "$DRIVER" compare "${PLAIN_OF[$p]}" "$MNT/$p"
    expect_ok "$p: and loads back" bash -c "cd '$MNT/$p' && '$VPY' '$DRIVER' check $p"
    expect_ok "$p: every pack compressed" "$VPY" "$DRIVER" packs "$BACK/$p" "$CKPT"
    ratio=$(grep -o 'ratio [0-9.]*' "$LAST_OUT" | cut -d' ' -f2)
    packs=$(grep -o 'ok: [0-9]* packs' "$LAST_OUT" | cut -d' ' -f2)
    echo "REPORT $p: ${GENS[$p]:-?} pack generations over ${packs:-?} packs, final commit ${COMMIT_S[$p]:-?} s after the save, ratio ${ratio:-?}"
done
unmount_ckptfs "$MNT"

if grep -qiE "sanitizer|assert|packing failed" "$LOG"; then
    fail "no crash traces or failed packs in the log" "$(grep -iE 'sanitizer|assert|packing failed' "$LOG" | head -3)"
else pass "no crash traces or failed packs in the log"; fi
finish
