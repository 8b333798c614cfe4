#!/usr/bin/env bash
# Running ckptfs day to day: where its log lines go (stderr with -f, syslog
# once daemonized, or -o log_file) and at which level; -o debug tracing
# each request and its outcome; no key material in any log; SIGHUP
# reopening a rotated log file (and harmless otherwise); SIGTERM while a
# checkpoint is being packed: a prompt, clean exit that suspends the pack,
# and a next mount that packs it to the same bytes.
#
# The syslog part needs /dev/log to itself: with no syslog daemon on the
# machine it listens there for the few seconds it needs (and removes it);
# where a syslog daemon owns /dev/log, that part is skipped.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/write_lib.sh"

cd "$TMP" || exit 1
"$CKPT" keygen -o "$TMP/key" >/dev/null
# What a leaked key would look like in a log: its bytes in hex (whole, or
# its first 8 bytes), in base64, or raw.
KEY_HEX=$(od -An -tx1 -v "$TMP/key" | tr -d ' \n')
KEY_B64=$(base64 -w0 "$TMP/key")
LISTENER=

stop_listener() {
    [ -n "$LISTENER" ] || return 0
    kill "$LISTENER" 2>/dev/null
    wait "$LISTENER" 2>/dev/null
    rm -f /dev/log
    LISTENER=
}
trap 'stop_listener; unmount_all; cleanup_tmp' EXIT

# gone PID: the process has exited (a zombie nobody reaped counts).
gone() {
    [ ! -e "/proc/$1" ] || grep -q '^State:.*Z' "/proc/$1/status" 2>/dev/null
}

# wait_gone PID SECONDS: polls until gone; fails after SECONDS.
wait_gone() {
    local _
    for _ in $(seq $(($2 * 20))); do
        gone "$1" && return 0
        sleep 0.05
    done
    return 1
}

# mount_daemon BACK MNT [options...]: ckptfs without -f (it daemonizes);
# waits until mounted. The daemon's pid comes from its first log line.
mount_daemon() {
    local back=$1 mnt=$2 _
    shift 2
    mkdir -p "$mnt"
    "$CKPTFS" "$@" "$back" "$mnt" 2>"$TMP/daemon.err" || return 1
    for _ in $(seq 200); do
        mountpoint -q "$mnt" && return 0
        sleep 0.05
    done
    return 1
}

# daemon_pid FILE: the pid in the "mounted ... pid N" line of FILE.
daemon_pid() {
    grep -o 'mounted .* pid [0-9]*' "$1" 2>/dev/null | tail -n1 | sed 's/.* pid //'
}

# has NAME FILE ERE: a line of FILE matches.
has() {
    if grep -qE -- "$3" "$2"; then pass "$1"; else fail "$1" "no line matches /$3/" "$(tail -n 5 "$2")"; fi
}

BACK=$TMP/back
MNT=$TMP/mnt
# A small encrypted pack.
mkdir -p src/small "$BACK"
head -c 20000 /dev/urandom >src/small/hello.bin
echo "content-marker-$RANDOM$RANDOM" >src/small/notes.txt
MARKER=$(cat src/small/notes.txt)
"$CKPT" pack src/small -o "$BACK/small.tpack" --key-file "$TMP/key" >/dev/null ||
    { fail "a test pack can be made"; finish; }

# ------------------------------------------------------ -f: stderr, levels

LOG=$TMP/fg.log
if mount_ckptfs "$BACK" "$MNT" "$LOG" -o key_file="$TMP/key"; then
    pass "-f mounts"
    has "-f: an info line on stderr says it mounted, and where" "$LOG" \
        "^ckptfs: mounted $TMP/back on $TMP/mnt \(writable; key file;"
    mkdir mnt/bad.tpack 2>/dev/null
    has "-f: a refused request is logged as a warning" "$LOG" \
        "^ckptfs: warning: mkdir 'bad\.tpack': a directory above checkpoints"
    kill -HUP "${DAEMON_OF[$MNT]}"
    sleep 0.3
    if ! gone "${DAEMON_OF[$MNT]}" && ls mnt/small >/dev/null; then
        pass "-f: SIGHUP leaves the daemon serving"
    else
        fail "-f: SIGHUP leaves the daemon serving"
    fi
    has "-f: and says there is nothing to reopen" "$LOG" "SIGHUP: logging to stderr, nothing to reopen"
    unmount_ckptfs "$MNT" && pass "-f: exits 0 at unmount" || fail "-f: exits 0 at unmount"
    has "-f: the unmount is logged" "$LOG" "^ckptfs: $TMP/mnt was unmounted"
else
    fail "-f mounts" "$(cat "$LOG")"
fi

# Under systemd, stderr is the journal: priorities as "<N>" prefixes.
LOG=$TMP/journal.log
: >"$LOG"
if JOURNAL_STREAM=$(stat -c %d:%i "$LOG") mount_ckptfs "$BACK" "$MNT" "$LOG" -o key_file="$TMP/key"; then
    mkdir mnt/bad.tpack 2>/dev/null
    unmount_ckptfs "$MNT"
    has "journal: info lines carry <6>" "$LOG" "^<6>mounted $TMP/back on $TMP/mnt"
    has "journal: warnings carry <4>" "$LOG" "^<4>mkdir 'bad\.tpack': a directory above checkpoints"
else
    fail "mount with stderr as the journal" "$(cat "$LOG")"
fi

# -------------------------------------------------------- -o debug tracing

LOG=$TMP/debug.log
if mount_ckptfs "$BACK" "$MNT" "$LOG" -o key_file="$TMP/key",commit_delay=0 -o debug; then
    pass "-o debug mounts"
    # One reader whose requests are known exactly: no readahead, one page
    # at 8192, from a process whose pid the trace must show.
    out=$($PY - "$TMP/mnt/small/hello.bin" <<'EOF'
import os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
data = os.pread(fd, 4096, 8192)
print(os.getpid(), os.fstat(fd).st_ino, len(data))
EOF
    )
    read -r rpid ino got <<<"$out"
    dir_ino=$(stat -c %i mnt/small)
    stat mnt/no-such-thing >/dev/null 2>&1
    cat mnt/small/notes.txt >/dev/null
    mkdir mnt/w && head -c 5000 /dev/zero | tr '\0' 'Q' >mnt/w/out.txt
    sleep 0.2
    [ "$got" = 4096 ] && pass "debug: the traced read returns its page" || fail "debug: the traced read returns its page" "$out"
    has "debug: the lookup of a named file is traced with its parent, name and pid" "$LOG" \
        "^ckptfs: debug: #[0-9]+ lookup ino=$dir_ino name='hello.bin' pid=$rpid$"
    id=$(grep -E "lookup ino=$dir_ino name='hello.bin' pid=$rpid$" "$LOG" | head -n1 | sed -E 's/.*#([0-9]+) .*/\1/')
    has "debug: and its outcome, the inode found" "$LOG" "^ckptfs: debug: #$id lookup -> ino=$ino \([0-9]+ us\)$"
    has "debug: the read is traced with its offset and size" "$LOG" \
        "^ckptfs: debug: #[0-9]+ read ino=$ino off=8192 size=4096 pid=$rpid$"
    id=$(grep -E "read ino=$ino off=8192 size=4096 pid=$rpid$" "$LOG" | head -n1 | sed -E 's/.*#([0-9]+) .*/\1/')
    has "debug: and its outcome in bytes" "$LOG" "^ckptfs: debug: #$id read -> 4096 bytes \("
    has "debug: an open is traced with its flags" "$LOG" "open ino=$ino flags=O_RDONLY"
    has "debug: a failed lookup is traced with its errno" "$LOG" \
        "#[0-9]+ lookup -> ENOENT \(No such file or directory\)"
    has "debug: a write is traced with offset and size" "$LOG" "write ino=[0-9]+ off=0 size=5000 pid="
    has "debug: and its outcome, the bytes written" "$LOG" "write -> 5000 bytes written"
    if grep -q -- "$MARKER" "$LOG" || grep -q QQQQQQQQ "$LOG"; then
        fail "debug: no file contents in the trace" "$(grep -e "$MARKER" -e QQQQ "$LOG" | head -n 2)"
    else
        pass "debug: no file contents in the trace"
    fi
    unmount_ckptfs "$MNT" && pass "debug: exits 0 at unmount" || fail "debug: exits 0 at unmount"
else
    fail "-o debug mounts" "$(cat "$LOG")"
fi
LOG=$TMP/nodebug.log
if mount_ckptfs "$BACK" "$MNT" "$LOG" -o key_file="$TMP/key"; then
    cat mnt/small/notes.txt >/dev/null
    unmount_ckptfs "$MNT"
    if grep -q "debug:" "$LOG"; then fail "without -o debug nothing is traced" "$(grep -m2 debug: "$LOG")"
    else pass "without -o debug nothing is traced"; fi
fi

# ------------------------------------------------ -o log_file and SIGHUP

expect_exit "log_file in a missing directory fails before mounting" 1 \
    "$CKPTFS" -o log_file="$TMP/no/such/dir/x.log" "$BACK" "$MNT"
last_stderr_has "naming the path" "$TMP/no/such/dir/x.log"
expect_exit "an empty log_file is a usage error" 2 "$CKPTFS" -o log_file= "$BACK" "$MNT"
mountpoint -q mnt && fail "nothing was mounted by the failures" || pass "nothing was mounted by the failures"

mkdir -p logs
# Relative on purpose: the daemon's working directory is "/".
if mount_daemon "$BACK" "$MNT" -o key_file="$TMP/key" -o log_file=logs/ckptfs.log; then
    pass "daemon with log_file mounts"
    pid=$(daemon_pid logs/ckptfs.log)
    [ -n "$pid" ] && DAEMON_OF[$MNT]=$pid
    has "log_file: lines carry time, pid and level" logs/ckptfs.log \
        "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]+[-+][0-9]{4} ckptfs\[$pid\]: mounted "
    [ "$(stat -c %a logs/ckptfs.log)" = 600 ] && pass "log_file: created mode 0600" ||
        fail "log_file: created mode 0600" "$(stat -c %a logs/ckptfs.log)"
    [ ! -s "$TMP/daemon.err" ] && pass "log_file: nothing on stderr" || fail "log_file: nothing on stderr" "$(cat "$TMP/daemon.err")"
    mv logs/ckptfs.log logs/ckptfs.log.1
    kill -HUP "$pid"
    for _ in $(seq 100); do grep -qs "reopened" logs/ckptfs.log && break; sleep 0.05; done
    has "SIGHUP: a fresh file at the path says it was reopened" logs/ckptfs.log "log file reopened \(SIGHUP\)"
    has "SIGHUP: the old file says so too" logs/ckptfs.log.1 "SIGHUP: reopening log file $TMP/logs/ckptfs.log"
    mkdir mnt/after-hup.tpack 2>/dev/null
    has "SIGHUP: new lines go to the new file" logs/ckptfs.log "warning: mkdir 'after-hup\.tpack'"
    if grep -q "after-hup" logs/ckptfs.log.1; then fail "SIGHUP: and not to the old one"; else pass "SIGHUP: and not to the old one"; fi
    if ! gone "$pid" && cmp -s mnt/small/notes.txt src/small/notes.txt; then
        pass "SIGHUP: the daemon keeps serving"
    else
        fail "SIGHUP: the daemon keeps serving"
    fi
    fusermount3 -u mnt
    wait_gone "$pid" 10 && pass "log_file: the daemon exits at unmount" || fail "log_file: the daemon exits at unmount"
    unset "DAEMON_OF[$MNT]"
    has "log_file: its last line says it stopped" logs/ckptfs.log "ckptfs\[$pid\]: stopped$"
else
    fail "daemon with log_file mounts" "$(cat "$TMP/daemon.err")"
fi

# ------------------------------------------------------- daemon: syslog

if [ -e /dev/log ]; then
    skip "daemon mode logs to syslog" "a syslog daemon owns /dev/log here; not intercepting it"
else
    $PY - /dev/log "$TMP/syslog.txt" <<'EOF' &
import os, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
os.chmod(sys.argv[1], 0o666)
with open(sys.argv[2], "ab", buffering=0) as out:
    while True:
        out.write(s.recv(65536).rstrip(b"\n") + b"\n")
EOF
    LISTENER=$!
    for _ in $(seq 100); do [ -S /dev/log ] && break; sleep 0.05; done
    if mount_daemon "$BACK" "$MNT" -o key_file="$TMP/key"; then
        pid=$(daemon_pid "$TMP/syslog.txt")
        [ -n "$pid" ] && DAEMON_OF[$MNT]=$pid
        # <30>: facility daemon (3 << 3), priority info (6).
        has "daemon: the mount is logged to syslog at daemon.info" "$TMP/syslog.txt" \
            "^<30>.* ckptfs\[$pid\]: mounted $TMP/back on $TMP/mnt"
        # Said before daemonizing: the checkpoint -o debug's part wrote.
        has "daemon: what recovery says before daemonizing reaches syslog too" "$TMP/syslog.txt" \
            "^<30>.* ckptfs\[[0-9]+\]: checkpoint 'w' recovered: writing"
        mkdir mnt/bad.tpack 2>/dev/null
        for _ in $(seq 40); do grep -q "mkdir 'bad.tpack'" "$TMP/syslog.txt" && break; sleep 0.05; done
        has "daemon: a warning is logged at daemon.warning" "$TMP/syslog.txt" \
            "^<28>.* ckptfs\[$pid\]: mkdir 'bad\.tpack': a directory above checkpoints"
        kill -HUP "$pid"
        sleep 0.3
        if ! gone "$pid" && ls mnt/small >/dev/null; then pass "daemon: SIGHUP is harmless with syslog"
        else fail "daemon: SIGHUP is harmless with syslog"; fi
        [ ! -s "$TMP/daemon.err" ] && pass "daemon: nothing on the terminal" || fail "daemon: nothing on the terminal" "$(cat "$TMP/daemon.err")"
        kill -TERM "$pid"
        wait_gone "$pid" 10 && pass "daemon: SIGTERM ends it" || fail "daemon: SIGTERM ends it"
        unset "DAEMON_OF[$MNT]"
        mountpoint -q mnt && fail "daemon: and unmounts" || pass "daemon: and unmounts"
        has "daemon: the signal is logged" "$TMP/syslog.txt" "ckptfs\[$pid\]: SIGTERM: unmounting $TMP/mnt"
    else
        fail "daemon mode mounts" "$(cat "$TMP/daemon.err")"
    fi
    stop_listener
fi

# -------------------------------------------------- SIGTERM while packing

# A checkpoint that takes a few seconds to pack here: a generated model and
# incompressible optimizer state.
"$CKPT_GEN" src/big --preset gpt2 --layers 2 >/dev/null || fail "ckpt-gen makes a checkpoint"
head -c 120000000 /dev/urandom >src/big/optimizer.bin
LOG=$TMP/term.log
mkdir -p back2
if mount_ckptfs "$TMP/back2" "$MNT" "$LOG" -o key_file="$TMP/key",commit_delay=0; then
    pid=${DAEMON_OF[$MNT]}
    mkdir mnt/big && cp src/big/* mnt/big/ && "$CKPT" commit mnt/big >/dev/null
    done_bytes=0
    for _ in $(seq 200); do
        read -r done_bytes _ _ < <(getfattr --only-values -n user.ckptfs.progress mnt/big 2>/dev/null)
        [ "${done_bytes:-0}" -gt 0 ] && break
        sleep 0.05
    done
    state=$(state_of mnt/big)
    if [ "$state" = packing ] && [ "${done_bytes:-0}" -gt 0 ]; then
        pass "SIGTERM: sent while the checkpoint is packing ($done_bytes bytes in)"
    else
        fail "SIGTERM: sent while the checkpoint is packing" "state $state, $done_bytes bytes done"
    fi
    t0=$(date +%s%N)
    kill -TERM "$pid"
    if wait_gone "$pid" 10; then
        ms=$((($(date +%s%N) - t0) / 1000000))
        [ $ms -lt 5000 ] && pass "SIGTERM: the daemon exits within seconds (${ms} ms)" ||
            fail "SIGTERM: the daemon exits within seconds" "${ms} ms"
    else
        fail "SIGTERM: the daemon exits within seconds" "still running after 10 s"
    fi
    wait "$pid"
    rc=$?
    unset "DAEMON_OF[$MNT]"
    [ $rc -eq 0 ] && pass "SIGTERM: exit status 0" || fail "SIGTERM: exit status 0" "status $rc"
    mountpoint -q mnt && fail "SIGTERM: the mount point is unmounted" || pass "SIGTERM: the mount point is unmounted"
    expect_absent "SIGTERM: no temporary pack is left" back2/.big.tpack.tmp
    expect_absent "SIGTERM: no half-written pack is visible" back2/big.tpack
    has "SIGTERM: the log says which checkpoint was suspended" "$LOG" \
        "^ckptfs: checkpoint 'big' suspended: packing stopped at [0-9.]+ of [0-9.]+ MB"
    has "SIGTERM: and that it stopped" "$LOG" "^ckptfs: stopped$"

    if mount_ckptfs "$TMP/back2" "$MNT" "$LOG" -o key_file="$TMP/key",commit_delay=0; then
        has "remount: the checkpoint is recovered as packing" "$LOG" "checkpoint 'big' recovered: packing"
        wait_state "remount: packing resumes and commits" mnt/big committed 60
        [ -f back2/big.tpack ] && pass "remount: BACKING/big.tpack is in place" || fail "remount: BACKING/big.tpack is in place"
        bad=
        for f in src/big/*; do
            expect_same_sha256 "remount: $(basename "$f") reads back byte-identical" "$f" "mnt/big/$(basename "$f")"
        done
        "$CKPT" verify back2/big.tpack --key-file "$TMP/key" >/dev/null 2>&1 &&
            pass "remount: the pack verifies" || fail "remount: the pack verifies"
        unmount_ckptfs "$MNT"
    else
        fail "remount after SIGTERM" "$(tail -n 5 "$LOG")"
    fi
else
    fail "mount for the SIGTERM test" "$(cat "$LOG")"
fi

# -o finish_on_exit: the same SIGTERM waits for the pack instead.
LOG=$TMP/finish.log
mkdir -p back3
if mount_ckptfs "$TMP/back3" "$MNT" "$LOG" -o key_file="$TMP/key",commit_delay=0,finish_on_exit; then
    pid=${DAEMON_OF[$MNT]}
    mkdir mnt/big && cp src/big/* mnt/big/ && "$CKPT" commit mnt/big >/dev/null
    for _ in $(seq 200); do
        read -r done_bytes _ _ < <(getfattr --only-values -n user.ckptfs.progress mnt/big 2>/dev/null)
        [ "${done_bytes:-0}" -gt 0 ] && break
        sleep 0.05
    done
    kill -TERM "$pid"
    wait_gone "$pid" 60 || fail "finish_on_exit: the daemon exits once the pack is done" "still running after 60 s"
    wait "$pid"
    rc=$?
    unset "DAEMON_OF[$MNT]"
    [ $rc -eq 0 ] && pass "finish_on_exit: SIGTERM while packing exits 0" || fail "finish_on_exit: SIGTERM while packing exits 0" "status $rc"
    mountpoint -q mnt && fail "finish_on_exit: the mount point is unmounted at once" || pass "finish_on_exit: the mount point is unmounted at once"
    has "finish_on_exit: the log says the pack is finished first" "$LOG" "finishing the pack under way before exiting"
    has "finish_on_exit: and that the checkpoint was committed" "$LOG" "checkpoint 'big' committed:"
    if grep -q "suspended" "$LOG"; then fail "finish_on_exit: nothing suspended" "$(grep suspended "$LOG")"; else pass "finish_on_exit: nothing suspended"; fi
    "$CKPT" verify back3/big.tpack --key-file "$TMP/key" >/dev/null 2>&1 &&
        pass "finish_on_exit: the pack is complete and verifies" || fail "finish_on_exit: the pack is complete and verifies"
    expect_absent "finish_on_exit: no temporary pack is left" back3/.big.tpack.tmp
    [ -z "$(ls back3/.ckptfs/stage 2>/dev/null)" ] && pass "finish_on_exit: its staging is gone" ||
        fail "finish_on_exit: its staging is gone" "$(ls back3/.ckptfs/stage)"
else
    fail "mount with finish_on_exit" "$(cat "$LOG")"
fi

# ------------------------------------------------------ no key material

logs=("$TMP"/*.log "$TMP"/logs/* "$TMP"/syslog.txt)
leaks=()
for f in "${logs[@]}"; do
    [ -f "$f" ] || continue
    if grep -qiF -e "$KEY_HEX" -e "${KEY_HEX:0:16}" -e "$KEY_B64" "$f" ||
        $PY -c 'import sys; sys.exit(open(sys.argv[2], "rb").read()[:32] not in open(sys.argv[1], "rb").read())' "$f" "$TMP/key"; then
        leaks+=("$(basename "$f")")
    fi
done
checked=$(for f in "${logs[@]}"; do [ -f "$f" ] && echo x; done | wc -l)
if [ ${#leaks[@]} -eq 0 ] && [ "$checked" -ge 5 ]; then
    pass "no key bytes (hex, base64 or raw) in any of $checked logs"
else
    fail "no key bytes (hex, base64 or raw) in any log" "leaks in: ${leaks[*]:-none}; $checked logs checked"
fi
finish
