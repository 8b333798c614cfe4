#!/usr/bin/env bash
# Builds side by side on one machine (issue 15): `ckpt pack`, `verify`,
# `unpack` and `cat` of a generated bf16 checkpoint, and the daemon's
# background packing of it (as root, with /dev/fuse), compressed +
# encrypted, each build taking its turn in every round so that they share
# the machine's state. Prints every timing (wall, user, sys) and then the
# median wall time of each stage, thread count and build. Meant for a lent
# machine with more cores (bench/carry.sh brings the builds there), and
# runs here as well.
#
# Usage: bench/bench-ab.sh [options] WORKDIR BINDIR [BINDIR...]
#   BINDIR       a directory with ckpt and ckptfs (build/bin, or a carried
#                build's bin/); the first one's ckpt-gen makes the input
#   --rounds N   turns of each build (default 3)
#   --threads L  thread counts, e.g. 1,16 or scale (default: nproc)
#   --preset P   ckpt-gen preset (default gpt2-xl, 3.1 GB)
#   --shards N   files of the checkpoint (default 4)
#   --stages L   of pack verify unpack cat background (default: all)
set -euo pipefail
BENCH_NAME=bench-ab
# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
rounds=3 preset=gpt2-xl shards=4 stages="pack verify unpack cat background"
mapfile -t threads_list < <(thread_counts all)
while [ $# -gt 0 ]; do
    case $1 in
    --rounds) rounds=$2; shift 2 ;;
    --preset) preset=$2; shift 2 ;;
    --shards) shards=$2; shift 2 ;;
    --stages) stages=$2; shift 2 ;;
    --threads | -h | --help) bench_common_opt "$@"; shift "$BENCH_SHIFT" ;;
    *) break ;;
    esac
done
[ $# -ge 2 ] || { bench_usage >&2; exit 2; }
work=$1
shift
builds=("$@")
for b in "${builds[@]}"; do
    [ -x "$b/ckpt" ] || { echo "bench-ab: no $b/ckpt" >&2; exit 2; }
done
mkdir -p "$work"
BENCH_LOG=$work/stderr.log
src=$work/src-$preset-$shards key=$work/key log=$work/times.tsv
[ -d "$src" ] || "${builds[0]}/ckpt-gen" "$src" --preset "$preset" --shards "$shards" >/dev/null
[ -f "$key" ] || "${builds[0]}/ckpt" keygen -o "$key" >/dev/null 2>&1
: >"$log"
cat "$src"/* >/dev/null
echo "$(nproc) cores; $(du -sb "$src" | cut -f1) bytes in $shards files ($preset); builds: ${builds[*]}"

# timed LABEL CMD...: one line "stage threads build wall user sys" to the log
timed() {
    local label=$1 TIMEFORMAT='%R %U %S' t
    shift
    t=$({ time "$@" >/dev/null 2>>"$work/stderr.log"; } 2>&1) || { echo "$label: failed, see $work/stderr.log" >&2; return 1; }
    echo "$label $t" | tee -a "$log"
}

background() { # BINDIR THREADS LABEL: copy into a mount, then ckpt commit --wait
    local b=$1 t=$2 label=$3 mnt=$work/mnt back=$work/back
    rm -rf "$back" && mkdir -p "$back"
    start_daemon "$mnt" "$b/ckptfs" -f -o "commit_delay=3600,threads=$t,key_file=$key" "$back" "$mnt"
    mkdir "$mnt/ck" && cp -r "$src/." "$mnt/ck/"
    timed "$label" "$b/ckpt" commit --wait --quiet "$mnt/ck"
    stop_mount "$mnt"
    rm -rf "$back"
}

for t in "${threads_list[@]}"; do
    for r in $(seq "$rounds"); do
        for i in "${!builds[@]}"; do
            b=${builds[$i]} p=$work/b$i.tpack
            [[ " $stages " = *" pack "* || ! -f $p ]] && rm -f "$p" &&
                timed "pack $t $i" "$b/ckpt" pack "$src" -o "$p" --threads "$t" --key-file "$key"
            [[ " $stages " = *" verify "* ]] && timed "verify $t $i" "$b/ckpt" verify "$p" --threads "$t" --key-file "$key"
            if [[ " $stages " = *" unpack "* ]]; then
                rm -rf "$work/un"
                timed "unpack $t $i" "$b/ckpt" unpack "$p" -o "$work/un" --threads "$t" --key-file "$key"
                rm -rf "$work/un"
            fi
            if [[ " $stages " = *" cat "* ]]; then
                f=$("$b/ckpt" ls "$p" --key-file "$key" 2>/dev/null | awk '/\.safetensors$/ { print $NF; exit }')
                [ -n "$f" ] && timed "cat $t $i" "$b/ckpt" cat "$p" "$f" --threads "$t" --key-file "$key"
            fi
            if [[ " $stages " = *" background "* ]] && [ "$(id -u)" = 0 ] && [ -e /dev/fuse ]; then
                background "$b" "$t" "background $t $i"
            fi
        done
    done
done
echo "median wall s of each stage, thread count and build (0 = the first given)"
cut -d' ' -f1-3 "$log" | sort -u -k1,1 -k2,2n -k3,3n | while read -r st t i; do
    echo "$st $t build$i $(awk -v s="$st" -v t="$t" -v i="$i" '$1 == s && $2 == t && $3 == i { print $4 }' "$log" | median)"
done
