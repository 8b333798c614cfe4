#!/usr/bin/env bash
# The mount on S3 (ckptfs s3://...), against a real Ceph RGW on loopback:
# cold sequential read through the mount vs curl of the pack object vs s3fs
# (when installed), random 64 KiB reads vs one ranged GET, a warm read from
# cache_dir vs a mount of a local directory, and the daemon's peak RSS
# (VmHWM) during a download and an upload. Caches are dropped before the
# cold runs. Usage: bench/bench-s3-mount.sh [WORKDIR]
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=${B:-build}
BIN=$ROOT/$B/bin
W=${1:-$(mktemp -d /tmp/ckpt-bench-s3m.XXXXXX)}
mkdir -p "$W" && cd "$W" || exit 1
RGW_SH=$ROOT/../shared/services/ceph-rgw.sh
RGW_PORT=$(shuf -i 20000-29999 -n 1); MON_PORT=$(shuf -i 20000-29999 -n 1)
stop() { for m in m-ro m-w m-local m-s3fs; do fusermount3 -u -z "$W/$m" 2>/dev/null; done; RGW_PORT=$RGW_PORT MON_PORT=$MON_PORT bash "$RGW_SH" stop "$W/rgw" >/dev/null 2>&1; }
trap stop EXIT
RGW_PORT=$RGW_PORT MON_PORT=$MON_PORT bash "$RGW_SH" start "$W/rgw" >rgw.log 2>&1 || { tail rgw.log; exit 1; }
. "$W/rgw/env"; export AWS_ENDPOINT_URL=$S3_ENDPOINT XDG_CACHE_HOME=$W/xdg
PY=$(B=$B "$ROOT/scripts/venv.sh" s3); case $PY in /*) ;; *) PY=$ROOT/$PY ;; esac
"$PY" "$ROOT/tests/integration/s3_client.py" mkbucket bench
[ -d big ] || "$BIN/ckpt-gen" big --preset gpt2-medium >/dev/null 2>&1 || "$BIN/ckpt-gen" big --preset gpt2 >/dev/null
"$BIN/ckpt" pack big -o s3://bench/p/big.tpack >/dev/null
mkdir -p local; "$BIN/ckpt" pack big -o local/big.tpack >/dev/null
F=model.safetensors; SZ=$(stat -c %s big/$F); PACK=$(stat -c %s local/big.tpack)
now() { date +%s.%N; }
mbs() { python3 -c "print(round($1/1e6/($3-$2),1))"; }
drop() { sync; echo 3 >/proc/sys/vm/drop_caches; }
sig() { curl -s --aws-sigv4 "aws:amz:us-east-1:s3" --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" -H "x-amz-content-sha256: UNSIGNED-PAYLOAD" "$@"; }
hwm() { awk '/VmHWM/{print $2/1024 " MiB"}' /proc/"$1"/status; }
mnt() { mkdir -p "$2"; "$BIN/ckptfs" -f "${@:3}" "$1" "$2" 2>>ckptfs.log & P=$!; for _ in $(seq 200); do mountpoint -q "$2" && return; sleep 0.05; done; }
echo "checkpoint: $F $((SZ>>20)) MiB, pack $((PACK>>20)) MiB"
drop; t0=$(now); sig -o curl.bin "$S3_ENDPOINT/bench/p/big.tpack"; t1=$(now)
echo "curl GET of the pack object:              $(mbs $PACK $t0 $t1) MB/s (pack bytes)"
mnt s3://bench/p m-ro -o ro; drop; t0=$(now); cat m-ro/big/$F >/dev/null; t1=$(now)
echo "cold sequential read through the mount:   $(mbs $SZ $t0 $t1) MB/s (checkpoint bytes), daemon VmHWM $(hwm $P)"
python3 - m-ro/big/$F $SZ <<'P'
import os, random, statistics, sys, time
fd = os.open(sys.argv[1], os.O_RDONLY); n = int(sys.argv[2]); random.seed(1); lat = []
for _ in range(40):
    off = random.randrange(0, n - 65536) & ~4095
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); t = time.perf_counter(); os.pread(fd, 65536, off); lat.append(time.perf_counter() - t)
print("random 64 KiB read through the mount:     median %.2f ms (cold-ish: the decoded-chunk cache keeps chunks it saw)" % (statistics.median(lat) * 1e3))
P
lat=(); for i in $(seq 20); do o=$((RANDOM * 4096)); t0=$(now); sig -o /dev/null -H "Range: bytes=$o-$((o+65535))" "$S3_ENDPOINT/bench/p/big.tpack"; t1=$(now); lat+=("$(python3 -c "print(($t1-$t0)*1e3)")"); done
echo "one ranged 64 KiB GET (curl):             median $(printf '%s\n' "${lat[@]}" | sort -n | sed -n 10p | cut -c1-5) ms"
fusermount3 -u m-ro; wait $P
mnt s3://bench/p m-ro -o ro,cache_dir="$W/cache",cache_size=1M; cat m-ro/big/$F >/dev/null; fusermount3 -u m-ro; wait $P
mnt s3://bench/p m-ro -o ro,cache_dir="$W/cache",cache_size=1M; drop; t0=$(now); cat m-ro/big/$F >/dev/null; t1=$(now)
echo "warm read from cache_dir (new daemon):    $(mbs $SZ $t0 $t1) MB/s"; fusermount3 -u m-ro; wait $P
mnt local m-local -o ro,cache_size=1M; drop; t0=$(now); cat m-local/big/$F >/dev/null; t1=$(now)
echo "the same from a local backing directory:  $(mbs $SZ $t0 $t1) MB/s"; fusermount3 -u m-local; wait $P
if command -v s3fs >/dev/null; then
    echo "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" >pw; chmod 600 pw; mkdir -p m-s3fs
    s3fs bench m-s3fs -o passwd_file=pw,url=$S3_ENDPOINT,use_path_request_style,ro && sleep 1
    drop; t0=$(now); cat m-s3fs/p/big.tpack >/dev/null; t1=$(now)
    echo "s3fs cat of the pack object:              $(mbs $PACK $t0 $t1) MB/s (pack bytes)"; fusermount3 -u m-s3fs
else echo "s3fs: not installed"; fi
mnt s3://bench/w m-w -o stage_dir="$W/stage",commit_delay=0; cp -r big m-w/up; t0=$(now); "$BIN/ckpt" commit --wait m-w/up >/dev/null; t1=$(now)
echo "writable mount: pack+upload after cp:      $(mbs $SZ $t0 $t1) MB/s, daemon VmHWM $(hwm $P)"; fusermount3 -u m-w; wait $P
