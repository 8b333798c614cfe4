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
# and the daemon's peak RSS. Each figure is the median of --runs runs.
# Prints a table in seconds and MB/s, then the targets:
#   cp -r into the mount returns in <= 1.5x native cp (+sync) time
#   packing adds <= 1 s per 250 MB of bf16 (2 cores)
#   daemon RSS <= 512 MB
#
# Usage: bench/bench-write.sh [--quick] [--runs N] [WORKDIR]
#   --quick  4 layers instead of 24 (about 150 MB), for a smoke run
#   WORKDIR  kept afterwards (default: a new directory under /tmp); the
#            generated checkpoint is reused when already there
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=$root/${B:-build}/bin
quick=0
runs=3
while [ $# -gt 0 ]; do
    case $1 in
    --quick) quick=1; shift ;;
    --runs) runs=$2; shift 2 ;;
    -h | --help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) break ;;
    esac
done
work=${1:-$(mktemp -d /tmp/ckptfs-wbench.XXXXXX)}
mkdir -p "$work"
work=$(cd "$work" && pwd)

if [ "$(id -u)" -ne 0 ]; then
    echo "bench-write: needs root (drop_caches, gocryptfs mounts)" >&2
    exit 1
fi
for tool in "$bin/ckptfs" "$bin/ckpt" "$bin/ckpt-gen"; do
    [ -x "$tool" ] || { echo "bench-write: $tool is missing; run make first" >&2; exit 1; }
done
have_gocryptfs=1
command -v gocryptfs >/dev/null || have_gocryptfs=0

src=$work/src
mnt=$work/mnt
gcmnt=$work/gcmnt
ckptfs_pid=
cleanup() {
    local m
    for m in "$mnt" "$gcmnt"; do
        mountpoint -q "$m" 2>/dev/null && fusermount3 -u "$m" 2>/dev/null || true
    done
    [ -n "$ckptfs_pid" ] && wait "$ckptfs_pid" 2>/dev/null || true
}
trap cleanup EXIT

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", b - a }'; }
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

wait_mounted() {
    local _
    for _ in $(seq 400); do
        mountpoint -q "$1" && return 0
        sleep 0.05
    done
    echo "bench-write: $1 did not mount" >&2
    exit 1
}

# ------------------------------------------------------------- the input

if [ ! -f "$src/model.safetensors" ]; then
    echo "generating the checkpoint..." >&2
    if [ $quick -eq 1 ]; then
        "$bin/ckpt-gen" "$src" --preset gpt2-medium --layers 4 >/dev/null
    else
        "$bin/ckpt-gen" "$src" --preset gpt2-medium >/dev/null
    fi
fi
bytes=$(du -sb "$src" | cut -f1)
mb=$(awk -v b="$bytes" 'BEGIN { printf "%.1f", b / 1e6 }')
rate() { awk -v b="$bytes" -v s="$1" 'BEGIN { printf "%.0f", (s > 0) ? b / 1e6 / s : 0 }'; }

# Same state before every run: source warm, nothing dirty, old copies gone.
prepare() {
    rm -rf "$work/native" "$work/back" "$work/gcipher"
    sync
    echo 3 >/proc/sys/vm/drop_caches
    cat "$src"/* >/dev/null
}

# ------------------------------------------------------------ the runs

native_cp=() native_sync=() plain_cp=() plain_pack=() key_cp=() key_pack=() gc_cp=() gc_sync=()
rss_plain=0 rss_key=0
"$bin/ckpt" keygen -o "$work/key.$$" >/dev/null
key=$work/key.$$
printf 'bench-write-passphrase\n' >"$work/gcpass"

# run_ckptfs LABEL [mount options...]: prints "cp_seconds pack_seconds peak_rss_kib"
run_ckptfs() {
    mkdir -p "$work/back" "$mnt"
    "$bin/ckptfs" -f -o commit_delay=0 "$@" "$work/back" "$mnt" 2>>"$work/ckptfs.log" </dev/null >/dev/null &
    ckptfs_pid=$!
    wait_mounted "$mnt"
    mkdir "$mnt/ckpt"
    local t0 t1 t2
    t0=$(now)
    cp -r "$src/." "$mnt/ckpt/"
    t1=$(now)
    "$bin/ckpt" commit --wait --quiet "$mnt/ckpt"
    t2=$(now)
    local hwm
    hwm=$(awk '/VmHWM/ {print $2}' "/proc/$ckptfs_pid/status")
    cmp -s "$src/model.safetensors" "$mnt/ckpt/model.safetensors" || { echo "bench-write: packed copy differs" >&2; exit 1; }
    fusermount3 -u "$mnt"
    wait "$ckptfs_pid" || true
    ckptfs_pid=
    echo "$(elapsed "$t0" "$t1") $(elapsed "$t1" "$t2") $hwm"
}

for r in $(seq "$runs"); do
    echo "run $r of $runs..." >&2
    prepare
    t0=$(now)
    cp -r "$src" "$work/native"
    t1=$(now)
    sync
    t2=$(now)
    native_cp+=("$(elapsed "$t0" "$t1")")
    native_sync+=("$(elapsed "$t0" "$t2")")

    prepare
    read -r c p h < <(run_ckptfs)
    plain_cp+=("$c"); plain_pack+=("$p")
    [ "$h" -gt "$rss_plain" ] && rss_plain=$h

    prepare
    read -r c p h < <(run_ckptfs -o key_file="$key")
    key_cp+=("$c"); key_pack+=("$p")
    [ "$h" -gt "$rss_key" ] && rss_key=$h

    if [ $have_gocryptfs -eq 1 ]; then
        prepare
        mkdir -p "$work/gcipher" "$gcmnt"
        gocryptfs -q -init -passfile "$work/gcpass" "$work/gcipher" >/dev/null 2>&1
        gocryptfs -q -passfile "$work/gcpass" "$work/gcipher" "$gcmnt" </dev/null >/dev/null 2>&1
        wait_mounted "$gcmnt"
        t0=$(now)
        cp -r "$src/." "$gcmnt/"
        t1=$(now)
        sync
        t2=$(now)
        gc_cp+=("$(elapsed "$t0" "$t1")")
        gc_sync+=("$(elapsed "$t0" "$t2")")
        fusermount3 -u "$gcmnt"
    fi
done
rm -rf "$work/native" "$work/back" "$work/gcipher" "$key"

m() { printf '%s\n' "$@" | median; }
n_cp=$(m "${native_cp[@]}")
n_sync=$(m "${native_sync[@]}")
p_cp=$(m "${plain_cp[@]}")
p_pack=$(m "${plain_pack[@]}")
k_cp=$(m "${key_cp[@]}")
k_pack=$(m "${key_pack[@]}")

echo
echo "bench-write: $mb MB checkpoint (bf16 safetensors + config), $(nproc) cores, median of $runs runs"
printf '%-34s %9s %9s\n' "" seconds "MB/s"
row() { printf '%-34s %9.3f %9s\n' "$1" "$2" "$(rate "$2")"; }
row "native cp -r" "$n_cp"
row "native cp -r + sync" "$n_sync"
row "ckptfs cp -r returns" "$p_cp"
row "ckptfs packing (commit --wait)" "$p_pack"
row "ckptfs cp -r + packing" "$(awk -v a="$p_cp" -v b="$p_pack" 'BEGIN { print a + b }')"
row "ckptfs+key cp -r returns" "$k_cp"
row "ckptfs+key packing" "$k_pack"
if [ $have_gocryptfs -eq 1 ]; then
    row "gocryptfs cp -r" "$(m "${gc_cp[@]}")"
    row "gocryptfs cp -r + sync" "$(m "${gc_sync[@]}")"
fi
printf '%-34s %9s\n' "ckptfs daemon peak RSS (no key)" "$((rss_plain / 1024)) MiB"
printf '%-34s %9s\n' "ckptfs daemon peak RSS (key)" "$((rss_key / 1024)) MiB"

echo
verdict() { awk -v v="$1" -v lim="$2" 'BEGIN { print (v <= lim) ? "met" : "MISSED" }'; }
ratio_sync=$(awk -v a="$p_cp" -v b="$n_sync" 'BEGIN { printf "%.2f", a / b }')
ratio_cp=$(awk -v a="$p_cp" -v b="$n_cp" 'BEGIN { printf "%.2f", a / b }')
per250=$(awk -v s="$p_pack" -v b="$bytes" 'BEGIN { printf "%.2f", s / (b / 250e6) }')
per250k=$(awk -v s="$k_pack" -v b="$bytes" 'BEGIN { printf "%.2f", s / (b / 250e6) }')
echo "targets:"
echo "  cp -r into the mount <= 1.5x native cp+sync:  ${ratio_sync}x  $(verdict "$ratio_sync" 1.5)"
echo "    (against native cp alone, page cache only:  ${ratio_cp}x  $(verdict "$ratio_cp" 1.5))"
echo "  packing <= 1 s per 250 MB:                    ${per250} s  $(verdict "$per250" 1.0)  (with key: ${per250k} s $(verdict "$per250k" 1.0))"
echo "  daemon RSS <= 512 MB:                         $(( (rss_plain > rss_key ? rss_plain : rss_key) / 1024 )) MiB  $(verdict "$(( rss_plain > rss_key ? rss_plain : rss_key ))" $((512 << 10)))"
