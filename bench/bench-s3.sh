#!/usr/bin/env bash
# Packs on S3, a first measurement (issue 16), against a real Ceph RADOS
# Gateway started here on loopback (../shared/services/ceph-rgw.sh; stopped
# on exit), on a generated GPT-2 medium bf16 checkpoint (about 710 MB):
#   - cold sequential read through `ckpt cat` and `ckpt unpack` from s3://,
#     next to `curl` downloading the pack object whole (the same bytes, one
#     GET at full speed): MB/s of the checkpoint delivered, MB/s of pack
#     bytes fetched, and the ratio of curl's time to ours
#   - `ckpt pack` to s3:// next to `ckpt pack` to a local directory, with
#     the gateway's CPU-s for each run (printed beside the times): on one
#     machine the two share the cores, so the client's CPU-s plus the
#     gateway's, over the cores, bounds the time to s3://
#   - the same packing and reading again with the gateway's daemons pinned
#     to the last core and ckpt or curl to the others (when there are 2 or
#     more): on one machine the gateway takes about as much CPU to store a
#     pack as ckpt takes to make it, where a real store runs on machines of
#     its own
#   - peak RSS of ckpt (/usr/bin/time) during a 2 GB upload and download,
#     which must be bounded by the parts and chunks in flight
# Page caches are dropped before each run; the gateway keeps its objects in
# RAM (memstore), so "cold" means a new process with nothing cached locally.
# Each time is the median of 3 runs (the machine may be shared: the load
# average is printed). One untimed pack to s3:// comes first: a new
# gateway creates its data pools at the first write and first multipart
# upload, seconds that belong to the gateway's start, not to ckpt. RGW frees
# a replaced or deleted object's space only at garbage collection (hours
# by default), and memstore is 4 GiB: the bench collects after each delete.
#
# Usage: bench/bench-s3.sh [options] [WORKDIR]
#   --quick           GPT-2 medium with 4 layers (about 200 MB), and a 500 MB
#                     checkpoint for the RSS runs instead of 2 GB
#   --src DIR         measure this checkpoint instead of generating one
#   --tsv FILE        also append the results as tab-separated lines
#   WORKDIR           kept afterwards (default: a new directory under /tmp);
#                     generated checkpoints there are reused
set -euo pipefail
BENCH_NAME=bench-s3
# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
while [ $# -gt 0 ]; do
    bench_common_opt "$@" || break
    shift "$BENCH_SHIFT"
done
use_workdir /tmp/ckpt-bench-s3.XXXXXX "${1:-}"
need_root "the Ceph gateway's daemons and dropping caches"
need_bins "$bin/ckpt" "$bin/ckpt-gen"
command -v /usr/bin/time >/dev/null || bench_die "needs /usr/bin/time (scripts/deps.sh bench)"
RGW_SH=$("$BENCH_ROOT/scripts/shared-dir.sh")/services/ceph-rgw.sh
[ -f "$RGW_SH" ] || bench_die "$RGW_SH is missing"

free_port() {
    local p
    for p in $(shuf -i 20000-29999 -n 50); do
        ss -Hltn "sport = :$p" 2>/dev/null | grep -q . || { echo "$p"; return; }
    done
    echo 17480
}
RGW_PORT=$(free_port)
MON_PORT=$(free_port)
RGW=$work/rgw
rm -rf "$RGW"
export RGW_PORT MON_PORT
trap 'bash "$RGW_SH" stop "$RGW" >/dev/null 2>&1 || true' EXIT
bash "$RGW_SH" start "$RGW" >&2
# shellcheck disable=SC1091
. "$RGW/env"
export AWS_ENDPOINT_URL=$S3_ENDPOINT
S3=(--aws-sigv4 "aws:amz:us-east-1:s3" --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY"
    -H "x-amz-content-sha256: UNSIGNED-PAYLOAD")
BK=bench
curl -sf "${S3[@]}" -X PUT "$S3_ENDPOINT/$BK" >/dev/null || bench_die "cannot create the bucket"
s3_delete() {
    curl -s "${S3[@]}" -X DELETE "$S3_ENDPOINT/$BK/$1" >/dev/null
    radosgw-admin -c "$RGW/ceph.conf" gc process --include-all >/dev/null 2>&1 || true
}

use_src
logical=$(du -sb "$src/model.safetensors" | cut -f1)
ck=$bin/ckpt
rows=()
row() { # NAME SECONDS BYTES [NOTE]
    local r
    r=$(printf '%-34s %8s s %9s MB/s  %s' "$1" "$2" "$(mbps "$3" "$2")" "${4:-}")
    rows+=("$r")
    echo "$r" >&2
}
# CPU time (ticks) of the gateway's daemons: on one machine it is what an
# upload costs beside the client's own, so it bounds the pack rows.
gw_ticks() {
    local t=0 p
    for p in "$RGW"/run/*.pid; do
        t=$((t + $(awk '{ print $14 + $15 }' "/proc/$(cat "$p")/stat")))
    done
    echo "$t"
}
timed() { # sets T: seconds; runs CMD under /usr/bin/time, LAST_RSS_KIB its peak RSS, GW_CPU the gateway's CPU-s
    local t0 t1 g0
    drop_caches
    g0=$(gw_ticks)
    t0=$(now)
    run_rss "$@"
    t1=$(now)
    T=$(elapsed "$t0" "$t1")
    GW_CPU=$(awk -v a="$g0" -v b="$(gw_ticks)" -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.2f", (b - a) / hz }')
}
RUNS=3
timed3() { # BEFORE_EACH CMD...: T the median of RUNS timed runs, each after BEFORE_EACH
    local before=$1 ts=() gs=() i
    shift
    for i in $(seq "$RUNS"); do
        $before
        timed "$@"
        ts+=("$T")
        gs+=("$GW_CPU")
    done
    # The command's name only: curl's arguments hold the keys.
    echo "  ${ts[*]} s, gateway ${gs[*]} CPU-s (load $(cut -d' ' -f1-3 /proc/loadavg)): ${1##*/} ${2:-}" >&2
    T=$(printf '%s\n' "${ts[@]}" | median)
}
nothing() { :; }

# ------------------------------------------------------------- packing
"$ck" pack "$src" -o s3://$BK/p/warm.tpack >/dev/null
s3_delete p/warm.tpack
rm_local() { rm -f "$work/local.tpack"; }
rm_s3() { s3_delete p/m.tpack; }
# pack_and_fetch TAG WHERE [RUNNER...]: the timings both setups below take
# (pack to a local directory, pack to s3://, curl's GET of the pack object,
# ckpt cat from s3://), each command run through RUNNER (e.g. taskset);
# sets ${TAG}pack_local, ${TAG}pack_s3, ${TAG}curl and ${TAG}cat, and
# stored, the pack's size.
pack_and_fetch() {
    local tag=$1 where=$2
    shift 2
    timed3 rm_local "$@" "$ck" pack "$src" -o "$work/local.tpack" >/dev/null
    printf -v "${tag}pack_local" %s "$T"
    row "pack to a local directory$where" "$T" "$src_bytes" "RSS $((LAST_RSS_KIB / 1024)) MiB"
    timed3 rm_s3 "$@" "$ck" pack "$src" -o s3://$BK/p/m.tpack >/dev/null
    printf -v "${tag}pack_s3" %s "$T"
    row "pack to s3://$where" "$T" "$src_bytes" "RSS $((LAST_RSS_KIB / 1024)) MiB"
    stored=$(stat -c %s "$work/local.tpack")
    timed3 nothing "$@" curl -sf "${S3[@]}" -o /dev/null "$S3_ENDPOINT/$BK/p/m.tpack"
    printf -v "${tag}curl" %s "$T"
    row "curl GET of the pack object$where" "$T" "$stored" "(pack bytes)"
    timed3 nothing "$@" "$ck" cat s3://$BK/p/m.tpack model.safetensors >/dev/null
    printf -v "${tag}cat" %s "$T"
    row "ckpt cat from s3://$where" "$T" "$logical" "RSS $((LAST_RSS_KIB / 1024)) MiB; pack bytes $(mbps "$stored" "$T") MB/s"
}
pack_and_fetch t_ ""

# ------------------------------------------------------------- reading
rm_out() { rm -rf "$work/out"; }
timed3 rm_out "$ck" unpack s3://$BK/p/m.tpack -o "$work/out" >/dev/null
t_unpack=$T
row "ckpt unpack from s3:// (all files)" "$T" "$src_bytes" "RSS $((LAST_RSS_KIB / 1024)) MiB"
rm -rf "$work/out"
timed3 nothing "$ck" cat "$work/local.tpack" model.safetensors >/dev/null
t_cat_local=$T
row "ckpt cat from a local file" "$T" "$logical"

# ------------------------------------------- the gateway on a core of its own
# Above, radosgw and its OSD share every core with ckpt. Pinned, each side
# has its own: the gateway's daemons (all their threads, and the threads
# they start later) on the last core, the client on the others.
pinned=0
if [ "$(nproc)" -ge 2 ] && command -v taskset >/dev/null; then
    pinned=1
    last=$(($(nproc) - 1))
    cpus=0-$((last - 1))
    pin_gateway() { local p; for p in "$RGW"/run/*.pid; do taskset -a -p -c "$1" "$(cat "$p")" >/dev/null; done; }
    pin_gateway "$last"
    pack_and_fetch t_pin_ ", pinned" taskset -c "$cpus"
    pin_gateway "0-$last"
fi

# ---------------------------------------------------------------- memory
s3_delete p/m.tpack
big=$work/big
if [ "$quick" = 1 ]; then size=500M; else size=2G; fi
gen_ckpt "$big" bf16
big_bytes=$(du -sb "$big" | cut -f1)
timed "$ck" pack "$big" -o s3://$BK/p/big.tpack >/dev/null
rss_up=$LAST_RSS_KIB
row "pack $size to s3://" "$T" "$big_bytes" "peak RSS $((rss_up / 1024)) MiB"
timed "$ck" cat s3://$BK/p/big.tpack model.safetensors >/dev/null
rss_down=$LAST_RSS_KIB
row "cat $size from s3://" "$T" "$(du -sb "$big/model.safetensors" | cut -f1)" "peak RSS $((rss_down / 1024)) MiB"
s3_delete p/big.tpack

echo
echo "bench-s3: $(nproc) cores, Ceph $(ceph --version 2>/dev/null | awk '{print $3}') RGW (memstore) on 127.0.0.1, checkpoint $src_bytes bytes ($dtype), pack $stored bytes"
printf '%s\n' "${rows[@]}"
echo
echo "ratios:"
echo "  cat from s3:// vs curl of the pack object (curl time / cat time): $(ratio "$t_curl" "$t_cat")"
echo "  unpack from s3:// vs curl (curl time / unpack time):             $(ratio "$t_curl" "$t_unpack")"
echo "  cat from s3:// vs cat from a local file (local time / s3 time):  $(ratio "$t_cat_local" "$t_cat")"
echo "  pack to s3:// vs pack to a local dir (local time / s3 time):     $(ratio "$t_pack_local" "$t_pack_s3")"
if [ "$pinned" = 1 ]; then
    echo "  the gateway on a core of its own, the client on the others:"
    echo "    pack to s3:// vs pack to a local dir (local time / s3 time):   $(ratio "$t_pin_pack_local" "$t_pin_pack_s3")"
    echo "    cat from s3:// vs curl of the pack object (curl time / cat):   $(ratio "$t_pin_curl" "$t_pin_cat")"
    echo "    cat from s3://, checkpoint MB/s vs curl's pack MB/s:           $(ratio "$(mbps "$logical" "$t_pin_cat")" "$(mbps "$stored" "$t_pin_curl")")"
fi
echo "  peak RSS: upload $((rss_up / 1024)) MiB, download $((rss_down / 1024)) MiB ($size checkpoint)"
if [ -n "$tsv" ]; then
    tsv_row s3 "$dtype" "$src_bytes" ckpt-s3 "$(nproc)" pack_s_s3 "$t_pack_s3"
    tsv_row s3 "$dtype" "$src_bytes" ckpt-s3 "$(nproc)" pack_s_local "$t_pack_local"
    tsv_row s3 "$dtype" "$src_bytes" ckpt-s3 "$(nproc)" cat_s "$t_cat"
    tsv_row s3 "$dtype" "$src_bytes" ckpt-s3 "$(nproc)" curl_s "$t_curl"
    tsv_row s3 "$dtype" "$src_bytes" ckpt-s3 "$(nproc)" rss_up_kib "$rss_up"
    if [ "$pinned" = 1 ]; then
        tsv_row s3 "$dtype" "$src_bytes" ckpt-s3 "$(nproc)" pinned_pack_s_s3 "$t_pin_pack_s3"
        tsv_row s3 "$dtype" "$src_bytes" ckpt-s3 "$(nproc)" pinned_pack_s_local "$t_pin_pack_local"
        tsv_row s3 "$dtype" "$src_bytes" ckpt-s3 "$(nproc)" pinned_cat_s "$t_pin_cat"
        tsv_row s3 "$dtype" "$src_bytes" ckpt-s3 "$(nproc)" pinned_curl_s "$t_pin_curl"
    fi
    tsv_row s3 "$dtype" "$src_bytes" ckpt-s3 "$(nproc)" rss_down_kib "$rss_down"
fi
