# shellcheck shell=bash
# Helpers for the tests of writing into ckptfs (test_write*.sh): crashes,
# checkpoint states, errno checks. Mounting itself is mount_lib.sh's.
# Source after lib.sh.

. "$(dirname "${BASH_SOURCE[0]}")/mount_lib.sh"
WCLIENTS=$ROOT/tests/integration/write_clients.py
# The usual layout of one test file's mount, in its scratch directory.
cd "$TMP" || exit 1
BACK=$TMP/back
MNT=$TMP/mnt
LOG=$TMP/ckptfs.log

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

# expect_errno NAME ERRNO OP PATH [TO]: one operation gets that errno
# ("0": works); OP rename renames PATH to TO.
expect_errno() {
    local name=$1 want=$2 got
    got=$($PY "$WCLIENTS" errno-of "${@:3}" 2>&1)
    if [ "$got" = "$want" ]; then pass "$name"; else fail "$name" "got $got, want $want"; fi
}
