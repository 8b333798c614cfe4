#!/usr/bin/env bash
# A writable mount on S3 whose gateway stops answering while a pack is being
# uploaded (radosgw killed mid-upload, restarted later), against a real Ceph
# RADOS Gateway, with boto3 (s3_client.py) checking the bucket:
#   - the checkpoint turns failed, saying why (ckpt status, user.ckptfs.error),
#     and its staged files stay readable, byte-identical
#   - no partial object is visible, and once the gateway is back no multipart
#     upload is left (the abort the outage refused is sent again)
#   - it is packed again on its own once the gateway answers: byte-identical,
#     nothing left over
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/mount_lib.sh"

. "$(dirname "$0")/gateway_lib.sh"
gateway_prerequisites
trap 'unmount_all; stop_gateway; cleanup_tmp' EXIT
start_gateway ckpt-out
export XDG_CACHE_HOME=$TMP/xdg

cd "$TMP" || exit 1
"$CKPT_GEN" big --preset gpt2 >/dev/null
LOG=$TMP/ckptfs.log
sha_tree() { (cd "$1" && find . -type f -printf '%P\n' | LC_ALL=C sort | while IFS= read -r f; do printf '%s %s\n' "$f" "$(sha256sum <"$2/$f" | cut -d' ' -f1)"; done); }
expect_same_files() {
    local d
    if d=$(diff <(sha_tree "$2" "$PWD/$2") <(sha_tree "$2" "$PWD/$3")); then pass "$1 ($(find "$2" -type f | wc -l) files)"; else fail "$1" "$(printf '%s\n' "$d" | head -n 6)"; fi
}
# Polled with curl (boto3 starts too slowly).
upload_started() {
    curl -s --aws-sigv4 "aws:amz:us-east-1:s3" --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" \
        -H "x-amz-content-sha256: UNSIGNED-PAYLOAD" "$S3_ENDPOINT/$BK?prefix=w%2F&uploads=" |
        grep -q "<Upload>"
}
state_of() { getfattr -n user.ckptfs.state --only-values "$1" 2>&1; }

# One packing thread makes the upload last long enough to be caught.
mount_ckptfs s3://$BK/w mnt-w "$LOG" -o commit_delay=0,threads=1,list_interval=1,stage_dir="$TMP/stage" ||
    { fail "writable mount" "$(tail -n 3 "$LOG")"; finish; }
cp -r big mnt-w/out
"$CKPT" commit mnt-w/out >/dev/null 2>&1
for _ in $(seq 400); do upload_started && break; sleep 0.02; done
if ! upload_started; then
    fail "the upload started" "no upload seen"
    finish
fi
kill -9 "$(rgw_pid)"
pass "the gateway is killed in the middle of the upload"
t0=$(date +%s.%N)
for _ in $(seq 600); do [ "$(state_of mnt-w/out)" = failed ] && break; sleep 0.1; done
secs=$($PY -c "import time; print(round(time.time() - $t0, 1))")
state=$(state_of mnt-w/out)
[ "$state" = failed ] && pass "the checkpoint turns failed (${secs} s)" || fail "the checkpoint turns failed" "$state after ${secs} s"
err=$(getfattr -n user.ckptfs.error --only-values mnt-w/out 2>&1)
grep -qF "s3://$BK/w/out.tpack" <<<"$err" && grep -qiE "no answer|connect" <<<"$err" &&
    pass "  user.ckptfs.error names the object and the outage" || fail "  user.ckptfs.error names the object and the outage" "$err"
"$CKPT" status mnt-w >status.out 2>&1
rc=$?
[ $rc -eq 3 ] && grep -q "out .*failed" status.out && pass "  ckpt status says failed (exit 3)" || fail "  ckpt status says failed (exit 3)" "rc $rc: $(head -c 400 status.out)"
expect_same_files "  its staged files still read byte-identical" big mnt-w/out
restart_rgw
for _ in $(seq 100); do curl -s -o /dev/null "$S3_ENDPOINT/" && break; sleep 0.2; done
pass "the gateway is back"
s3py keys $BK w/ | grep -qx "w/out.tpack" && fail "  no partial pack is visible" "w/out.tpack exists" || pass "  no partial pack is visible"
# The mount probes the gateway at most every 2 s; whatever it does to clean
# up, it has done it within 10 s.
for _ in $(seq 50); do
    s3py uploads $BK w/ >ups.out
    [ -s ups.out ] || break
    sleep 0.2
done
[ ! -s ups.out ] && pass "  no multipart upload is left once the gateway is back" || fail "  no multipart upload is left once the gateway is back" "$(cat ups.out)"
grep -qF "checkpoint 'out': packed again in 2 s" "$LOG" && pass "  the log says it is packed again" || fail "  the log says it is packed again" "$(grep "'out'" "$LOG" | tail -n 3)"
# Tried again every 2, 4, 8, ... s (at most 30) while the gateway is down,
# each try refused at once: packed with no command once it is back.
t0=$(date +%s.%N)
for _ in $(seq 450); do [ "$(state_of mnt-w/out)" = committed ] && break; sleep 0.1; done
secs=$($PY -c "import time; print(round(time.time() - $t0, 1))")
state=$(state_of mnt-w/out)
[ "$state" = committed ] && pass "  packed again and committed with no command (${secs} s after the gateway came back)" || fail "  packed again and committed with no command" "$state after ${secs} s"
s3py keys $BK w/ | grep -qx "w/out.tpack" && pass "  boto3 sees w/out.tpack" || fail "  boto3 sees w/out.tpack" "$(s3py keys $BK w/)"
s3py uploads $BK w/ >ups.out
[ ! -s ups.out ] && pass "  no multipart upload is left" || fail "  no multipart upload is left" "$(cat ups.out)"
expect_same_files "  and it reads byte-identical" big mnt-w/out
unmount_ckptfs mnt-w
mount_ckptfs s3://$BK/w mnt-w "$LOG" -o ro || fail "read-only remount" "$(tail -n 3 "$LOG")"
expect_same_files "  and so after a remount (from the object)" big mnt-w/out
unmount_ckptfs mnt-w
grep -E "out.*(packing failed|upload)" "$LOG" | head -n 5
finish
