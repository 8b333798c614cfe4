#!/usr/bin/env bash
# Write benchmark of the ckptfs mount (run by `make bench-write`, as root).
# On a generated GPT-2-medium bf16 checkpoint (about 700 MB, kept warm in
# the page cache so the source disk does not count) it measures, in one run:
#
#   native     cp -r to a directory on the backing disk, then sync
#   ckptfs     cp -r into a new checkpoint of a mount over the same disk
#              (time until cp returns), then `ckpt commit --wait` (time
#              until committed: packing); without and with a key
#   gocryptfs  cp -r into an encrypted gocryptfs directory, then sync
#
# and the daemons' peak RSS (VmHWM; for ckptfs, once committed, before the
# copy is read back to check it). Each figure is the median of --runs runs.
# Prints a table in seconds and MB/s, with ratios to native and gocryptfs,
# then the targets:
#   cp -r into the mount returns in <= 1.2x native cp (+sync) time (issue 15)
#   so do 4 writers at once (each a quarter of the model file, with dd)
#   packing adds <= 1 s per 250 MB of bf16 (2 cores)
#   daemon RSS <= 512 MB
#
# Usage: bench/bench-write.sh [options] [WORKDIR]
#   --quick           4 layers instead of 24 (about 200 MB), for a smoke run
#   --size SIZE       a checkpoint of about SIZE bytes instead (100M, 1G, 4G)
#   --src DIR         write this checkpoint instead of generating one
#   --runs N          runs per figure (default 3)
#   --threads LIST    mount ckptfs with -o threads=N for each N (default:
#                     nproc): N decode workers and N packing threads
#   --tsv FILE        also append the results to FILE as tab-separated
#                     bench/dtype/bytes/system/threads/metric/value lines
#   WORKDIR           kept afterwards (default: a new directory under /tmp);
#                     the generated checkpoint is reused when already there
set -euo pipefail
BENCH_NAME=bench-write
# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
runs=3
while [ $# -gt 0 ]; do
    case $1 in
    --runs) runs=${2:?--runs needs a number}; shift 2 ;;
    *) bench_common_opt "$@" || break; shift "$BENCH_SHIFT" ;;
    esac
done
use_workdir /tmp/ckptfs-wbench.XXXXXX "${1:-}"

need_root "drop_caches, gocryptfs mounts"
need_bins "$bin/ckptfs"
[ ${#threads_list[@]} -gt 0 ] || threads_list=("$(nproc)")
have_gocryptfs=1
command -v gocryptfs >/dev/null || have_gocryptfs=0
mnt=$work/mnt
gcmnt=$work/gcmnt

# ------------------------------------------------------------- the input

use_src
bytes=$src_bytes
mb=$(awk -v b="$bytes" 'BEGIN { printf "%.1f", b / 1e6 }')
rate() { mbps "$bytes" "$1"; }

# Same state before every run: source warm, nothing dirty, old copies gone.
prepare() {
    rm -rf "$work/native" "$work/back" "$work/gcipher"
    drop_caches
    cat "$src"/* >/dev/null
}

# ------------------------------------------------------------ the runs

# Per system (native, gocryptfs, ckptfs@N, ckptfs-key@N): the seconds until
# cp returns and until the data is durable in its final form (sync; for
# ckptfs `ckpt commit --wait`, which packs and fsyncs), one per run, and the
# daemon's highest peak RSS.
declare -A cp_s=() done_s=() rss=()
"$bin/ckpt" keygen -o "$work/key.$$" >/dev/null
key=$work/key.$$
printf 'bench-write-passphrase\n' >"$work/gcpass"
trap 'stop_all_mounts; rm -f "$key"' EXIT

# note SYSTEM T0 T1 T2 [RSS_KIB]
note() {
    cp_s[$1]+=" $(elapsed "$2" "$3")"
    done_s[$1]+=" $(elapsed "$2" "$4")"
    [ "${5:-0}" -gt "${rss[$1]:-0}" ] && rss[$1]=$5
    return 0
}

# run_ckptfs SYSTEM THREADS [mount options...]
run_ckptfs() {
    local sys=$1 t=$2 t0 t1 t2
    shift 2
    mkdir -p "$work/back"
    start_daemon "$mnt" "$bin/ckptfs" -f -o commit_delay=0,threads="$t" "$@" "$work/back" "$mnt"
    mkdir "$mnt/ckpt"
    t0=$(now)
    cp -r "$src/." "$mnt/ckpt/"
    t1=$(now)
    "$bin/ckpt" commit --wait --quiet "$mnt/ckpt"
    t2=$(now)
    # Writing and packing only: the check below reads through the decode
    # cache (-o cache_size), which is the read path's memory, not this.
    local hwm
    hwm=$(hwm_kib "${bench_pid_of[$mnt]}")
    cmp -s "$src/model.safetensors" "$mnt/ckpt/model.safetensors" || bench_die "packed copy differs"
    stop_mount "$mnt"
    note "$sys" "$t0" "$t1" "$t2" "$hwm"
}

# Four writers at once, as four ranks saving their shards do: each dd
# copies a quarter of the model file into a file of its own, in 1 MiB
# writes as cp makes. (Not `wait` alone: that would wait for the daemons.)
write4() { # DIR
    local size q i pids=()
    size=$(stat -c %s "$src/model.safetensors")
    q=$(((size + 4 * 1048576 - 1) / (4 * 1048576)))
    for i in 0 1 2 3; do
        dd if="$src/model.safetensors" of="$1/part$i" bs=1M skip=$((i * q)) count=$q status=none &
        pids+=($!)
    done
    wait "${pids[@]}"
}

# run_ckptfs4 SYSTEM THREADS: write4 into a new checkpoint, then commit.
run_ckptfs4() {
    local sys=$1 t=$2 t0 t1 t2 hwm
    mkdir -p "$work/back"
    start_daemon "$mnt" "$bin/ckptfs" -f -o commit_delay=0,threads="$t" "$work/back" "$mnt"
    mkdir "$mnt/ckpt"
    t0=$(now)
    write4 "$mnt/ckpt"
    t1=$(now)
    "$bin/ckpt" commit --wait --quiet "$mnt/ckpt"
    t2=$(now)
    hwm=$(hwm_kib "${bench_pid_of[$mnt]}")
    cmp -s "$src/model.safetensors" <(cat "$mnt"/ckpt/part{0,1,2,3}) || bench_die "4-writer copy differs"
    stop_mount "$mnt"
    note "$sys" "$t0" "$t1" "$t2" "$hwm"
}

for r in $(seq "$runs"); do
    echo "run $r of $runs..." >&2
    prepare
    t0=$(now)
    cp -r "$src" "$work/native"
    t1=$(now)
    sync
    t2=$(now)
    note native "$t0" "$t1" "$t2"

    for t in "${threads_list[@]}"; do
        prepare
        run_ckptfs "ckptfs@$t" "$t"
        prepare
        run_ckptfs "ckptfs-key@$t" "$t" -o key_file="$key"
    done

    prepare
    mkdir -p "$work/native"
    t0=$(now)
    write4 "$work/native"
    t1=$(now)
    sync
    t2=$(now)
    note native4 "$t0" "$t1" "$t2"
    for t in "${threads_list[@]}"; do
        prepare
        run_ckptfs4 "ckptfs4@$t" "$t"
    done

    if [ $have_gocryptfs -eq 1 ]; then
        prepare
        mkdir -p "$work/gcipher"
        gocryptfs -q -init -passfile "$work/gcpass" "$work/gcipher" >/dev/null 2>&1
        start_daemon "$gcmnt" gocryptfs -fg -q -nosyslog -passfile "$work/gcpass" "$work/gcipher" "$gcmnt"
        t0=$(now)
        cp -r "$src/." "$gcmnt/"
        t1=$(now)
        sync
        t2=$(now)
        stop_mount "$gcmnt"
        note gocryptfs "$t0" "$t1" "$t2" "$LAST_HWM_KIB"
    fi
done
rm -rf "$work/native" "$work/back" "$work/gcipher"

systems=(native native4)
for t in "${threads_list[@]}"; do systems+=("ckptfs@$t" "ckptfs-key@$t" "ckptfs4@$t"); done
[ $have_gocryptfs -eq 1 ] && systems+=(gocryptfs)
m() { tr ' ' '\n' <<<"$1" | grep . | median; } # "N N N"
declare -A cp_m=() done_m=()
for s in "${systems[@]}"; do
    cp_m[$s]=$(m "${cp_s[$s]}")
    done_m[$s]=$(m "${done_s[$s]}")
    threads=-
    [[ $s == *@* ]] && threads=${s#*@}
    tsv_row write "$dtype" "$bytes" "${s%@*}" "$threads" cp_s "${cp_m[$s]}"
    tsv_row write "$dtype" "$bytes" "${s%@*}" "$threads" done_s "${done_m[$s]}"
    tsv_row write "$dtype" "$bytes" "${s%@*}" "$threads" cp_mbps "$(rate "${cp_m[$s]}")"
    tsv_row write "$dtype" "$bytes" "${s%@*}" "$threads" done_mbps "$(rate "${done_m[$s]}")"
    [[ $s == native* ]] || tsv_row write "$dtype" "$bytes" "${s%@*}" "$threads" rss_kib "${rss[$s]}"
done

# --------------------------------------------------------------- report

top=$(printf '%s\n' "${threads_list[@]}" | sort -n | tail -n 1)
echo
echo "bench-write: $mb MB checkpoint ($dtype safetensors + config), $(nproc) cores, median of $runs runs"
printf '%-36s %9s %9s %9s %9s\n' "" seconds "MB/s" "x native" "x gocrypt"
row() { # LABEL SECONDS NATIVE_SECONDS [GOCRYPTFS_SECONDS]
    printf '%-36s %9.3f %9s %9s %9s\n' "$1" "$2" "$(rate "$2")" "$(ratio "$3" "$2")" "$(ratio "${4:-}" "$2")"
}
pack_s() { awk -v a="${done_m[$1]}" -v b="${cp_m[$1]}" 'BEGIN { printf "%.3f", a - b }'; }
row "native cp -r" "${cp_m[native]}" "${cp_m[native]}" "${cp_m[gocryptfs]:-}"
row "native cp -r + sync" "${done_m[native]}" "${done_m[native]}" "${done_m[gocryptfs]:-}"
for t in "${threads_list[@]}"; do
    label=ckptfs
    [ ${#threads_list[@]} -gt 1 ] && label="ckptfs -o threads=$t"
    row "$label cp -r returns" "${cp_m[ckptfs@$t]}" "${done_m[native]}" "${done_m[gocryptfs]:-}"
    row "$label packing (commit --wait)" "$(pack_s "ckptfs@$t")" "${done_m[native]}"
    row "$label cp -r + packing" "${done_m[ckptfs@$t]}" "${done_m[native]}" "${done_m[gocryptfs]:-}"
    row "$label+key cp -r returns" "${cp_m[ckptfs-key@$t]}" "${done_m[native]}" "${done_m[gocryptfs]:-}"
    row "$label+key packing" "$(pack_s "ckptfs-key@$t")" "${done_m[native]}"
    row "$label+key cp -r + packing" "${done_m[ckptfs-key@$t]}" "${done_m[native]}" "${done_m[gocryptfs]:-}"
done
row "native 4 writers" "${cp_m[native4]}" "${cp_m[native4]}"
row "native 4 writers + sync" "${done_m[native4]}" "${done_m[native4]}"
for t in "${threads_list[@]}"; do
    label=ckptfs
    [ ${#threads_list[@]} -gt 1 ] && label="ckptfs -o threads=$t"
    row "$label 4 writers return" "${cp_m[ckptfs4@$t]}" "${done_m[native4]}"
    row "$label 4 writers + packing" "${done_m[ckptfs4@$t]}" "${done_m[native4]}"
done
if [ $have_gocryptfs -eq 1 ]; then
    row "gocryptfs cp -r" "${cp_m[gocryptfs]}" "${cp_m[native]}" "${cp_m[gocryptfs]}"
    row "gocryptfs cp -r + sync" "${done_m[gocryptfs]}" "${done_m[native]}" "${done_m[gocryptfs]}"
fi
echo "(x native and x gocrypt: their cp -r + sync time over this time, or cp -r alone on the cp -r rows"
echo " of native and gocryptfs; above 1 is faster)"
for s in "${systems[@]}"; do
    [[ $s == native* ]] && continue
    label=${s%@*}
    label=${label/#ckptfs-key/ckptfs+key}
    [ ${#threads_list[@]} -gt 1 ] && [[ $s == *@* ]] && label+=" t${s#*@}"
    printf '%-36s %9s\n' "$label daemon peak RSS" "$((rss[$s] / 1024)) MiB"
done

echo
verdict() { awk -v v="$1" -v lim="$2" 'BEGIN { print (v <= lim) ? "met" : "MISSED" }'; }
p_cp=${cp_m[ckptfs@$top]}
ratio_sync=$(awk -v a="$p_cp" -v b="${done_m[native]}" 'BEGIN { printf "%.2f", a / b }')
ratio_cp=$(awk -v a="$p_cp" -v b="${cp_m[native]}" 'BEGIN { printf "%.2f", a / b }')
per250=$(awk -v s="$(pack_s "ckptfs@$top")" -v b="$bytes" 'BEGIN { printf "%.2f", s / (b / 250e6) }')
per250k=$(awk -v s="$(pack_s "ckptfs-key@$top")" -v b="$bytes" 'BEGIN { printf "%.2f", s / (b / 250e6) }')
rss_max=${rss[ckptfs@$top]:-0}
[ "${rss[ckptfs-key@$top]:-0}" -gt "$rss_max" ] && rss_max=${rss[ckptfs-key@$top]}
echo "targets (ckptfs -o threads=$top):"
echo "  cp -r into the mount <= 1.2x native cp+sync:  ${ratio_sync}x  $(verdict "$ratio_sync" 1.2)"
echo "    (against native cp alone, page cache only:  ${ratio_cp}x  $(verdict "$ratio_cp" 1.2))"
ratio4=$(awk -v a="${cp_m[ckptfs4@$top]}" -v b="${done_m[native4]}" 'BEGIN { printf "%.2f", a / b }')
echo "  4 writers into the mount <= 1.2x native+sync: ${ratio4}x  $(verdict "$ratio4" 1.2)"
echo "  packing <= 1 s per 250 MB:                    ${per250} s  $(verdict "$per250" 1.0)  (with key: ${per250k} s $(verdict "$per250k" 1.0))"
echo "  daemon RSS <= 512 MB:                         $((rss_max / 1024)) MiB  $(verdict "$rss_max" $((512 << 10)))"
