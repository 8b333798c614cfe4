# shellcheck shell=bash
# Mount helpers for the tests of writing into ckptfs (test_write*.sh).
# Source after lib.sh. Every mount is remembered so that an aborted test
# never leaves one behind.

CKPTFS=${CKPTFS:-$BUILD/bin/ckptfs}
WCLIENTS=$ROOT/tests/integration/write_clients.py

write_preflight() {
    [ -c /dev/fuse ] || skip_all "no /dev/fuse"
    command -v fusermount3 >/dev/null || skip_all "no fusermount3"
    if [ ! -x "$CKPTFS" ] || [ ! -x "$CKPT" ]; then
        fail "binaries built" "$CKPTFS or $CKPT is missing; run make first"
        finish
    fi
}

declare -A DAEMON_OF=()
unmount_all() {
    local m
    for m in "${!DAEMON_OF[@]}"; do
        mountpoint -q "$m" && fusermount3 -u -z "$m" 2>/dev/null
        kill "${DAEMON_OF[$m]}" 2>/dev/null
    done
}
trap 'unmount_all; cleanup_tmp' EXIT

# mount_ckptfs BACKING MNT LOG [options...]: ckptfs -f in the background,
# stderr to LOG (appended, so restarts keep the history); waits until mounted.
mount_ckptfs() {
    local back=$1 mnt=$2 log=$3 _
    shift 3
    mkdir -p "$mnt"
    "$CKPTFS" -f "$@" "$back" "$mnt" 2>>"$log" &
    DAEMON_OF[$mnt]=$!
    for _ in $(seq 400); do
        mountpoint -q "$mnt" && return 0
        kill -0 "${DAEMON_OF[$mnt]}" 2>/dev/null || return 1
        sleep 0.05
    done
    return 1
}

# unmount_ckptfs MNT: unmounts; returns the daemon's exit status.
unmount_ckptfs() {
    local pid=${DAEMON_OF[$1]}
    fusermount3 -u "$1"
    wait "$pid"
    local rc=$?
    unset "DAEMON_OF[$1]"
    return $rc
}

# crash_ckptfs MNT: SIGKILL the daemon, then drop the dead mount.
crash_ckptfs() {
    local pid=${DAEMON_OF[$1]}
    kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    fusermount3 -u -z "$1" 2>/dev/null
    unset "DAEMON_OF[$1]"
}

# state_of DIR: the checkpoint's user.ckptfs.state, or "none".
state_of() {
    getfattr --only-values -n user.ckptfs.state "$1" 2>/dev/null || echo none
}

# wait_state NAME DIR STATE [SECONDS]: polls until the state is STATE.
wait_state() {
    local name=$1 dir=$2 want=$3 secs=${4:-60} _ s
    for _ in $(seq $((secs * 10))); do
        s=$(state_of "$dir")
        [ "$s" = "$want" ] && { pass "$name"; return 0; }
        sleep 0.1
    done
    fail "$name" "state is '$s', want '$want'"
}

# expect_errno NAME ERRNO OP PATH: one operation gets that errno ("0": works).
expect_errno() {
    local name=$1 want=$2 got
    got=$($PY "$WCLIENTS" errno-of "$3" "$4" 2>&1)
    if [ "$got" = "$want" ]; then pass "$name"; else fail "$name" "got $got, want $want"; fi
}
