#!/usr/bin/env bash
# The mount on S3 (ckptfs s3://BUCKET/PREFIX MNT) against a real Ceph RADOS
# Gateway (../shared/services/ceph-rgw.sh), with boto3 (s3_client.py) as
# the independent client that checks what landed in the bucket:
#   - wrong credentials and a missing bucket fail the mount at once
#   - packs made by ckpt pack -o s3://, namespaces included, read back
#     byte-identical through a read-only mount; cache_dir fills (with the
#     readahead's segments), serves hits, treats a damaged file as a miss,
#     and holds no plaintext of an encrypted pack; a full cache_dir warns once
#   - a writable mount packs a checkpoint to PREFIX/NAME.tpack with no
#     upload left behind; a second read-only mount sees it within
#     list_interval; a second writable mount is refused naming the holder;
#     rm -r deletes the object; a damaged object is deleted, a damaged or
#     healthy one replaced meanwhile by another writer is not; a damaged
#     .tfile is removed
#   - the gateway killed in a read through the mount: completes or EIO
#     within the retry bound
#   - a checkpoint first opened with the gateway down: EIO, unreachable,
#     not damaged, rmdir deletes nothing; then every operation fails at
#     once, ckpt status exits 4 naming the endpoint; byte-identical once
#     it is back, no remount
#   - the daemon SIGKILLed in an upload: no object; the next writable
#     mount aborts the upload
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/mount_lib.sh"

. "$(dirname "$0")/gateway_lib.sh"
gateway_prerequisites
trap 'unmount_all; stop_gateway; cleanup_tmp' EXIT
start_gateway ckpt-mnt
export XDG_CACHE_HOME=$TMP/xdg

cd "$TMP" || exit 1
"$CKPT_GEN" tiny >/dev/null
"$CKPT_GEN" big --preset gpt2 >/dev/null
"$CKPT" keygen -o key >/dev/null
LOG=$TMP/ckptfs.log

# sha256 of every file of the source, in the source and in the mount (which
# also shows manifest.json and tensors/).
sha_tree() { (cd "$1" && find . -type f -printf '%P\n' | LC_ALL=C sort | while IFS= read -r f; do printf '%s %s\n' "$f" "$(sha256sum <"$2/$f" | cut -d' ' -f1)"; done); }
expect_same_files() {
    local d
    if d=$(diff <(sha_tree "$2" "$PWD/$2") <(sha_tree "$2" "$PWD/$3")); then pass "$1 ($(find "$2" -type f | wc -l) files)"; else fail "$1" "$(printf '%s\n' "$d" | head -n 6)"; fi
}
# Every tensor of the mount's tensors/ against the source's bytes.
expect_tensors_ok() {
    if $PY - "$2" "$3" >tensors.out 2>&1 <<'EOF'
import json, struct, sys, os, hashlib
src, mnt = sys.argv[1], sys.argv[2]
n = 0
for f in sorted(os.listdir(src)):
    if not f.endswith(".safetensors"):
        continue
    raw = open(os.path.join(src, f), "rb").read()
    hl = struct.unpack("<Q", raw[:8])[0]
    hdr = json.loads(raw[8:8 + hl])
    for name, t in hdr.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        want = raw[8 + hl + a: 8 + hl + b]
        cands = [os.path.join(mnt, "tensors", name), os.path.join(mnt, "tensors", f, name)]
        got = next((open(c, "rb").read() for c in cands if os.path.isfile(c)), None)
        if got is None or hashlib.sha256(got).digest() != hashlib.sha256(want).digest():
            sys.exit("tensor %s differs or is missing" % name)
        n += 1
print(n)
EOF
    then pass "$1 ($(cat tensors.out) tensors)"; else fail "$1" "$(tail -n 2 tensors.out)"; fi
}

expect_ok "pack big to s3://$BK/m/big.tpack" "$CKPT" pack big -o s3://$BK/m/big.tpack
expect_ok "pack tiny to the namespace s3://$BK/m/run1/tiny.tpack" "$CKPT" pack tiny -o s3://$BK/m/run1/tiny.tpack
expect_ok "pack big encrypted to s3://$BK/e/big.tpack" "$CKPT" pack big -o s3://$BK/e/big.tpack --key-file key

# ------------------------------------------------------- failing at mount
mkdir -p mnt-bad
run_cmd env AWS_SECRET_ACCESS_KEY=wrong-secret "$CKPTFS" -f -o ro s3://$BK/m mnt-bad
if [ "$LAST_RC" -ne 0 ] && ! mountpoint -q mnt-bad; then pass "wrong credentials: the mount fails (exit $LAST_RC)"; else fail "wrong credentials: the mount fails" "exit $LAST_RC"; fi
last_stderr_has "wrong credentials say so" "cannot mount s3://$BK/m"
grep -q "wrong-secret" "$LAST_ERR" && fail "the secret is not shown" || pass "the secret is not shown"
run_cmd "$CKPTFS" -f -o ro s3://no-such-bucket-$$/m mnt-bad
if [ "$LAST_RC" -ne 0 ] && ! mountpoint -q mnt-bad; then pass "a missing bucket: the mount fails"; else fail "a missing bucket: the mount fails" "exit $LAST_RC"; fi
last_stderr_has "a missing bucket says so" "no such bucket"
run_cmd "$CKPTFS" -f -o endpoint=ftp://x s3://$BK/m mnt-bad
if [ "$LAST_RC" -eq 2 ]; then pass "a bad endpoint is a usage error"; else fail "a bad endpoint is a usage error" "exit $LAST_RC"; fi

# ------------------------------------------ random reads: GETs per read
# A random 1 MiB read spans 2-3 chunks that no one has read yet; they lie
# back to back in the pack, and each was its own ranged GET, started at
# once, where the gateway's time to answer a GET, not its bytes, is most
# of the latency: one GET for them all. The gateway's own counter of GETs
# (its admin socket) is the witness. With cache_dir, each chunk of such a
# GET is kept on its own: a later read of one of them alone is a hit.
rgw_reads() {
    "$PY" - "$1" big/model.safetensors "$RGW/run/client.rgw.a.asok" "${@:2}" <<'EOF_PY'
import json, os, subprocess, sys, time
got, want = (os.open(p, os.O_RDONLY) for p in sys.argv[1:3])
gets = lambda: json.loads(subprocess.check_output(
    ["ceph", "--admin-daemon", sys.argv[3], "perf", "dump"]))["rgw"]["get"]
out = []
for spec in sys.argv[4:]:  # OFFSET:LENGTH[:SETTLE_MS], far from 0 (a read at 0 is sequential)
    off, n, settle = (int(x) for x in (spec + ":0").split(":")[:3])
    before = gets()
    data = os.pread(got, n, off)
    time.sleep(settle / 1e3)  # for the GETs a read sets off in the background
    out.append("%d%s" % (gets() - before, "" if data == os.pread(want, n, off) else "(differs)"))
print(" ".join(out))
EOF_PY
}
M=$((1 << 20))
RUNS="$((5 * M + M / 2)):$M $((17 * M + M / 4)):$M $((40 * M + M / 8)):$M"
for p in m e; do
    opts=ro,list_interval=3600,cache_dir=$TMP/cache-rr-$p
    [ $p = e ] && opts=$opts,key_file=$TMP/key
    mount_ckptfs s3://$BK/$p mnt-rr "$LOG" -o "$opts" || fail "mount s3://$BK/$p for random reads" "$(tail -n 3 "$LOG")"
    stat mnt-rr/big/model.safetensors >/dev/null # opens the pack: its HEAD and index GETs
    # shellcheck disable=SC2086
    got=$(rgw_reads mnt-rr/big/model.safetensors $RUNS)
    unmount_ckptfs mnt-rr
    [ "$got" = "1 1 1" ] && pass "s3://$BK/$p: random 1 MiB reads over several chunks are one GET each, byte-identical ($got)" || fail "s3://$BK/$p: random reads over several chunks are one GET each, byte-identical" "GETs per read: $got"
done
# A random 2 MiB read reaches the daemon as 3 requests of 1 MiB back to
# back (the kernel reads on past its end): taken for a sequential reader
# from the second on, it set off prefetch and the store's readahead, 12-17
# GETs. Now one GET a request.
mount_ckptfs s3://$BK/m mnt-rr "$LOG" -o ro,list_interval=3600 || fail "mount for random 2 MiB reads" "$(tail -n 3 "$LOG")"
stat mnt-rr/big/model.safetensors >/dev/null
got=$(rgw_reads mnt-rr/big/model.safetensors $((9 * M + M / 2)):$((2 * M)):300 $((30 * M + M / 4)):$((2 * M)):300)
unmount_ckptfs mnt-rr
read -r g1 g2 <<<"$got"
[ "${g1%(*}" -le 4 ] 2>/dev/null && [ "${g2%(*}" -le 4 ] && [ "$got" = "${got//differs/}" ] && pass "random 2 MiB reads set off no readahead: at most 4 GETs each, byte-identical ($got)" || fail "random 2 MiB reads set off no readahead" "GETs per read: $got"
mount_ckptfs s3://$BK/m mnt-rr "$LOG" -o ro,list_interval=3600,cache_dir="$TMP/cache-rr-m" || fail "remount for random reads" "$(tail -n 3 "$LOG")"
stat mnt-rr/big/model.safetensors >/dev/null
got=$(rgw_reads mnt-rr/big/model.safetensors $((5 * M + M / 2 + 3 * M / 4)):65536 $((17 * M + M / 4 + 7 * M / 8)):65536)
unmount_ckptfs mnt-rr
[ "$got" = "0 0" ] && pass "a later read of one chunk of such a GET is a cache_dir hit ($got GETs)" || fail "a later read of one chunk of such a GET is a cache_dir hit" "GETs per read: $got"
# A new daemon (a read near one before counts as sequential and prefetches
# on): the same runs again are read chunk by chunk from cache_dir.
mount_ckptfs s3://$BK/m mnt-rr "$LOG" -o ro,list_interval=3600,cache_dir="$TMP/cache-rr-m" || fail "remount for random reads" "$(tail -n 3 "$LOG")"
stat mnt-rr/big/model.safetensors >/dev/null
# shellcheck disable=SC2086
got=$(rgw_reads mnt-rr/big/model.safetensors $RUNS)
unmount_ckptfs mnt-rr
[ "$got" = "0 0 0" ] && pass "the runs read again are cache_dir hits, byte-identical ($got GETs)" || fail "the runs read again are cache_dir hits, byte-identical" "GETs per read: $got"

# ------------------------------------------------------ read-only mount
if mount_ckptfs s3://$BK/m mnt-ro "$LOG" -o ro,cache_dir="$TMP/cache",cache_size=1M,list_interval=2; then pass "read-only mount of s3://$BK/m"; else fail "read-only mount" "$(tail -n 5 "$LOG")"; finish; fi
ls mnt-ro >ls.out 2>&1
grep -qx big ls.out && grep -qx run1 ls.out && pass "the root shows big/ and the namespace run1/" || fail "the root shows big/ and run1/" "$(cat ls.out)"
expect_same_files "big read through the mount is byte-identical" big mnt-ro/big
expect_same_files "run1/tiny (a namespace) is byte-identical" tiny mnt-ro/run1/tiny
t=$(stat -c %Y mnt-ro/run1)
[ "$t" -ge "$(($(date +%s) - 3600))" ] && pass "the namespace's mtime is the mount's, not 1970" ||
    fail "the namespace's mtime is the mount's, not 1970" "$t"
expect_tensors_ok "every tensor of big is byte-identical" big mnt-ro/big
n1=$(find cache -type f | wc -l)
[ "$n1" -gt 0 ] && pass "cache_dir holds $n1 stored chunks after the first read" || fail "cache_dir fills" "empty"
cat mnt-ro/big/model.safetensors >/dev/null
n2=$(find cache -type f | wc -l)
[ "$n2" -eq "$n1" ] && pass "a second read adds nothing to the cache" || fail "a second read adds nothing" "$n1 -> $n2"
unmount_ckptfs mnt-ro
hits=$(sed -nE 's/.*cache_dir .*: ([0-9]+) hits.*/\1/p' "$LOG" | tail -n 1)
[ "${hits:-0}" -gt 0 ] && pass "cache hits are counted ($(grep -o 'cache_dir.*held' "$LOG" | tail -n 1))" || fail "cache hits counted" "$(grep cache_dir "$LOG" | tail -n 1)"
# The decoded-chunk memory cache is gone with the daemon: this read is the
# disk cache's.
mount_ckptfs s3://$BK/m mnt-ro "$LOG" -o ro,cache_dir="$TMP/cache",cache_size=1M || fail "remount" "$(tail -n 3 "$LOG")"
expect_same_files "a remount reads big from the cache byte-identical" big mnt-ro/big
unmount_ckptfs mnt-ro
# The readahead starts once a reader has read 8 MiB in order, so where it
# first fetches a whole 16 MiB segment depends on the order the workers'
# chunk reads come in, and the chunks before it are cached one by one. A
# remount whose readahead started a segment earlier fetched that segment
# whole again (one miss of 4.2 MB in CI, 2 remounts in 8 here); it is now
# filled from the chunks' entries: no miss, no byte from the gateway.
misses=$(grep "cache_dir" "$LOG" | tail -n 1 | sed -nE 's/.* ([0-9]+) misses \(([0-9.]+) MB\).*/\1 \2/p')
[ "$misses" = "0 0.0" ] && pass "the remount's reads were all cache hits, nothing fetched ($(grep -o 'cache_dir.*held' "$LOG" | tail -n 1))" || fail "the remount's reads were all cache hits, nothing fetched" "$(grep -o 'cache_dir.*held' "$LOG" | tail -n 1)"
# A sequential read keeps the readahead's 16 MiB segments (16 MiB, their
# CRCs and a trailer, so over 16M to find), which a later one reads back.
nseg=$(find cache -type f -size +16M | wc -l)
[ "$nseg" -gt 0 ] && pass "cache_dir holds $nseg readahead segments" || fail "cache_dir holds readahead segments" "$(ls -l cache | head -n 5)"
# Random reads, warm: 64 KiB in every MiB of the file, each far from the
# one before (so no readahead), chunks across two segments included. They
# went to the gateway (8 of 98 range reads missed), and each hit read its
# whole 4 MiB segment file, which made a warm read slower than one GET.
mount_ckptfs s3://$BK/m mnt-ro "$LOG" -o ro,cache_dir="$TMP/cache",cache_size=1M || fail "remount" "$(tail -n 3 "$LOG")"
pid=${DAEMON_OF[mnt-ro]}
"$PY" - mnt-ro/big/model.safetensors big/model.safetensors "/proc/$pid/io" >random.txt <<'EOF_PY'
import math, os, sys
got, want = (os.open(p, os.O_RDONLY) for p in sys.argv[1:3])
rchar = lambda: int(open(sys.argv[3]).read().split()[1])
n = os.fstat(want).st_size >> 20
step = next(s for s in range(n // 3, n) if math.gcd(s, n) == 1)
before, bad = rchar(), []
for i in range(1, n):  # not offset 0, where a reader counts as sequential
    off = (i * step % n) << 20
    if os.pread(got, 65536, off) != os.pread(want, 65536, off):
        bad.append(off)
print(n - 1, (rchar() - before) // (n - 1), ''.join(str(bad[:5]).split()))
EOF_PY
unmount_ckptfs mnt-ro
read -r nreads per bad <random.txt
[ "$bad" = "[]" ] && pass "$nreads random 64 KiB reads from the cache are byte-identical" || fail "random reads from the cache are byte-identical" "$(cat random.txt)"
grep "cache_dir" "$LOG" | tail -n 1 | grep -q " 0 misses" && pass "random reads, chunks across segments included, were all cache hits ($(grep -o 'cache_dir.*held' "$LOG" | tail -n 1))" || fail "random reads were all cache hits" "$(grep -o 'cache_dir.*held' "$LOG" | tail -n 1)"
[ "${per:-99999999}" -lt $((3 << 20)) ] && pass "a random read from a segment reads its part of the file, not all 16 MiB ($per bytes a read)" || fail "a random read reads its part of the segment file, not all 16 MiB" "$per bytes read by the daemon a read"
# Damaged cache files are misses, never served: two segments from the
# middle of the pack, one cut short by a byte, one with a flipped bit.
"$PY" - cache >damage.txt <<'EOF_PY'
import os, sys
d = sys.argv[1]
segs = sorted((int(f.split('-')[1], 16), f) for f in os.listdir(d) if f.endswith('-1000000'))
a, b = (os.path.join(d, segs[len(segs) // 2 + i][1]) for i in (0, 1))
os.truncate(a, os.path.getsize(a) - 1)
with open(b, 'r+b') as f:
    f.seek(1 << 20); c = f.read(1); f.seek(1 << 20); f.write(bytes([c[0] ^ 4]))
print("damaged", a, b)
EOF_PY
mount_ckptfs s3://$BK/m mnt-ro "$LOG" -o ro,cache_dir="$TMP/cache",cache_size=1M || fail "remount" "$(tail -n 3 "$LOG")"
expect_same_files "a truncated and a corrupted cache file: big still reads byte-identical" big mnt-ro/big
unmount_ckptfs mnt-ro
misses=$(grep "cache_dir" "$LOG" | tail -n 1 | sed -nE 's/.* ([0-9]+) misses.*/\1/p')
[ "${misses:-0}" -ge 2 ] && pass "the two damaged files were misses ($(grep -o 'cache_dir.*held' "$LOG" | tail -n 1))" || fail "the two damaged files were misses" "$(cat damage.txt; grep -o 'cache_dir.*held' "$LOG" | tail -n 1)"
mount_ckptfs s3://$BK/m mnt-ro "$LOG" -o ro,cache_dir="$TMP/cache",cache_size=1M || fail "remount" "$(tail -n 3 "$LOG")"
cat mnt-ro/big/model.safetensors >/dev/null
unmount_ckptfs mnt-ro
grep "cache_dir" "$LOG" | tail -n 1 | grep -q " 0 misses" && pass "the damaged files were replaced: the next read is all hits" || fail "the damaged files were replaced" "$(grep -o 'cache_dir.*held' "$LOG" | tail -n 1)"

# A cache_dir on a full file system keeps nothing: big still reads from
# the gateway, with one warning naming the directory, not one per read.
mkdir -p small
if mount -t tmpfs -o size=4m,mode=700 tmpfs small; then
    n0=$(wc -l <"$LOG")
    mount_ckptfs s3://$BK/m mnt-ro "$LOG" -o ro,cache_dir="$TMP/small",cache_size=1M || fail "mount on a full cache_dir" "$(tail -n 3 "$LOG")"
    expect_same_files "a cache_dir on a full (4 MiB) file system: big still reads byte-identical" big mnt-ro/big
    unmount_ckptfs mnt-ro
    umount small
    nw=$(tail -n +$((n0 + 1)) "$LOG" | grep -c "cache directory $TMP/small: cannot keep what is read (write: No space left on device)")
    [ "$nw" -eq 1 ] && pass "one warning says the cache_dir is full" || fail "one warning says the cache_dir is full" "$nw: $(tail -n +$((n0 + 1)) "$LOG" | head -n 4)"
else
    fail "a 4 MiB tmpfs for the cache_dir" "mount -t tmpfs failed"
fi

# ----------------------------------- encrypted: no plaintext in the cache
mount_ckptfs s3://$BK/e mnt-enc "$LOG" -o ro,key_file="$TMP/key",cache_dir="$TMP/cache-enc" || fail "encrypted mount" "$(tail -n 3 "$LOG")"
expect_same_files "the encrypted pack reads byte-identical" big mnt-enc/big
unmount_ckptfs mnt-enc
s3py get $BK e/big.tpack enc-object.bin
$PY - big/model.safetensors enc-object.bin cache-enc >scan.txt <<'EOF'
import os, sys
src, enc, cdir = sys.argv[1:4]
src = open(src, 'rb').read()
name = b"h.0.attn.c_attn.weight"
hdr = int.from_bytes(src[:8], 'little') + 8
needle = src[hdr + 1000003: hdr + 1000003 + 64]
cache = b"".join(open(os.path.join(cdir, f), 'rb').read() for f in os.listdir(cdir))
print("cache-bytes", len(cache))
print("cache-name", cache.find(name) >= 0)
print("cache-data", cache.find(needle) >= 0)
print("object-name", open(enc, 'rb').read().find(name) >= 0)
EOF
grep -q "cache-name False" scan.txt && grep -q "cache-data False" scan.txt && grep -q "object-name False" scan.txt &&
    pass "cache_dir and the object hold no tensor name and no plaintext ($(sed -n 1p scan.txt))" || fail "no plaintext in the cache" "$(cat scan.txt)"
rm -f enc-object.bin

# --------------------------------------------------------- writable mount
if mount_ckptfs s3://$BK/w mnt-w "$LOG" -o commit_delay=0,stage_dir="$TMP/stage"; then pass "writable mount of s3://$BK/w"; else fail "writable mount" "$(tail -n 5 "$LOG")"; finish; fi
mount_ckptfs s3://$BK/w mnt-ro2 "$LOG" -o ro,list_interval=2 || fail "second read-only mount" "$(tail -n 3 "$LOG")"
ls mnt-ro2 >/dev/null
cp -r tiny mnt-w/new && pass "cp -r a safetensors checkpoint into the mount" || fail "cp -r into the mount"
expect_ok "ckpt commit --wait" "$CKPT" commit --wait mnt-w/new
s3py keys $BK w/ >keys.out
grep -qx "w/new.tpack" keys.out && pass "boto3 sees w/new.tpack" || fail "boto3 sees w/new.tpack" "$(cat keys.out)"
s3py uploads $BK w/ >ups.out
[ ! -s ups.out ] && pass "no multipart upload is left" || fail "no multipart upload is left" "$(cat ups.out)"
expect_same_files "the committed checkpoint reads byte-identical in the writable mount" tiny mnt-w/new
t0=$(date +%s.%N)
for _ in $(seq 100); do [ -d mnt-ro2/new ] && break; sleep 0.1; done
secs=$($PY -c "import time; print(round(time.time() - $t0, 1))")
if [ -d mnt-ro2/new ]; then pass "the second (read-only) mount sees it after ${secs} s (list_interval 2)"; else fail "the second mount sees it" "after ${secs} s"; fi
expect_same_files "and reads it byte-identical" tiny mnt-ro2/new
mkdir -p mnt-w2
run_cmd "$CKPTFS" -f -o stage_dir="$TMP/stage2" s3://$BK/w mnt-w2
if [ "$LAST_RC" -ne 0 ] && ! mountpoint -q mnt-w2; then pass "a second writable mount of the prefix fails"; else fail "a second writable mount fails" "exit $LAST_RC"; fi
last_stderr_has "and names the holder" "locked by $(hostname):"
mkdir mnt-w/ns && cp -r tiny mnt-w/ns/deep && "$CKPT" commit --wait mnt-w/ns/deep >/dev/null 2>&1
s3py keys $BK w/ns/ | grep -qx "w/ns/deep.tpack" && pass "a namespace: w/ns/deep.tpack" || fail "a namespace: w/ns/deep.tpack" "$(s3py keys $BK w/)"
rm -r mnt-w/new && pass "rm -r the checkpoint" || fail "rm -r the checkpoint"
s3py keys $BK w/ | grep -qx "w/new.tpack" && fail "rm -r deletes the object" "still there" || pass "rm -r deletes the object"
grep -qF "checkpoint 'new' deleted (s3://$BK/w/new.tpack removed)" "$LOG" && pass "the log names the deleted object" ||
    fail "the log names the deleted object" "$(grep "'new' deleted" "$LOG")"
# A damaged object is deleted where it is seen, as a local pack is.
head -c 5000 /dev/urandom >garbage.bin
s3py put $BK w/garbage.tpack garbage.bin
for _ in $(seq 100); do [ -d mnt-w/garbage ] && break; sleep 0.1; done
expect_fail "a damaged object: listing it fails" ls mnt-w/garbage
expect_ok "  rm -r of it" rm -r mnt-w/garbage
s3py keys $BK w/ | grep -qx "w/garbage.tpack" && fail "  deletes the object" "still there" || pass "  deletes the object"
grep -q "checkpoint 'garbage': the pack deleted was damaged: .*garbage.tpack" "$LOG" &&
    pass "  the log says it was damaged" || fail "  the log says it was damaged" "$(grep "'garbage'" "$LOG")"
unmount_ckptfs mnt-ro2
# A damaged object replaced by another writer after the mount found it
# damaged: rmdir deleted the key whatever it held by then. It now deletes
# only the object it saw (a HEAD's ETag compared first: RGW 16.2 ignores
# If-Match on a DELETE), so the new pack survives. And a damaged .tfile
# is a file that rm removes (its lookup failed with EIO, and rm with it).
s3py put $BK d/g.tpack garbage.bin
s3py put $BK d/h.tfile garbage.bin
mkdir -p empty
"$CKPT" pack empty -o s3://$BK/d/e.tpack >/dev/null 2>&1 || fail "an empty pack d/e.tpack"
"$CKPT" pack tiny -o s3://$BK/d/f.tpack >/dev/null 2>&1 || fail "a pack d/f.tpack"
mount_ckptfs s3://$BK/d mnt-d "$LOG" -o commit_delay=0,list_interval=3600,stage_dir="$TMP/stage-d" || fail "writable mount of s3://$BK/d" "$(tail -n 3 "$LOG")"
expect_fail "a damaged object: listing it fails" ls mnt-d/g
"$CKPT" pack tiny -o s3://$BK/d/g.tpack -f >/dev/null 2>&1 || fail "another writer replaces d/g.tpack"
good=$(s3py size $BK d/g.tpack)
errno_of() { $PY "$ROOT/tests/integration/write_clients.py" errno-of "$@" 2>&1; }
# The kernel tries an rmdir that got ESTALE once more, looking the name
# up again: the mount then finds the new pack, which is not empty.
got=$(errno_of rmdir mnt-d/g)
[ "$got" = ENOTEMPTY ] && pass "  rmdir of it once replaced: ENOTEMPTY" || fail "  rmdir of it once replaced: ENOTEMPTY" "$got"
[ "$(s3py size $BK d/g.tpack)" = "$good" ] && pass "  the replacing pack survives ($good bytes)" || fail "  the replacing pack survives" "$(s3py size $BK d/g.tpack), want $good"
grep -qF "checkpoint 'g': s3://$BK/d/g.tpack: not removed: replaced since it was seen" "$LOG" && pass "  the log says why" ||
    fail "  the log says why" "$(grep "'g'" "$LOG" | tail -n 2)"
# The same for a healthy pack: rmdir of an empty one deleted the key
# whatever it held by then (by name, unconditionally); so did rm -r of one
# with files, replaced after its first unlink reopened it for writing.
survives() { # NAME: the replacing pack d/NAME.tpack is there, and the log says why
    [ "$(s3py size $BK d/$1.tpack)" = "$good" ] && pass "  the replacing pack survives ($good bytes)" ||
        fail "  the replacing pack survives" "$(s3py size $BK d/$1.tpack), want $good"
    grep -qF "checkpoint '$1': s3://$BK/d/$1.tpack: not removed: replaced since it was seen" "$LOG" &&
        pass "  the log says why" || fail "  the log says why" "$(grep "'$1'" "$LOG" | tail -n 2)"
}
ls mnt-d/e >/dev/null || fail "an empty pack lists"
"$CKPT" pack tiny -o s3://$BK/d/e.tpack -f >/dev/null 2>&1 || fail "another writer replaces d/e.tpack"
good=$(s3py size $BK d/e.tpack)
got=$(errno_of rmdir mnt-d/e)
[ "$got" = ENOTEMPTY ] && pass "rmdir of an empty pack replaced since it was listed: ENOTEMPTY" ||
    fail "rmdir of an empty pack replaced since it was listed: ENOTEMPTY" "$got"
survives e
rm mnt-d/f/config.json || fail "rm of a file of d/f reopens it"
"$CKPT" pack tiny -o s3://$BK/d/f.tpack -f >/dev/null 2>&1 || fail "another writer replaces d/f.tpack"
good=$(s3py size $BK d/f.tpack)
expect_fail "rm -r of a pack replaced since it was reopened" rm -r mnt-d/f
survives f
[ -f mnt-d/h ] && pass "a damaged .tfile shows as a file" || fail "a damaged .tfile shows as a file" "$(stat mnt-d/h 2>&1)"
got=$(errno_of read mnt-d/h)
[ "$got" = EIO ] && pass "  reading it: EIO" || fail "  reading it: EIO" "$got"
expect_ok "  rm of it" rm mnt-d/h
[ "$(s3py size $BK d/h.tfile)" = absent ] && pass "  deletes the object" || fail "  deletes the object" "$(s3py size $BK d/h.tfile)"
grep -q "checkpoint 'h': the pack deleted was damaged: .*h.tfile" "$LOG" && pass "  the log says it was damaged" || fail "  the log says it was damaged" "$(grep "'h'" "$LOG" | tail -n 2)"
unmount_ckptfs mnt-d
rm -f garbage.bin

# --------------------------------------- the daemon killed in an upload
# Polled with curl (boto3 starts too slowly); one packing thread makes the
# upload last long enough to be caught.
upload_started() {
    curl -s --aws-sigv4 "aws:amz:us-east-1:s3" --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" \
        -H "x-amz-content-sha256: UNSIGNED-PAYLOAD" "$S3_ENDPOINT/$BK?prefix=w%2F&uploads=" |
        grep -q "<Upload>"
}
unmount_ckptfs mnt-w
mount_ckptfs s3://$BK/w mnt-w "$LOG" -o commit_delay=0,threads=1,stage_dir="$TMP/stage" || fail "writable remount, one thread" "$(tail -n 3 "$LOG")"
cp -r big mnt-w/crash
"$CKPT" commit mnt-w/crash >/dev/null 2>&1
for _ in $(seq 400); do upload_started && break; sleep 0.02; done
if upload_started; then
    kill -9 "${DAEMON_OF[mnt-w]}"
    sleep 0.5
    fusermount3 -u -z mnt-w 2>/dev/null
    unset "DAEMON_OF[mnt-w]"
    pass "the daemon is SIGKILLed in the middle of the upload"
    s3py keys $BK w/ | grep -qx "w/crash.tpack" && fail "no partial pack is visible" "w/crash.tpack exists" || pass "no partial pack is visible"
    mount_ckptfs s3://$BK/w mnt-w "$LOG" -o commit_delay=0,stage_dir="$TMP/stage" || fail "writable remount" "$(tail -n 3 "$LOG")"
    grep -q "aborted 1 unfinished upload" "$LOG" && pass "the next writable mount aborts the upload" || fail "the next mount aborts the upload" "$(grep -i upload "$LOG" | tail -n 2)"
    expect_ok "the staged checkpoint is packed again and committed" "$CKPT" commit --wait mnt-w/crash
    s3py uploads $BK w/ >ups.out
    [ ! -s ups.out ] && pass "boto3: no multipart upload left (the killed one aborted, the new one completed)" || fail "boto3: no multipart upload left" "$(cat ups.out)"
    expect_same_files "and reads byte-identical" big mnt-w/crash
    unmount_ckptfs mnt-w
else
    fail "the upload started" "no upload seen"
    unmount_ckptfs mnt-w
fi

# ------------------------------------------- in the background (no -f)
# The daemon forks after taking the lease (its renewer stopped across the
# fork): the lease must then name the daemon, which writes, commits and
# deletes the lease when unmounted.
"$CKPTFS" -o commit_delay=0,stage_dir="$TMP/stage" s3://$BK/w mnt-w 2>>"$LOG"
if [ $? -eq 0 ] && mountpoint -q mnt-w; then pass "a writable mount in the background"; else fail "a writable mount in the background" "$(tail -n 3 "$LOG")"; fi
s3py get $BK w/.ckptfs/lock lease.txt
bg_pid=$(sed -nE "s/^holder $(hostname):([0-9]+)$/\1/p" lease.txt)
if [ -n "$bg_pid" ] && [ "$(cat "/proc/$bg_pid/comm" 2>/dev/null)" = ckptfs ]; then pass "the lease names the daemon (pid $bg_pid)"; else fail "the lease names the daemon" "$(cat lease.txt)"; fi
# It holds the gateway's credentials, key or not: no core dump may take them.
if [ -n "$bg_pid" ] && grep -Eq '^Max core file size +0 +0' "/proc/$bg_pid/limits"; then
    pass "core dumps are off in a daemon holding S3 credentials"
else
    fail "core dumps are off in a daemon holding S3 credentials" "$(grep core "/proc/$bg_pid/limits" 2>&1)"
fi
cp -r tiny mnt-w/bg && "$CKPT" commit --wait mnt-w/bg >/dev/null 2>&1
expect_same_files "it writes and commits a checkpoint" tiny mnt-w/bg
rm -r mnt-w/bg
fusermount3 -u mnt-w
for _ in $(seq 100); do kill -0 "$bg_pid" 2>/dev/null || break; sleep 0.1; done
kill -0 "$bg_pid" 2>/dev/null && fail "the daemon exits when unmounted" "pid $bg_pid" || pass "the daemon exits when unmounted"
s3py keys $BK w/.ckptfs/ | grep -qx "w/.ckptfs/lock" && fail "and deletes its lease" "still there" || pass "and deletes its lease"

# ------------------------- a pack replaced in the store under an open file
# The open file keeps its generation or fails with ESTALE: it never reads
# bytes of the new object (every GET carries If-Match: the ETag at open).
"$CKPT_GEN" tiny2 --preset tiny --seed 7 >/dev/null
expect_ok "pack tiny to s3://$BK/r/x.tpack (64K chunks)" "$CKPT" pack tiny -o s3://$BK/r/x.tpack --chunk-size 64K
mount_ckptfs s3://$BK/r mnt-r "$LOG" -o ro,cache_size=1M || fail "mount for the replacement" "$(tail -n 3 "$LOG")"
cat >replace.py <<'EOF'
import errno, os, subprocess, sys
here, ckpt, bk = sys.argv[1:4]
old = open(os.path.join(here, "tiny/model.safetensors"), "rb").read()
f = open(os.path.join(here, "mnt-r/x/model.safetensors"), "rb")
assert f.read(4096) == old[:4096]
subprocess.run([ckpt, "pack", os.path.join(here, "tiny2"), "-o", "s3://%s/r/x.tpack" % bk, "-f",
                "--chunk-size", "64K"], check=True, stdout=subprocess.DEVNULL)
os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
f.seek(0)
try:
    got = f.read()
except OSError as e:
    if e.errno != errno.ESTALE:
        sys.exit("failed with %s, not ESTALE" % e)
    print("ESTALE")
else:
    if got != old:
        sys.exit("read bytes that are not its generation's")
    print("its own generation")
EOF
expect_ok "an open file reads its generation or ESTALE after the object is replaced" $PY replace.py "$PWD" "$CKPT" "$BK"
unmount_ckptfs mnt-r

# ------------------------------ the gateway killed in a read through the mount
mount_ckptfs s3://$BK/m mnt-k "$LOG" -o ro,threads=1 || fail "mount for the gateway kill" "$(tail -n 3 "$LOG")"
t0=$(date +%s.%N)
dd if=mnt-k/big/model.safetensors of=kill.bin bs=1M iflag=direct 2>kill.err &
rd=$!
sleep 0.2
kill -9 "$(rgw_pid)"
sleep 2
restart_rgw
wait $rd
rc=$?
secs=$($PY -c "import time; print(round(time.time() - $t0, 1))")
if [ $rc -eq 0 ] && cmp -s kill.bin big/model.safetensors; then pass "a read with the gateway killed completes byte-identical (${secs} s)"
elif [ $rc -ne 0 ] && grep -q "Input/output error" kill.err; then pass "a read with the gateway killed fails cleanly with EIO (${secs} s)"
else fail "a read with the gateway killed completes or fails with EIO" "rc $rc: $(head -c 200 kill.err)"; fi
$PY -c "import sys; sys.exit(0 if $secs < 45 else 1)" && pass "within the retry bound: ${secs} s" || fail "within the retry bound" "${secs} s"
for _ in $(seq 100); do curl -s -o /dev/null "$S3_ENDPOINT/" && break; sleep 0.2; done
unmount_ckptfs mnt-k

# ------------------- a checkpoint first opened while the gateway is down
# No answer from the store says nothing about the pack: it is not taken
# for damaged (which is remembered until a remount, and which rmdir
# deletes), and reads once the gateway is back. The first request to find
# the gateway gone waits out the store's retries (10 s); then the store is
# marked down, and every operation of the mount (lookups, getfattr, the
# listing's refresh every second, opens of other packs) fails at once with
# EIO until a probe finds it back.
expect_ok "pack tiny to s3://$BK/t/keep.tpack" "$CKPT" pack tiny -o s3://$BK/t/keep.tpack
for i in 1 2 3 4; do "$CKPT" pack tiny -o s3://$BK/t/k$i.tpack >/dev/null || fail "pack k$i"; done
mount_ckptfs s3://$BK/t mnt-t "$LOG" -o commit_delay=0,list_interval=1,stage_dir="$TMP/stage-t" || fail "writable mount for the outage" "$(tail -n 3 "$LOG")"
ls mnt-t >/dev/null
kill -9 "$(rgw_pid)"
expect_fail "gateway down: listing a checkpoint never opened fails" ls mnt-t/keep
last_stderr_has "  with EIO" "Input/output error"
state=$(getfattr -n user.ckptfs.state --only-values mnt-t/keep 2>&1)
[ "$state" = unreachable ] && pass "  and its state is unreachable, not damaged" || fail "  and its state is unreachable, not damaged" "$state"
expect_fail "  rmdir of it fails" rmdir mnt-t/keep
# Four checkpoints never opened, each read three ways, with the listing
# refreshed meanwhile: each used to wait out the retries on its own.
t0=$(date +%s.%N)
: >down.states
: >down.err
for i in 1 2 3 4; do
    getfattr -n user.ckptfs.state --only-values mnt-t/k$i >>down.states 2>>down.err
    echo >>down.states
    ls mnt-t/k$i >/dev/null 2>>down.err && echo "k$i listed" >>down.err
    cat mnt-t/k$i/model.safetensors >/dev/null 2>>down.err && echo "k$i read" >>down.err
    sleep 0.3
    ls mnt-t >/dev/null 2>>down.err
done
secs=$($PY -c "import time; print(round(time.time() - $t0, 1))")
$PY -c "import sys; sys.exit(0 if $secs < 8 else 1)" && pass "  4 checkpoints x 3 operations and 4 listings with the gateway down: ${secs} s (< 8)" || fail "  the others fail fast" "${secs} s"
[ "$(grep -c . down.states)" -eq 4 ] && ! grep -qv '^unreachable$' down.states && pass "  each is unreachable" || fail "  each is unreachable" "$(tr '\n' ' ' <down.states)"
[ "$(grep -c 'Input/output error' down.err)" -eq 8 ] && [ "$(grep -c . down.err)" -eq 8 ] && pass "  each ls and read fails with EIO" || fail "  each ls and read fails with EIO" "$(head -c 400 down.err)"
"$CKPT" status mnt-t >down.status 2>&1
rc=$?
[ $rc -eq 4 ] && pass "  ckpt status exits 4" || fail "  ckpt status exits 4" "rc $rc: $(head -c 300 down.status)"
[ "$(grep -c ' unreachable ' down.status)" -eq 5 ] && grep -qF "no answer from $S3_ENDPOINT" down.status && pass "  and names the store it cannot reach" || fail "  and names the store it cannot reach" "$(head -c 600 down.status)"
restart_rgw
for _ in $(seq 100); do curl -s -o /dev/null "$S3_ENDPOINT/" && break; sleep 0.2; done
sleep 2 # the mount's back-off after a failed try
expect_fail "gateway back: rmdir of the (non-empty) checkpoint fails" rmdir mnt-t/keep
last_stderr_has "  with ENOTEMPTY" "Directory not empty"
s3py keys $BK t/ | grep -qx "t/keep.tpack" && pass "  the object is still there" || fail "  the object is still there" "$(s3py keys $BK t/)"
expect_same_files "  and reads byte-identical without a remount" tiny mnt-t/keep
expect_same_files "  and so does another one" tiny mnt-t/k3
state=$(getfattr -n user.ckptfs.state --only-values mnt-t/keep 2>&1)
[ "$state" = committed ] && pass "  its state is committed" || fail "  its state is committed" "$state"
expect_ok "  ckpt status exits 0" "$CKPT" status mnt-t
unmount_ckptfs mnt-t
finish
