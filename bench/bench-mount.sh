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
# through mmap over the largest tensor (about 100 MB), cold and warm, and
# each daemon's peak RSS (VmHWM). Each figure is the median of --runs runs.
# The ckptfs modes are measured at each --threads count (`-o threads=N`, its
# decode workers); the other systems have no such setting. Prints a table in
# MB/s with ratios to native, squashfuse and gocryptfs, then the targets.
#
# Usage: bench/bench-mount.sh [options] [WORKDIR]
#   --quick           4 layers instead of 24 (about 200 MB), for a smoke run
#   --size SIZE       a checkpoint of about SIZE bytes instead (100M, 1G, 4G)
#   --src DIR         read this checkpoint instead of generating one
#   --runs N          runs per figure (default 3)
#   --threads LIST    ckptfs thread counts, e.g. 1,2,4 or "scale" (1, 2, 4
#                     ... nproc) (default: nproc)
#   --tsv FILE        also append the results to FILE as tab-separated
#                     bench/dtype/bytes/system/threads/metric/value lines
#   WORKDIR           kept afterwards (default: a new directory under /tmp);
#                     the generated data and packs are reused when there
set -euo pipefail
BENCH_NAME=bench-mount
# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
runs=3
while [ $# -gt 0 ]; do
    case $1 in
    --runs) runs=${2:?--runs needs a number}; shift 2 ;;
    *) bench_common_opt "$@" || break; shift "$BENCH_SHIFT" ;;
    esac
done
use_workdir /tmp/ckptfs-bench.XXXXXX "${1:-}"

need_root "to drop the page cache between cold runs"
need_bins "$bin/ckptfs"
[ ${#threads_list[@]} -gt 0 ] || threads_list=("$(nproc)")
have_squashfuse=1
have_gocryptfs=1
command -v mksquashfs >/dev/null && command -v squashfuse >/dev/null || have_squashfuse=0
command -v gocryptfs >/dev/null || have_gocryptfs=0

# -------------------------------------------------------------- mounts

# Every FUSE file system under test is mounted afresh before each cold run,
# so no daemon answers from what it cached during an earlier run; ckptfs
# with ck_threads decode workers. The peak RSS of the daemon serving the
# system being measured (cur_sys) is kept in rss_of when it is unmounted.
mnt=$work/mnt
sqmnt=$work/sqmnt
gcmnt=$work/gcmnt
ck_threads=${threads_list[-1]}
cur_sys=
declare -A rss_of=()
mount_all() {
    start_daemon "$mnt" "$bin/ckptfs" -f -o "key_file=$work/key,threads=$ck_threads" "$back" "$mnt"
    if [ $have_squashfuse = 1 ] && [ -f "$work/tensors.sqfs" ]; then
        start_daemon "$sqmnt" squashfuse -f "$work/tensors.sqfs" "$sqmnt"
    fi
    if [ $have_gocryptfs = 1 ] && [ -f "$work/gcipher/gocryptfs.conf" ]; then
        start_daemon "$gcmnt" gocryptfs -fg -q -nosyslog -passfile "$work/gocryptfs.pass" "$work/gcipher" "$gcmnt"
    fi
}

unmount_all() {
    local m
    for m in "$mnt" "$sqmnt" "$gcmnt"; do
        stop_mount "$m"
        case $cur_sys:$m in
        ckptfs-*:"$mnt" | squashfuse:"$sqmnt" | gocryptfs:"$gcmnt") ;;
        *) continue ;;
        esac
        if [ "$LAST_HWM_KIB" -gt "${rss_of[$cur_sys]:-0}" ]; then rss_of[$cur_sys]=$LAST_HWM_KIB; fi
    done
}

# --------------------------------------------------------------- inputs

use_src
[ -f "$work/key" ] || "$bin/ckpt" keygen -o "$work/key" >/dev/null 2>&1
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
    rm -rf "$native.tmp"
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
    mkdir -p "$work/gcipher.tmp"
    gocryptfs -init -q -nosyslog -passfile "$work/gocryptfs.pass" "$work/gcipher.tmp" >/dev/null
    start_daemon "$gcmnt" gocryptfs -fg -q -nosyslog -passfile "$work/gocryptfs.pass" "$work/gcipher.tmp" "$gcmnt"
    cp -r "$native/." "$gcmnt/"
    stop_mount "$gcmnt"
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

# How the page cache holds a warm file: the share of its first 16 MiB in
# large folios and the largest folio seen. Warm reads copy folio by folio,
# so this is what bounds a warm FUSE read against native.
cat >"$work/folios.c" <<'EOF'
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    int fd = open(argv[1], O_RDONLY);
    int pagemap = open("/proc/self/pagemap", O_RDONLY);
    int flags = open("/proc/kpageflags", O_RDONLY);
    struct stat st;
    if (argc != 2 || fd < 0 || pagemap < 0 || flags < 0 || fstat(fd, &st)) {
        perror("folios");
        return 1;
    }
    size_t pages = (size_t)st.st_size / 4096;
    if (pages > 4096)
        pages = 4096;
    volatile const unsigned char *map = mmap(NULL, pages * 4096, PROT_READ, MAP_SHARED, fd, 0);
    if (pages == 0 || map == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    size_t in_large = 0, run = 0, largest = 1;
    for (size_t i = 0; i < pages; i++) {
        (void)map[i * 4096];
        uint64_t entry = 0, f = 0;
        if (pread(pagemap, &entry, 8, (off_t)(((uintptr_t)map / 4096 + i) * 8)) != 8 ||
            pread(flags, &f, 8, (off_t)((entry & ((1ull << 55) - 1)) * 8)) != 8)
            return 1;
        int head = (f >> 15) & 1, tail = (f >> 16) & 1; /* KPF_COMPOUND_HEAD, _TAIL */
        in_large += head | tail;
        run = tail ? run + 1 : 1;
        largest = run > largest ? run : largest;
    }
    printf("%.0f%% of pages in large folios, largest %zu KiB\n", 100.0 * in_large / pages,
           largest * 4);
    return 0;
}
EOF
cc -O2 -o "$work/folios" "$work/folios.c"

# ---------------------------------------------------------- measurements

fresh_start() {
    unmount_all
    drop_caches
    mount_all
}

# Every file under DIR, in one fixed order, so each system reads the same.
list_files() { (cd "$1" && find . -type f | LC_ALL=C sort); }
mapfile -t files < <(list_files "$native")
largest=$(cd "$native" && find . -type f -printf '%s %p\n' | sort -n | tail -n 1 | cut -d' ' -f2-)
largest_size=$(stat -c %s "$native/$largest")

# seq_read and rand_read run in this shell, not in a $(subshell), since a
# cold run remounts: each sets val to the MB/s it measured.
val=
seq_read() { # DIR COLD(0/1)
    local dir=$1 cold=$2 t0 t1
    if [ "$cold" = 1 ]; then fresh_start; else (cd "$dir" && cat "${files[@]}" >/dev/null); fi
    t0=$(now)
    (cd "$dir" && cat "${files[@]}" >/dev/null)
    t1=$(now)
    val=$(mbps "$logical" "$(elapsed "$t0" "$t1")")
}

rand_read() { # DIR COLD(0/1): random 4 KiB reads
    local dir=$1 cold=$2 count secs
    if [ "$cold" = 1 ]; then
        fresh_start
        count=2000
    else
        cat "$dir/$largest" >/dev/null
        count=200000
    fi
    secs=$("$work/randread" "$dir/$largest" $count | cut -d' ' -f1)
    val=$(awk -v n=$count -v s="$secs" 'BEGIN { printf "%.1f\n", n * 4096 / 1e6 / s }')
}

measure() { # KEY FN DIR COLD: result[KEY] = the median of --runs runs
    local key=$1 i vals=
    shift
    for i in $(seq "$runs"); do
        "$@"
        vals+="$val"$'\n'
    done
    result[$key]=$(printf '%s' "$vals" | median)
}

# A system is NAME, or NAME@THREADS for the ckptfs modes; shown as NAME when
# there is one thread count, else as "NAME tTHREADS".
systems=(native)
declare -A dir_of=([native]=$native)
[ $have_squashfuse = 1 ] && { systems+=(squashfuse); dir_of[squashfuse]=$sqmnt; }
[ $have_gocryptfs = 1 ] && { systems+=(gocryptfs); dir_of[gocryptfs]=$gcmnt; }
for t in "${threads_list[@]}"; do
    for m in plain comp enc both; do
        systems+=("ckptfs-$m@$t")
        dir_of[ckptfs-$m@$t]=$mnt/$m/tensors
    done
done
shown() {
    if [ ${#threads_list[@]} -gt 1 ] && [[ $1 == *@* ]]; then echo "${1%@*} t${1#*@}"; else echo "${1%@*}"; fi
}
top=$(printf '%s\n' "${threads_list[@]}" | sort -n | tail -n 1)

# Every system must hand back the same bytes before its speed counts.
want=$(cd "$native" && cat "${files[@]}" | sha256sum)
for s in "${systems[@]}"; do
    got=$(cd "${dir_of[$s]}" && cat "${files[@]}" | sha256sum)
    [ "$got" = "$want" ] || bench_die "$s reads different bytes"
done

declare -A result
tests=("cold sequential" "warm sequential" "cold random 4K mmap" "warm random 4K mmap")
metrics=(cold_seq_mbps warm_seq_mbps cold_rand_mbps warm_rand_mbps)
# Other work on the machine skews these figures; note how busy it was.
max_load=0
note_load() {
    max_load=$(awk -v m="$max_load" '{ print ($1 > m ? $1 : m) }' /proc/loadavg)
}
for s in "${systems[@]}"; do
    note_load
    d=${dir_of[$s]}
    cur_sys=${s%@*}
    [[ $s == *@* ]] && ck_threads=${s#*@}
    rss_of[$cur_sys]=0
    measure "$s,cold sequential" seq_read "$d" 1
    measure "$s,warm sequential" seq_read "$d" 0
    measure "$s,cold random 4K mmap" rand_read "$d" 1
    measure "$s,warm random 4K mmap" rand_read "$d" 0
    unmount_all
    rss_of[$s]=${rss_of[$cur_sys]}
    cur_sys=
    mount_all
    threads=-
    [[ $s == *@* ]] && threads=${s#*@}
    for i in "${!tests[@]}"; do
        tsv_row mount "$dtype" "$src_bytes" "${s%@*}" "$threads" "${metrics[$i]}" "${result[$s,${tests[$i]}]}"
    done
    [ "$s" = native ] || tsv_row mount "$dtype" "$src_bytes" "${s%@*}" "$threads" rss_kib "${rss_of[$s]}"
done

# --------------------------------------------------------------- report

echo
echo "ckptfs read benchmark: $(basename "$src") $dtype, $((src_bytes / 1000000)) MB checkpoint," \
    "$((logical / 1000000)) MB of tensors in ${#files[@]} files; largest $((largest_size / 1000000)) MB;" \
    "$(nproc) cores; median of $runs runs; MB/s"
printf '\n| test |'
for s in "${systems[@]}"; do printf ' %s |' "$(shown "$s")"; done
printf '\n|---|'
for s in "${systems[@]}"; do printf -- '---|'; done
printf '\n'
for t in "${tests[@]}"; do
    printf '| %s |' "$t"
    for s in "${systems[@]}"; do printf ' %s |' "${result[$s,$t]}"; done
    printf '\n'
done
for base in native squashfuse gocryptfs; do
    [ -n "${result[$base,cold sequential]:-}" ] || continue
    for t in "${tests[@]}"; do
        printf '| %s, x %s |' "$t" "$base"
        for s in "${systems[@]}"; do printf ' %s |' "$(ratio "${result[$s,$t]}" "${result[$base,$t]}")"; done
        printf '\n'
    done
done
printf '| daemon peak RSS MiB |'
for s in "${systems[@]}"; do
    if [ "$s" = native ]; then printf ' - |'; else printf ' %s |' "$((rss_of[$s] / 1024))"; fi
done
printf '\n'

echo
echo "page cache of $largest after a warm read (Linux $(uname -r)):"
for s in native "ckptfs-both@$top" $([ $have_squashfuse = 1 ] && echo squashfuse); do
    cat "${dir_of[$s]}/$largest" >/dev/null
    printf '  %-14s %s\n' "$(shown "$s")" "$("$work/folios" "${dir_of[$s]}/$largest" || echo "not measured")"
done

note_load
echo
echo "highest 1-minute load average seen: $max_load (this script alone keeps it near 1-2;" \
    "more means other work competed for the $(nproc) cores)"
target() { # NAME VALUE GOAL
    awk -v n="$1" -v v="$2" -v g="$3" 'BEGIN { printf "%-58s %6.2f  (target >= %.2f)  %s\n", n, v, g, (v >= g ? "met" : "MISSED") }'
}
[ ${#threads_list[@]} -gt 1 ] && echo "targets at $top threads:"
if [ $have_squashfuse = 1 ]; then
    target "compressed+encrypted cold read, x squashfuse" \
        "$(ratio "${result[ckptfs-both@$top,cold sequential]}" "${result[squashfuse,cold sequential]}")" 4
fi
worst_warm=$(for m in plain comp enc both; do echo "${result[ckptfs-$m@$top,warm sequential]}"; done | sort -g | head -n 1)
target "warm re-read (slowest ckptfs mode), x native" "$(ratio "$worst_warm" "${result[native,warm sequential]}")" 0.9
target "plain pack cold read, x native" \
    "$(ratio "${result[ckptfs-plain@$top,cold sequential]}" "${result[native,cold sequential]}")" 0.7
# Compression means fewer bytes from the disk: the issue 15 target.
target "compressed+encrypted cold read, x native" \
    "$(ratio "${result[ckptfs-both@$top,cold sequential]}" "${result[native,cold sequential]}")" 1.0
echo "data kept in $work"
