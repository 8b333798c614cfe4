# shellcheck shell=bash disable=SC2034 # its variables are the scripts'
# What the benchmark scripts share; sourced by bench/bench-*.sh and
# bench/report.sh after they set BENCH_NAME. Provides:
#
#   options      bench_common_opt: --quick, --threads LIST, --tsv FILE,
#                --src DIR, --size SIZE, --dtype/--dtypes LIST, -h/--help
#   checks       need_root REASON, need_bins, bench_die MSG
#   timing       now, elapsed T0 T1, mbps BYTES SECONDS, median, ratio A B
#   caches       drop_caches
#   mounts       start_daemon MNT CMD..., stop_mount MNT (sets LAST_HWM_KIB),
#                stop_all_mounts; every mount is undone on exit
#   memory       hwm_kib PID, run_rss CMD... (sets LAST_RSS_KIB)
#   inputs       gen_args SIZE DTYPE, gen_ckpt DIR DTYPE, use_src, dtype_of DIR
#   results      tsv_row BENCH DTYPE BYTES SYSTEM THREADS METRIC VALUE

BENCH_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin=$BENCH_ROOT/${B:-build}/bin
: "${BENCH_NAME:=bench}"

# ------------------------------------------------------------ options

quick=0
tsv=
src_dir=
size=
dtypes=()
threads_list=()

# bench_common_opt "$@": handles the option at $1 when it is a common one,
# setting BENCH_SHIFT to the number of words it took; returns 1 otherwise.
bench_common_opt() {
    BENCH_SHIFT=1
    case $1 in
    --quick) quick=1 ;;
    --tsv) tsv=${2:?--tsv needs a file}; BENCH_SHIFT=2 ;;
    --src) src_dir=${2:?--src needs a directory}; BENCH_SHIFT=2 ;;
    --size) size=${2:?--size needs a size such as 100M or 4G}; BENCH_SHIFT=2 ;;
    --dtype | --dtypes) IFS=, read -r -a dtypes <<<"${2:?$1 needs bf16, f16 or f32}"; BENCH_SHIFT=2 ;;
    --threads)
        mapfile -t threads_list < <(thread_counts "${2:?--threads needs a list}")
        printf '%s\n' "${threads_list[@]}" | grep -qvx '[1-9][0-9]*' && bench_die "bad --threads '$2' (want e.g. 1,2,4 or scale)"
        BENCH_SHIFT=2
        ;;
    -h | --help) bench_usage; exit 0 ;;
    *) return 1 ;;
    esac
}

# The comment block after the first line of the calling script is its help.
bench_usage() { sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; }

# thread_counts LIST: "1,2,8" as they are; "scale": 1, 2, 4, ... and nproc,
# and at least four points: on fewer than 4 cores 1, 2, 3, 4 (counts above
# nproc oversubscribe the cores; the report says so); "all": nproc.
thread_counts() {
    local n t
    n=$(nproc)
    case $1 in
    all) echo "$n" ;;
    scale)
        if [ "$n" -lt 4 ]; then
            printf '%s\n' 1 2 3 4
            return
        fi
        for ((t = 1; t < n; t *= 2)); do echo $t; done
        echo "$n"
        ;;
    *) tr , '\n' <<<"$1" | grep . ;;
    esac
}

# -------------------------------------------------------------- checks

bench_die() { echo "$BENCH_NAME: $*" >&2; exit 1; }

need_root() { [ "$(id -u)" -eq 0 ] || bench_die "needs root ($1)"; }

# use_workdir TEMPLATE [DIR]: work is DIR (made if missing) or a new mktemp
# TEMPLATE directory, as an absolute path; daemons log to work/daemons.log.
use_workdir() {
    work=${2:-$(mktemp -d "$1")}
    mkdir -p "$work"
    work=$(cd "$work" && pwd)
    BENCH_LOG=$work/daemons.log
}

need_bins() {
    local tool
    for tool in "$bin/ckpt" "$bin/ckpt-gen" "$@"; do
        [ -x "$tool" ] || bench_die "$tool is missing; run make first (B=${B:-build})"
    done
}

# ------------------------------------------------------------- timing

now() { echo "$EPOCHREALTIME"; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", b - a }'; }
mbps() { awk -v b="$1" -v s="$2" 'BEGIN { printf "%.1f", (s > 0) ? b / 1e6 / s : 0 }'; }
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR) print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a != "" && b > 0) printf "%.2f", a / b; else print "-" }'; }

# --------------------------------------------------------------- caches

drop_caches() {
    sync
    echo 3 >/proc/sys/vm/drop_caches
}

# --------------------------------------------------------------- memory

# Peak resident set of a live process, KiB.
hwm_kib() { awk '/^VmHWM:/ { print $2 }' "/proc/$1/status" 2>/dev/null || echo 0; }

# run_rss CMD...: runs CMD under /usr/bin/time; LAST_RSS_KIB is its peak RSS.
LAST_RSS_KIB=0
run_rss() {
    local f rc=0
    f=$(mktemp /tmp/bench-rss.XXXXXX)
    /usr/bin/time -f %M -o "$f" "$@" || rc=$?
    LAST_RSS_KIB=$(tail -n 1 "$f")
    rm -f "$f"
    return $rc
}

# --------------------------------------------------------------- mounts

declare -A bench_pid_of=()
LAST_HWM_KIB=0

wait_mounted() { # MNT [PID]
    local _
    for _ in $(seq 400); do
        mountpoint -q "$1" && return 0
        [ -n "${2:-}" ] && ! kill -0 "$2" 2>/dev/null && break
        sleep 0.05
    done
    bench_die "$1 did not mount"
}

# start_daemon MNT CMD...: runs a FUSE daemon that stays in the foreground
# (ckptfs -f, squashfuse -f, gocryptfs -fg) in the background, with its
# output away from any measuring pipeline, and waits for MNT.
start_daemon() {
    local mnt=$1
    shift
    mkdir -p "$mnt"
    "$@" </dev/null >/dev/null 2>>"${BENCH_LOG:-/dev/null}" &
    bench_pid_of[$mnt]=$!
    wait_mounted "$mnt" "${bench_pid_of[$mnt]}"
}

# stop_mount MNT: unmounts MNT and waits for its daemon; LAST_HWM_KIB is the
# daemon's peak RSS (0 when it was not started by start_daemon).
stop_mount() {
    local mnt=$1 pid=${bench_pid_of[$1]:-}
    LAST_HWM_KIB=0
    if [ -n "$pid" ]; then LAST_HWM_KIB=$(hwm_kib "$pid"); fi
    if mountpoint -q "$mnt" 2>/dev/null; then
        # umount where fusermount3 is missing (a lent machine), or the wait
        # below would hang on a daemon that is still mounted
        fusermount3 -u "$mnt" 2>/dev/null || { sleep 0.5; fusermount3 -u "$mnt" 2>/dev/null; } ||
            umount "$mnt" 2>/dev/null || true
    fi
    if [ -n "$pid" ]; then wait "$pid" 2>/dev/null || true; fi
    unset "bench_pid_of[$mnt]"
}

stop_all_mounts() {
    local m
    for m in "${!bench_pid_of[@]}"; do stop_mount "$m"; done
}
trap stop_all_mounts EXIT

# --------------------------------------------------------------- inputs

# bytes_of SIZE: 100M -> 100000000, 4G -> 4000000000 (decimal, like MB/s).
bytes_of() {
    awk -v s="$1" 'BEGIN {
        m = 1; u = toupper(substr(s, length(s)))
        if (u == "K") m = 1e3; else if (u == "M") m = 1e6; else if (u == "G") m = 1e9
        if (m > 1) s = substr(s, 1, length(s) - 1)
        if (s !~ /^[0-9.]+$/) exit 1
        printf "%.0f\n", s * m }'
}

# gen_args SIZE DTYPE: ckpt-gen options for a GPT-2-shaped checkpoint of
# about SIZE bytes (within about 10%): the width of the GPT-2 model of about
# that many parameters (768 up to 150M parameters, 1024 to 700M, 1280 to
# 1.2B, then 1600), as many layers as fit, and a smaller vocabulary only when
# even one layer and the full embedding would not fit.
gen_args() {
    local bytes
    bytes=$(bytes_of "$1") || bench_die "bad size '$1' (want e.g. 100M, 1G, 4G)"
    awk -v T="$bytes" -v dt="$2" 'BEGIN {
        b = (dt == "f32") ? 4 : 2; p = T / b
        d = p < 150e6 ? 768 : p < 700e6 ? 1024 : p < 1.2e9 ? 1280 : 1600
        V = 50257; per = (12 * d * d + 13 * d) * b; emb = (V + 1024 + 2) * d * b
        L = int((T - emb) / per + 0.5)
        if (L < 1) { L = 1; V = int((T - per) / (d * b)) - 1026; if (V < 1024) V = 1024 }
        printf "--dim %d --layers %d --vocab %d --dtype %s\n", d, L, V, dt }'
}

# gen_ckpt DIR DTYPE: generates the checkpoint into DIR unless it is there:
# --size when given, else GPT-2 medium (4 layers with --quick).
gen_ckpt() {
    local dir=$1 dtype=$2 args
    [ -f "$dir/config.json" ] && return 0
    if [ -n "$size" ]; then
        args=$(gen_args "$size" "$dtype")
    elif [ "$quick" = 1 ]; then
        args="--preset gpt2-medium --layers 4 --dtype $dtype"
    else
        args="--preset gpt2-medium --dtype $dtype"
    fi
    echo "$BENCH_NAME: generating $dir: ckpt-gen $args" >&2
    rm -rf "$dir.tmp"
    # shellcheck disable=SC2086 # $args is a list of options
    "$bin/ckpt-gen" "$dir.tmp" $args >/dev/null
    mv "$dir.tmp" "$dir"
}

# use_src: the checkpoint a benchmark measures, --src DIR or one generated
# (bf16) under $work/src; sets src, dtype and src_bytes.
use_src() {
    # shellcheck disable=SC2154 # work is set by the script before calling this
    if [ -n "$src_dir" ]; then
        src=$(cd "$src_dir" && pwd)
        [ -f "$src/config.json" ] || bench_die "$src is not a ckpt-gen checkpoint"
    else
        src=$work/src
        gen_ckpt "$src" bf16
    fi
    dtype=$(dtype_of "$src")
    src_bytes=$(du -sb "$src" | cut -f1)
}

# dtype_of DIR: bf16, f16 or f32, from the config.json ckpt-gen writes.
dtype_of() {
    local t
    t=$(sed -n 's/.*"torch_dtype": *"\([a-z0-9]*\)".*/\1/p' "$1/config.json" 2>/dev/null | head -n 1)
    case $t in
    bfloat16) echo bf16 ;;
    float16) echo f16 ;;
    float32) echo f32 ;;
    *) echo "${t:-unknown}" ;;
    esac
}

# -------------------------------------------------------------- results

# tsv_row BENCH DTYPE BYTES SYSTEM THREADS METRIC VALUE: one line of
# machine-readable results, appended to the --tsv file (when given).
# THREADS is "-" for a system that has no thread setting.
TSV_HEADER=$'bench\tdtype\tbytes\tsystem\tthreads\tmetric\tvalue'
tsv_row() {
    [ -n "$tsv" ] || return 0
    [ -s "$tsv" ] || echo "$TSV_HEADER" >"$tsv"
    local IFS=$'\t'
    echo "$*" >>"$tsv"
}
