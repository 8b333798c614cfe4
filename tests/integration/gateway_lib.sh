# A real Ceph RADOS Gateway for one test (../shared/services/ceph-rgw.sh
# starts one on loopback in $TMP/rgw; stop_gateway, which the caller's EXIT
# trap calls, ends it), with boto3 (tests/integration/s3_client.py, in the
# venv scripts/venv.sh makes) as the independent client that checks what
# landed in the store. Sourced after lib.sh.

RGW_SH=$("$ROOT/scripts/shared-dir.sh")/services/ceph-rgw.sh
RGW=$TMP/rgw

# Skips the test where the gateway cannot run at all; fails it where the
# script is missing.
gateway_prerequisites() {
    [ "$(id -u)" -eq 0 ] || skip_all "needs root to run the Ceph daemons of the gateway"
    [ -f /etc/debian_version ] || skip_all "needs Debian's ceph packages"
    [ -f "$RGW_SH" ] || { fail "gateway script present" "$RGW_SH is missing"; finish; }
}

# Free loopback ports, so several runs (and other gateways) can coexist.
free_port() {
    local p
    for p in $(shuf -i 20000-29999 -n 50); do
        ss -Hltn "sport = :$p" 2>/dev/null | grep -q . || { echo "$p"; return; }
    done
    echo 17480
}
RGW_PORT=$(free_port)
MON_PORT=$(free_port)
stop_gateway() { RGW_PORT=$RGW_PORT MON_PORT=$MON_PORT bash "$RGW_SH" stop "$RGW" >/dev/null 2>&1; }
rgw_pid() { cat "$RGW/run/client.rgw.a.pid" 2>/dev/null; }
restart_rgw() { radosgw -c "$RGW/ceph.conf" -n client.rgw.a 2>>"$RGW/log/rgw-stderr.log"; }
s3py() { "$PYS3" "$ROOT/tests/integration/s3_client.py" "$@"; }

# Starts the gateway, points the AWS variables at it (S3_ENDPOINT and the
# keys come from its env file), makes the boto3 venv and the bucket $1 (BK).
start_gateway() {
    local t0
    t0=$(date +%s)
    if ! RGW_PORT=$RGW_PORT MON_PORT=$MON_PORT bash "$RGW_SH" start "$RGW" >"$TMP/rgw-start.log" 2>&1; then
        fail "gateway starts" "$(tail -n 5 "$TMP/rgw-start.log")"
        finish
    fi
    pass "gateway starts on 127.0.0.1:$RGW_PORT ($(($(date +%s) - t0)) s)"
    # shellcheck disable=SC1091
    . "$RGW/env"
    export AWS_ENDPOINT_URL=$S3_ENDPOINT
    unset AWS_PROFILE AWS_ENDPOINT_URL_S3 AWS_REGION AWS_SESSION_TOKEN
    if ! PYS3=$(B=$B "$ROOT/scripts/venv.sh" s3 2>"$TMP/venv.log"); then
        fail "boto3 venv" "$(tail -n 5 "$TMP/venv.log")"
        finish
    fi
    case $PYS3 in /*) ;; *) PYS3=$ROOT/$PYS3 ;; esac
    BK=$1
    s3py mkbucket "$BK" 2>"$TMP/mk.err" && pass "boto3 creates the bucket" ||
        { fail "boto3 creates the bucket" "$(tail -n 3 "$TMP/mk.err")"; finish; }
}
