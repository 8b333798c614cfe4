#!/usr/bin/env bash
# The mount on S3 (ckptfs s3://...), against a real Ceph RGW on loopback:
# cold sequential read through the mount vs curl of the pack object vs s3fs
# reading the same safetensors from the same gateway (when installed),
# loading that safetensors into CPU memory with Run:ai's model streamer
# straight from the gateway vs through the mount, random 64 KiB reads vs
# one ranged GET, a warm read from cache_dir vs a mount of a local
# directory, and the daemon's peak RSS (VmHWM) during a download and an
# upload. Caches are dropped before the cold runs; every cold run is a new
# daemon (or s3fs); the comparisons are the median of 3 runs, with the load
# average printed beside them (the machine may be shared).
# Usage: bench/bench-s3-mount.sh [WORKDIR]
#   RANDOM_ONLY=1: only the random reads, and a cold sequential read
#   SEQ_ONLY=1: only the cold sequential reads (curl, the mount; no s3fs)
#   BASE_CKPTFS=PATH: also run those through this ckptfs (an older build),
#   alternating with this one, for a before/after in the same run
#   ROUNDS=N: runs of each cold sequential read (default 3)
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
med() { printf '%s\n' "$@" | sort -g | sed -n "$((($# + 1) / 2))p"; }
load() { cut -d' ' -f1-3 /proc/loadavg; }
secs() { python3 -c "print(round($2-$1,3))"; }
"$PY" "$ROOT/tests/integration/s3_client.py" put bench st/$F big/$F
echo "checkpoint: $F $((SZ>>20)) MiB, pack $((PACK>>20)) MiB; Ceph $(ceph --version | awk '{print $3}'); $(nproc) cores"
# A gateway just started keeps both cores busy for a while (the monitor and
# OSD creating pools, the packing above): the first runs measured at a
# 1-minute load of 17-19 gave the mount 0.62x of curl. Wait, at most 90 s,
# until the last minute's load is below 1.5.
for _ in $(seq 90); do awk '{ exit !($1 < 1.5) }' /proc/loadavg && break; sleep 1; done
echo "load before the runs: $(load)"
# Random reads: 40 at offsets drawn with a fixed seed (4 KiB aligned, not
# near 0, where a reader counts as sequential); the page cache is dropped
# for the file before each (posix_fadvise DONTNEED), so every read reaches
# the daemon. Cold: a new daemon and dropped caches for each size (its
# decoded-chunk cache keeps the chunks it saw, but 40 random reads of 873
# chunks seldom meet). Warm: the same from a cache_dir that a full read
# filled. curl: 20 ranged GETs of the same size at random offsets of the
# pack object, each on a new connection, its time_total (without the time
# a new curl process takes to start, 10 ms and more here).
rand_reads() {
    python3 - "$1" "$2" <<'PY'
import os, random, statistics, sys
import time
fd = os.open(sys.argv[1], os.O_RDONLY); size = int(sys.argv[2]); n = os.fstat(fd).st_size
random.seed(size); lat = []
for _ in range(40):
    off = random.randrange(4 << 20, n - size) & ~4095
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    t = time.perf_counter(); os.pread(fd, size, off); lat.append(time.perf_counter() - t)
print("%.2f" % (statistics.median(lat) * 1e3))
PY
}
curl_ranged() {
    local lat=() o i
    for i in $(seq 20); do
        o=$(((RANDOM * 32768 + RANDOM) % (PACK - $1) / 4096 * 4096))
        lat+=("$(sig -o /dev/null -w '%{time_total}' -H "Range: bytes=$o-$((o + $1 - 1))" "$S3_ENDPOINT/bench/p/big.tpack" | awk '{print $1 * 1000}')")
    done
    med "${lat[@]}"
}
# A cold sequential read beside them: what the random reads' fetching must
# not slow.
cold_cat() {
    mnt s3://bench/p m-ro -o ro; drop; t0=$(now); cat m-ro/big/$F >/dev/null; t1=$(now)
    fusermount3 -u m-ro; wait $P; secs $t0 $t1
}
random_reads() {
    local sz label cold warm c
    for sz in 4096 65536 1048576; do
        label=$((sz >> 10))KiB; [ $sz -eq 1048576 ] && label=1MiB
        mnt s3://bench/p m-ro -o ro; drop; stat m-ro/big/$F >/dev/null; cold=$(rand_reads m-ro/big/$F $sz); fusermount3 -u m-ro; wait $P
        mnt s3://bench/p m-ro -o ro,cache_dir="$W/cache",cache_size=1M; drop; stat m-ro/big/$F >/dev/null; warm=$(rand_reads m-ro/big/$F $sz); fusermount3 -u m-ro; wait $P
        c=$(curl_ranged $sz)
        printf '%s random %-6s through the mount: cold %6s ms (%sx curl), warm from cache_dir %6s ms; one ranged GET by curl %s ms (load %s)\n' \
            "$1" "$label" "$cold" "$(python3 -c "print(round($cold/$c,2))")" "$warm" "$c" "$(load)"
    done
    echo "$1 cold cat of the safetensors through the mount: $(cold_cat) s"
}
NEW_BIN=$BIN
[ -n "${BASE_CKPTFS:-}" ] && mkdir -p base-bin && ln -sf "$BASE_CKPTFS" base-bin/ckptfs
if [ -n "${SEQ_ONLY:-}" ]; then
    :
elif [ -n "${BASE_CKPTFS:-}" ]; then
    mnt s3://bench/p m-ro -o ro,cache_dir="$W/cache",cache_size=1M; cat m-ro/big/$F >/dev/null; fusermount3 -u m-ro; wait $P
    for run in 1 2; do
        BIN=$W/base-bin; random_reads "before:"
        BIN=$NEW_BIN; random_reads "after: "
    done
else
    mnt s3://bench/p m-ro -o ro,cache_dir="$W/cache",cache_size=1M; cat m-ro/big/$F >/dev/null; fusermount3 -u m-ro; wait $P
    random_reads "mount:"
fi
[ -n "${RANDOM_ONLY:-}" ] && exit 0
# A cold cat through a new daemon: its time in seconds ($T_LAST) and the
# daemon's VmHWM ($HWM_MNT).
cold_seq() {
    mnt s3://bench/p m-ro -o ro; drop; t0=$(now); cat m-ro/big/$F >/dev/null; t1=$(now)
    T_LAST=$(secs $t0 $t1); HWM_MNT=$(hwm $P); fusermount3 -u m-ro; wait $P
}
T_CURL=(); T_MNT=(); T_BASE=(); T_S3FS=()
for run in $(seq "${ROUNDS:-3}"); do
    drop; t0=$(now); sig -o /dev/null "$S3_ENDPOINT/bench/p/big.tpack"; t1=$(now); T_CURL+=("$(secs $t0 $t1)")
    if [ -n "${BASE_CKPTFS:-}" ]; then
        # Which goes first alternates: the second of two back-to-back runs
        # meets a gateway that has just served the first.
        if [ $((run % 2)) -eq 1 ]; then
            BIN=$W/base-bin; cold_seq; T_BASE+=("$T_LAST"); BIN=$NEW_BIN; cold_seq; T_MNT+=("$T_LAST")
        else
            cold_seq; T_MNT+=("$T_LAST"); BIN=$W/base-bin; cold_seq; T_BASE+=("$T_LAST"); BIN=$NEW_BIN
        fi
    else
        cold_seq; T_MNT+=("$T_LAST")
    fi
    if [ -z "${SEQ_ONLY:-}" ] && command -v s3fs >/dev/null; then
        echo "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" >pw; chmod 600 pw; mkdir -p m-s3fs
        s3fs bench m-s3fs -o passwd_file=pw,url=$S3_ENDPOINT,use_path_request_style,ro && sleep 1
        drop; t0=$(now); cat m-s3fs/st/$F >/dev/null; t1=$(now); T_S3FS+=("$(secs $t0 $t1)"); fusermount3 -u m-s3fs
    fi
    last_s3fs=-; [ ${#T_S3FS[@]} -gt 0 ] && last_s3fs=${T_S3FS[-1]}
    last_base=; [ ${#T_BASE[@]} -gt 0 ] && last_base=", before ${T_BASE[-1]} s"
    echo "run $run: curl ${T_CURL[-1]} s, mount ${T_MNT[-1]} s$last_base, s3fs $last_s3fs s (load $(load))"
done
tc=$(med "${T_CURL[@]}"); tm=$(med "${T_MNT[@]}")
echo "curl GET of the pack object:              $(mbs $PACK 0 $tc) MB/s (pack bytes; median $tc s)"
echo "cold sequential read through the mount:   $(mbs $SZ 0 $tm) MB/s (checkpoint bytes; median $tm s), daemon VmHWM $HWM_MNT"
echo "  mount vs curl: time $(python3 -c "print(round($tc/$tm,2))")x, MB/s delivered over curl's pack MB/s $(python3 -c "print(round($SZ*$tc/($PACK*$tm),2))")x"
if [ ${#T_BASE[@]} -gt 0 ]; then tb=$(med "${T_BASE[@]}")
    echo "  before (BASE_CKPTFS): $(mbs $SZ 0 $tb) MB/s (median $tb s), MB/s over curl's $(python3 -c "print(round($SZ*$tc/($PACK*$tb),2))")x"
fi
[ -n "${SEQ_ONLY:-}" ] && exit 0
if [ ${#T_S3FS[@]} -gt 0 ]; then ts=$(med "${T_S3FS[@]}")
    echo "s3fs cat of the same safetensors:         $(mbs $SZ 0 $ts) MB/s (median $ts s); mount vs s3fs $(python3 -c "print(round($ts/$tm,2))")x"
else echo "s3fs: not installed"; fi
if PYS=$(B=$B "$ROOT/scripts/venv.sh" streamer 2>streamer-venv.log); then
    case $PYS in /*) ;; *) PYS=$ROOT/$PYS ;; esac
    T_ST=(); T_STM=()
    for run in 1 2 3; do
        drop; T_ST+=("$("$PYS" "$ROOT/bench/streamer_load.py" s3://bench/st/$F | cut -f1)")
        mnt s3://bench/p m-ro -o ro; drop; T_STM+=("$("$PYS" "$ROOT/bench/streamer_load.py" m-ro/big/$F | cut -f1)")
        fusermount3 -u m-ro; wait $P
        echo "run $run: streamer from the gateway ${T_ST[-1]} s, through the mount ${T_STM[-1]} s (load $(load))"
    done
    a=$(med "${T_ST[@]}"); b=$(med "${T_STM[@]}")
    echo "load into CPU memory, Run:ai streamer:    from the gateway $a s, through the mount $b s; mount vs streamer $(python3 -c "print(round($a/$b,2))")x"
else echo "Run:ai streamer: no venv (scripts/venv.sh streamer failed; see $W/streamer-venv.log)"; fi
mnt s3://bench/p m-ro -o ro,cache_dir="$W/cache",cache_size=1M; cat m-ro/big/$F >/dev/null; fusermount3 -u m-ro; wait $P
mnt s3://bench/p m-ro -o ro,cache_dir="$W/cache",cache_size=1M; drop; t0=$(now); cat m-ro/big/$F >/dev/null; t1=$(now)
echo "warm read from cache_dir (new daemon):    $(mbs $SZ $t0 $t1) MB/s"; fusermount3 -u m-ro; wait $P
mnt local m-local -o ro,cache_size=1M; drop; t0=$(now); cat m-local/big/$F >/dev/null; t1=$(now)
echo "the same from a local backing directory:  $(mbs $SZ $t0 $t1) MB/s"; fusermount3 -u m-local; wait $P
mnt s3://bench/w m-w -o stage_dir="$W/stage",commit_delay=0; cp -r big m-w/up; t0=$(now); "$BIN/ckpt" commit --wait m-w/up >/dev/null; t1=$(now)
echo "writable mount: pack+upload after cp:      $(mbs $SZ $t0 $t1) MB/s, daemon VmHWM $(hwm $P)"; fusermount3 -u m-w; wait $P
