# Assertions for the integration tests; source it from a test_*.sh.
#
# Every assertion takes a descriptive name first, prints "PASS name" or
# "FAIL name" (with what went wrong), and counts. `finish` prints the
# "RESULT pass=N fail=N skip=N" line that run.sh tallies and exits non-zero
# on any failure. A whole test file that cannot run here prints
# "SKIP: <reason>" and exits 77 via `skip_all`.
#
# Commands run by expect_* leave their exit status, stdout and stderr in
# $LAST_RC, $LAST_OUT and $LAST_ERR (files), for follow-up assertions such as
# last_stderr_has.

set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
B=${B:-build}
case $B in /*) BUILD=$B ;; *) BUILD=$ROOT/$B ;; esac
# Overridable, to test an installed or otherwise built binary.
CKPT=${CKPT:-$BUILD/bin/ckpt}
CKPT_GEN=${CKPT_GEN:-$BUILD/bin/ckpt-gen}
# Debian's interpreter, which has numpy; the first python3 on PATH may not.
PY=/usr/bin/python3

T_PASS=0
T_FAIL=0
T_SKIP=0

# Scratch space, removed on exit unless KEEP_TMP=1 (handy when debugging).
TMP=$(mktemp -d "${TMPDIR:-/tmp}/ckpt-it.XXXXXX")
LAST_OUT=$TMP/.last.out
LAST_ERR=$TMP/.last.err
LAST_RC=0
cleanup_tmp() { [ "${KEEP_TMP:-0}" = 1 ] && echo "kept $TMP" >&2 || rm -rf "$TMP"; }
trap cleanup_tmp EXIT

pass() { T_PASS=$((T_PASS + 1)); echo "PASS $1"; }

fail() {
    T_FAIL=$((T_FAIL + 1))
    echo "FAIL $1"
    shift
    [ $# -gt 0 ] && printf '     %s\n' "$@"
    return 0
}

skip() { T_SKIP=$((T_SKIP + 1)); echo "SKIP $1: $2"; }

skip_all() { echo "SKIP: $1"; exit 77; }

# Runs "$@" capturing stdout and stderr; never aborts the test file.
run_cmd() {
    "$@" >"$LAST_OUT" 2>"$LAST_ERR"
    LAST_RC=$?
    return 0
}

# What a failed assertion shows: the command, its status and its stderr.
show_last() {
    printf '     $ %s\n     exit %s\n' "$*" "$LAST_RC"
    sed -n '1,8s/^/     stderr: /p' "$LAST_ERR"
}

# expect_exit NAME CODE cmd...
expect_exit() {
    local name=$1 code=$2
    shift 2
    run_cmd "$@"
    if [ "$LAST_RC" -eq "$code" ]; then pass "$name"; else fail "$name" "expected exit $code"; show_last "$@"; fi
}

# expect_ok NAME cmd...
expect_ok() { local name=$1; shift; expect_exit "$name" 0 "$@"; }

# expect_fail NAME cmd...: any non-zero status, but not a crash (>= 128).
expect_fail() {
    local name=$1
    shift
    run_cmd "$@"
    if [ "$LAST_RC" -ne 0 ] && [ "$LAST_RC" -lt 128 ]; then
        pass "$name"
    else
        fail "$name" "expected a clean failure"
        show_last "$@"
    fi
}

# expect_stderr_contains NAME TEXT cmd...: runs cmd, checks its stderr.
expect_stderr_contains() {
    local name=$1 text=$2
    shift 2
    run_cmd "$@"
    if grep -qF -- "$text" "$LAST_ERR"; then pass "$name"; else fail "$name" "stderr lacks '$text'"; show_last "$@"; fi
}

# last_stderr_has NAME TEXT...: every TEXT appears in the last command's stderr.
last_stderr_has() {
    local name=$1 t
    shift
    for t in "$@"; do
        if ! grep -qF -- "$t" "$LAST_ERR"; then
            fail "$name" "stderr lacks '$t'"
            sed -n '1,8s/^/     stderr: /p' "$LAST_ERR"
            return 0
        fi
    done
    pass "$name"
}

# last_stdout_has NAME TEXT...: the same for stdout.
last_stdout_has() {
    local name=$1 t
    shift
    for t in "$@"; do
        if ! grep -qF -- "$t" "$LAST_OUT"; then
            fail "$name" "stdout lacks '$t'"
            sed -n '1,8s/^/     stdout: /p' "$LAST_OUT"
            return 0
        fi
    done
    pass "$name"
}

# last_stdout_matches NAME ERE: some line of the last stdout matches.
last_stdout_matches() {
    if grep -qE -- "$2" "$LAST_OUT"; then
        pass "$1"
    else
        fail "$1" "no stdout line matches /$2/"
        sed -n '1,8s/^/     stdout: /p' "$LAST_OUT"
    fi
}

# expect_same_sha256 NAME FILE_A FILE_B
expect_same_sha256() {
    local a b
    a=$(sha256sum <"$2" 2>/dev/null | cut -d' ' -f1)
    b=$(sha256sum <"$3" 2>/dev/null | cut -d' ' -f1)
    if [ -n "$a" ] && [ "$a" = "$b" ]; then pass "$1"; else fail "$1" "$2: ${a:-unreadable}" "$3: ${b:-unreadable}"; fi
}

# The cipher a pack gets with a key and no --cipher: AES-256-GCM where the
# CPU has hardware AES and carry-less multiply (x86 aes + pclmulqdq, Arm aes +
# pmull: what libsodium's crypto_aead_aes256gcm_is_available() checks),
# XChaCha20-Poly1305 elsewhere.
default_cipher() {
    if grep -qw aes /proc/cpuinfo && grep -qwE 'pclmulqdq|pmull' /proc/cpuinfo; then
        echo aes256gcm
    else
        echo xchacha20poly1305
    fi
}

# One line per regular file under DIR: path, mode, size, mtime (ns), sha256.
tree_manifest() {
    (cd "$1" && find . -type f -printf '%P\n' | LC_ALL=C sort | while IFS= read -r f; do
        printf '%s %s %s\n' "$f" "$(stat -c '%a %s %.9Y' -- "$f")" "$(sha256sum <"$f" | cut -d' ' -f1)"
    done)
}

# expect_same_tree NAME DIR_A DIR_B: same files, bytes, modes and mtimes.
expect_same_tree() {
    local d
    if d=$(diff <(tree_manifest "$2") <(tree_manifest "$3")); then
        pass "$1"
    else
        fail "$1" "trees differ:"
        printf '%s\n' "$d" | sed -n '1,10s/^/     /p'
    fi
}

# expect_absent NAME PATH...
expect_absent() {
    local name=$1 p
    shift
    for p in "$@"; do
        if [ -e "$p" ] || [ -L "$p" ]; then fail "$name" "$p exists"; return 0; fi
    done
    pass "$name"
}

finish() {
    echo "RESULT pass=$T_PASS fail=$T_FAIL skip=$T_SKIP"
    [ "$T_FAIL" -eq 0 ]
    exit
}
