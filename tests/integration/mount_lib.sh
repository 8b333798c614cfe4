# Mounting helpers shared by the mount and write test files: start ckptfs in the
# foreground on a backing dir, wait until it is mounted, unmount and reap it.
# Source after lib.sh.

CKPTFS=${CKPTFS:-$BUILD/bin/ckptfs}
CLIENTS=$ROOT/tests/integration/mount_clients.py

[ -c /dev/fuse ] || skip_all "no /dev/fuse"
command -v fusermount3 >/dev/null || skip_all "no fusermount3"
if [ ! -x "$CKPTFS" ] || [ ! -x "$CKPT" ]; then
    fail "binaries built" "$CKPTFS or $CKPT is missing; run make first"
    finish
fi

# ------------------------------------------------------------ mount helpers

declare -A DAEMON_OF=()
# Never leave a stale mount behind, whatever happened.
unmount_all() {
    local m
    for m in "${!DAEMON_OF[@]}"; do
        mountpoint -q "$m" && fusermount3 -u -z "$m" 2>/dev/null
        kill "${DAEMON_OF[$m]}" 2>/dev/null
    done
}
trap 'unmount_all; cleanup_tmp' EXIT

# mount_ckptfs BACKING MNT LOG [options...]: runs ckptfs -f in the
# background with its stderr appended to LOG (so a restart keeps the history)
# and waits up to 20 s until MNT is mounted.
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
