#!/usr/bin/env bash
# Read benchmark of the ckptfs mount (run by `make bench-mount`, as root:
# cold runs drop the page cache). On a generated GPT-2-medium bf16
# checkpoint (about 700 MB) it reads the raw tensor files side by side:
#
#   native      the raw tensors, extracted to a directory on the local disk
#   squashfuse  a `mksquashfs -comp gzip -b 1M` image of the same files
#   gocryptfs   the same files in an encrypted gocryptfs directory
#   ckptfs      tensors/* of the pack stored plain (--no-compress), compressed,
#               encrypted (--no-compress --key-file) and both
#
# and measures cold sequential reads (cat of every file, after
# `echo 3 > /proc/sys/vm/drop_caches`), warm re-reads, and random 4 KiB reads
# through mmap over the largest tensor (about 100 MB), cold and warm. Each
# figure is the median of --runs runs. Prints a table in MB/s with ratios to
# native and to squashfuse, then the targets.
#
# Usage: bench/bench-mount.sh [--quick] [--runs N] [WORKDIR]
#   --quick  4 layers instead of 24 (about 150 MB), for a smoke run
#   WORKDIR  kept afterwards (default: a new directory under /tmp); the
#            generated data and packs are reused when already there
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
work=${1:-$(mktemp -d /tmp/ckptfs-bench.XXXXXX)}
mkdir -p "$work"
work=$(cd "$work" && pwd)

if [ "$(id -u)" -ne 0 ]; then
    echo "bench-mount: needs root to drop the page cache between cold runs" >&2
    exit 1
fi
for tool in "$bin/ckptfs" "$bin/ckpt" "$bin/ckpt-gen"; do
    [ -x "$tool" ] || { echo "bench-mount: $tool is missing; run make first" >&2; exit 1; }
done
have_squashfuse=1
have_gocryptfs=1
command -v mksquashfs >/dev/null && command -v squashfuse >/dev/null || have_squashfuse=0
command -v gocryptfs >/dev/null || have_gocryptfs=0

# -------------------------------------------------------------- mounts

# Every FUSE file system under test is mounted afresh before each cold run,
# so no daemon answers from what it cached during an earlier run.
mnt=$work/mnt
sqmnt=$work/sqmnt
gcmnt=$work/gcmnt
ckptfs_pid=
cleanup() {
    local m
    for m in "$mnt" "$sqmnt" "$gcmnt"; do
        mountpoint -q "$m" 2>/dev/null && fusermount3 -u "$m" 2>/dev/null || true
    done
    [ -n "$ckptfs_pid" ] && wait "$ckptfs_pid" 2>/dev/null || true
}
trap cleanup EXIT

wait_mounted() {
    local i
    for i in $(seq 400); do
        mountpoint -q "$1" && return 0
        sleep 0.05
    done
    echo "bench-mount: $1 did not mount" >&2
    exit 1
}

mount_all() {
    mkdir -p "$mnt" "$sqmnt" "$gcmnt"
    # Daemons must not hold the stdout of a measuring pipeline open.
    "$bin/ckptfs" -f -o key_file="$work/key" "$back" "$mnt" >/dev/null 2>>"$work/ckptfs.log" &
    ckptfs_pid=$!
    wait_mounted "$mnt"
    if [ $have_squashfuse = 1 ] && [ -f "$work/tensors.sqfs" ]; then
        squashfuse "$work/tensors.sqfs" "$sqmnt" >/dev/null
        wait_mounted "$sqmnt"
    fi
    if [ $have_gocryptfs = 1 ] && [ -f "$work/gcipher/gocryptfs.conf" ]; then
        gocryptfs -q -nosyslog -extpass "cat $work/gocryptfs.pass" "$work/gcipher" "$gcmnt" >/dev/null
        wait_mounted "$gcmnt"
    fi
}

unmount_all() {
    cleanup
    ckptfs_pid=
}

# --------------------------------------------------------------- inputs

layers=24
[ $quick = 1 ] && layers=4
src=$work/src
if [ ! -f "$src/model.safetensors" ]; then
    "$bin/ckpt-gen" "$src" --preset gpt2-medium --layers $layers --dtype bf16 >/dev/null
fi
[ -f "$work/key" ] || "$bin/ckpt" keygen -o "$work/key" >/dev/null
back=$work/back
mkdir -p "$back"
pack() { # NAME [pack options...]
    local name=$1
    shift
    [ -f "$back/$name.tpack" ] || "$bin/ckpt" pack "$src" -o "$back/$name.tpack" "$@" >/dev/null
}
pack plain --no-compress
pack comp
pack enc --no-compress --key-file "$work/key"
pack both --key-file "$work/key"

mount_all

# The raw tensor files, as the other file systems will hold them.
native=$work/native
if [ ! -d "$native" ]; then
    cp -r "$mnt/plain/tensors" "$native.tmp"
    mv "$native.tmp" "$native"
fi
logical=$(du -sb "$native" | cut -f1)

if [ $have_squashfuse = 1 ] && [ ! -f "$work/tensors.sqfs" ]; then
    mksquashfs "$native" "$work/tensors.sqfs.tmp" -comp gzip -b 1M -noappend -quiet -no-progress >/dev/null
    mv "$work/tensors.sqfs.tmp" "$work/tensors.sqfs"
fi
if [ $have_gocryptfs = 1 ] && [ ! -f "$work/gcipher/gocryptfs.conf" ]; then
    printf 'bench passphrase\n' >"$work/gocryptfs.pass"
    rm -rf "$work/gcipher" "$work/gcipher.tmp"
    mkdir -p "$work/gcipher.tmp" "$gcmnt"
    gocryptfs -init -q -nosyslog -extpass "cat $work/gocryptfs.pass" "$work/gcipher.tmp" >/dev/null
    gocryptfs -q -nosyslog -extpass "cat $work/gocryptfs.pass" "$work/gcipher.tmp" "$gcmnt"
    cp -r "$native/." "$gcmnt/"
    fusermount3 -u "$gcmnt"
    mv "$work/gcipher.tmp" "$work/gcipher"
fi
unmount_all
mount_all

# Random 4 KiB reads through a shared read-only mapping.
cat >"$work/randread.c" <<'EOF'
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: randread FILE COUNT\n");
        return 2;
    }
    int fd = open(argv[1], O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) || st.st_size < 4096) {
        perror(argv[1]);
        return 1;
    }
    long count = atol(argv[2]);
    size_t pages = (size_t)st.st_size / 4096;
    const unsigned char *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    static unsigned char page[4096];
    uint64_t x = 88172645463325252ull, sum = 0;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long i = 0; i < count; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        memcpy(page, map + (x % pages) * 4096, 4096);
        sum += page[i & 4095];
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("%.6f %llu\n", (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9,
           (unsigned long long)sum);
    return 0;
}
EOF
cc -O2 -o "$work/randread" "$work/randread.c"

# ---------------------------------------------------------- measurements

fresh_start() {
    unmount_all
    sync
    echo 3 >/proc/sys/vm/drop_caches
    mount_all
}
now() { date +%s.%N; }
median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

# Every file under DIR, in one fixed order, so each system reads the same.
list_files() { (cd "$1" && find . -type f | LC_ALL=C sort); }
mapfile -t files < <(list_files "$native")
largest=$(cd "$native" && find . -type f -printf '%s %p\n' | sort -n | tail -n 1 | cut -d' ' -f2-)
largest_size=$(stat -c %s "$native/$largest")

seq_read() { # DIR COLD(0/1): prints MB/s
    local dir=$1 cold=$2 t0 t1
    if [ "$cold" = 1 ]; then fresh_start; else (cd "$dir" && cat "${files[@]}" >/dev/null); fi
    t0=$(now)
    (cd "$dir" && cat "${files[@]}" >/dev/null)
    t1=$(now)
    awk -v b="$logical" -v t0="$t0" -v t1="$t1" 'BEGIN { printf "%.1f\n", b / 1e6 / (t1 - t0) }'
}

rand_read() { # DIR COLD(0/1): prints MB/s of random 4 KiB reads
    local dir=$1 cold=$2 count secs
    if [ "$cold" = 1 ]; then
        fresh_start
        count=2000
    else
        cat "$dir/$largest" >/dev/null
        count=200000
    fi
    secs=$("$work/randread" "$dir/$largest" $count | cut -d' ' -f1)
    awk -v n=$count -v s="$secs" 'BEGIN { printf "%.1f\n", n * 4096 / 1e6 / s }'
}

measure() { # FN DIR COLD
    local i
    for i in $(seq "$runs"); do "$@"; done | median
}

systems=(native)
declare -A dir_of=([native]=$native)
[ $have_squashfuse = 1 ] && { systems+=(squashfuse); dir_of[squashfuse]=$sqmnt; }
[ $have_gocryptfs = 1 ] && { systems+=(gocryptfs); dir_of[gocryptfs]=$gcmnt; }
for m in plain comp enc both; do
    systems+=("ckptfs-$m")
    dir_of[ckptfs-$m]=$mnt/$m/tensors
done

# Every system must hand back the same bytes before its speed counts.
want=$(cd "$native" && cat "${files[@]}" | sha256sum)
for s in "${systems[@]}"; do
    got=$(cd "${dir_of[$s]}" && cat "${files[@]}" | sha256sum)
    [ "$got" = "$want" ] || { echo "bench-mount: $s reads different bytes" >&2; exit 1; }
done

declare -A result
tests=("cold sequential" "warm sequential" "cold random 4K mmap" "warm random 4K mmap")
# Other work on the machine skews these figures; note how busy it was.
max_load=0
note_load() {
    max_load=$(awk -v m="$max_load" '{ print ($1 > m ? $1 : m) }' /proc/loadavg)
}
for s in "${systems[@]}"; do
    note_load
    d=${dir_of[$s]}
    result["$s,cold sequential"]=$(measure seq_read "$d" 1)
    result["$s,warm sequential"]=$(measure seq_read "$d" 0)
    result["$s,cold random 4K mmap"]=$(measure rand_read "$d" 1)
    result["$s,warm random 4K mmap"]=$(measure rand_read "$d" 0)
done

# --------------------------------------------------------------- report

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }'; }
echo
echo "ckptfs read benchmark: $(basename "$src") gpt2-medium bf16, $((layers)) layers," \
    "$((logical / 1000000)) MB of tensors in ${#files[@]} files; largest $((largest_size / 1000000)) MB;" \
    "$(nproc) cores; median of $runs runs; MB/s"
printf '\n| test |'
for s in "${systems[@]}"; do printf ' %s |' "$s"; done
printf '\n|---|'
for s in "${systems[@]}"; do printf -- '---|'; done
printf '\n'
for t in "${tests[@]}"; do
    printf '| %s |' "$t"
    for s in "${systems[@]}"; do printf ' %s |' "${result[$s,$t]}"; done
    printf '\n'
done
for base in native squashfuse; do
    [ -n "${result[$base,cold sequential]:-}" ] || continue
    for t in "${tests[@]}"; do
        printf '| %s, x %s |' "$t" "$base"
        for s in "${systems[@]}"; do printf ' %s |' "$(ratio "${result[$s,$t]}" "${result[$base,$t]}")"; done
        printf '\n'
    done
done

note_load
echo
echo "highest 1-minute load average seen: $max_load (this script alone keeps it near 1-2;" \
    "more means other work competed for the $(nproc) cores)"
target() { # NAME VALUE GOAL
    awk -v n="$1" -v v="$2" -v g="$3" 'BEGIN { printf "%-58s %6.2f  (target >= %.2f)  %s\n", n, v, g, (v >= g ? "met" : "MISSED") }'
}
if [ $have_squashfuse = 1 ]; then
    target "compressed+encrypted cold read, x squashfuse" \
        "$(ratio "${result[ckptfs-both,cold sequential]}" "${result[squashfuse,cold sequential]}")" 4
fi
worst_warm=$(for m in plain comp enc both; do echo "${result[ckptfs-$m,warm sequential]}"; done | sort -g | head -n 1)
target "warm re-read (slowest ckptfs mode), x native" "$(ratio "$worst_warm" "${result[native,warm sequential]}")" 0.9
target "plain pack cold read, x native" \
    "$(ratio "${result[ckptfs-plain,cold sequential]}" "${result[native,cold sequential]}")" 0.7
echo "data kept in $work"
