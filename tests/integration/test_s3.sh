#!/usr/bin/env bash
# Packs on S3, against a real Ceph RADOS Gateway (../shared/services/ceph-rgw.sh
# starts one on loopback in a scratch directory; it is stopped on exit), with
# boto3 (tests/integration/s3_client.py, build/venv-s3) as the independent
# client that checks what landed in the store:
#   - ckpt pack -o s3://... plain (one PUT and multipart) and encrypted; the
#     objects have the right size and no multipart upload is left
#   - ls/info/cat/verify/unpack from s3:// are byte-identical to the source
#   - wrong credentials and a missing bucket fail with clear messages that
#     carry no secret; credentials from ~/.aws files with --profile
#   - an encrypted pack's object holds no tensor name and no plaintext
#   - the gateway killed in the middle of a cat and restarted: the read
#     completes after retries or fails cleanly within the bound
#   - ckpt pack SIGKILLed in the middle of a multipart upload: no object,
#     and ckpt s3-cleanup leaves no upload behind; SIGINTed, it aborts its
#     own upload and leaves another writer's upload of the same name
#   - the s3_live suite of tests/unit/test_s3.c (lock, -ESTALE, rename, ...)
# Needs root (the gateway's daemons) and Debian's ceph packages, which the
# script installs on first use; when that fails, the test fails.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/gateway_lib.sh"

if [ ! -x "$CKPT" ] || [ ! -x "$CKPT_GEN" ]; then
    fail "binaries built" "$CKPT or $CKPT_GEN is missing; run make first"
    finish
fi
gateway_prerequisites

trap 'stop_gateway; cleanup_tmp' EXIT
start_gateway ckpt-test
REAL_SECRET=$AWS_SECRET_ACCESS_KEY

cd "$TMP" || exit 1
"$CKPT_GEN" tiny >/dev/null
"$CKPT_GEN" big --preset gpt2 >/dev/null
"$CKPT" keygen -o key >/dev/null

# Stored size from `ckpt info` ("... stored in X (N bytes)").
stored_bytes() { "$CKPT" info "$@" | sed -nE 's/^size:.*stored in .*\(([0-9]+) bytes\)$/\1/p'; }

# ------------------------------------------------------------ round trips
for case in "tiny:tiny" "big:big"; do
    name=${case%%:*}
    src=${case#*:}
    url=s3://$BK/p/$name.tpack
    expect_ok "pack $name to $url" "$CKPT" pack "$src" -o "$url"
    size=$(s3py size $BK "p/$name.tpack")
    want=$(stored_bytes "$url")
    if [ -n "$want" ] && [ "$size" = "$want" ]; then pass "boto3 sees p/$name.tpack, $size bytes"; else fail "boto3 sees p/$name.tpack" "boto3: $size, ckpt info: $want"; fi
    ups=$(s3py uploads $BK p/)
    if [ -z "$ups" ]; then pass "no multipart upload left after packing $name"; else fail "no multipart upload left after packing $name" "$ups"; fi
    "$CKPT" pack "$src" -o "$name-local.tpack" >/dev/null
    run_cmd "$CKPT" ls "$url"
    cp "$LAST_OUT" ls-s3.txt
    "$CKPT" ls "$name-local.tpack" >ls-local.txt
    expect_same_sha256 "ls of $name from S3 = ls of the local pack" ls-s3.txt ls-local.txt
    expect_ok "verify $name from S3" "$CKPT" verify "$url"
    last_stdout_has "verify $name says OK" "OK:"
    "$CKPT" cat "$url" model.safetensors >"cat-$name.bin"
    expect_same_sha256 "cat of $name from S3 is byte-identical" "cat-$name.bin" "$src/model.safetensors"
    expect_ok "unpack $name from S3" "$CKPT" unpack "$url" -o "out-$name"
    expect_same_tree "unpack of $name from S3 = the source" "$src" "out-$name"
done
expect_stderr_contains "pack onto an existing object needs --force" "already exists" \
    "$CKPT" pack tiny -o s3://$BK/p/tiny.tpack
expect_ok "pack --force replaces it" "$CKPT" pack tiny -o s3://$BK/p/tiny.tpack --force
run_cmd "$CKPT" ls --tensors s3://$BK/p/big.tpack
last_stdout_has "ls --tensors from S3" "h.0.attn.c_attn.weight"

# The endpoint as an option instead of the environment.
expect_ok "--endpoint instead of AWS_ENDPOINT_URL" \
    env -u AWS_ENDPOINT_URL "$CKPT" verify --endpoint "$S3_ENDPOINT" s3://$BK/p/tiny.tpack

# Credentials from ~/.aws, chosen with --profile.
mkdir -p home/.aws
printf '[default]\naws_access_key_id = nobody\naws_secret_access_key = nothing\n[gw]\naws_access_key_id = %s\naws_secret_access_key = %s\n' \
    "$AWS_ACCESS_KEY_ID" "$AWS_SECRET_ACCESS_KEY" >home/.aws/credentials
chmod 600 home/.aws/credentials
expect_ok "credentials from ~/.aws/credentials with --profile" \
    env -u AWS_ACCESS_KEY_ID -u AWS_SECRET_ACCESS_KEY HOME="$TMP/home" \
    "$CKPT" verify --profile gw s3://$BK/p/tiny.tpack
expect_ok "... and with AWS_PROFILE" \
    env -u AWS_ACCESS_KEY_ID -u AWS_SECRET_ACCESS_KEY HOME="$TMP/home" AWS_PROFILE=gw \
    "$CKPT" ls s3://$BK/p/tiny.tpack

# -------------------------------------------------- failures, with no secret
WRONG=wrongSecretValue0123456789
run_cmd env AWS_SECRET_ACCESS_KEY=$WRONG "$CKPT" ls s3://$BK/p/tiny.tpack
if [ "$LAST_RC" -eq 1 ]; then pass "a wrong secret key fails (exit 1)"; else fail "a wrong secret key fails (exit 1)" "exit $LAST_RC"; fi
last_stderr_has "a wrong secret key says so" "SignatureDoesNotMatch" "the secret key from the environment (AWS_ACCESS_KEY_ID) does not match" "s3://$BK/p"
if grep -qF -e "$WRONG" -e "$REAL_SECRET" "$LAST_ERR"; then fail "no secret in the message" "$(cat "$LAST_ERR")"; else pass "no secret in the message"; fi
run_cmd env AWS_ACCESS_KEY_ID=NOSUCHKEY0000 "$CKPT" verify s3://$BK/p/tiny.tpack
if [ "$LAST_RC" -eq 1 ]; then pass "an unknown access key fails (exit 1)"; else fail "an unknown access key fails (exit 1)" "exit $LAST_RC"; fi
last_stderr_has "an unknown access key says so" "InvalidAccessKeyId" "does not know the access key"
if grep -qF -e "$REAL_SECRET" "$LAST_ERR"; then fail "no secret in that message either"; else pass "no secret in that message either"; fi
run_cmd "$CKPT" ls s3://no-such-bucket-$$/p/x.tpack
if [ "$LAST_RC" -eq 1 ]; then pass "a missing bucket fails (exit 1)"; else fail "a missing bucket fails (exit 1)" "exit $LAST_RC"; fi
last_stderr_has "a missing bucket says so" "s3://no-such-bucket-$$/p: open failed: no such bucket (HTTP 404 NoSuchBucket)"
run_cmd "$CKPT" cat s3://$BK/p/none.tpack x
last_stderr_has "a missing pack says so" "s3://$BK/p/none.tpack: open failed: no such object (HTTP 404"
run_cmd env -u AWS_ACCESS_KEY_ID -u AWS_SECRET_ACCESS_KEY HOME="$TMP/nohome" "$CKPT" ls s3://$BK/p/tiny.tpack
last_stderr_has "no credentials at all says where to put them" "no S3 credentials" "AWS_ACCESS_KEY_ID"
expect_exit "s3-cleanup without a URL is a usage error" 2 "$CKPT" s3-cleanup

# ------------------------------------------------ https with a private CA
# A TLS front (tls_relay.py) with a self-signed certificate before the
# gateway, as a site's own CA would sign: refused without AWS_CA_BUNDLE,
# saying to set it (there was no way to trust it but the system's store),
# read with it.
if command -v openssl >/dev/null; then
    TLS_PORT=$(free_port)
    openssl req -x509 -newkey rsa:2048 -nodes -keyout tls.key -out tls.pem -days 1 \
        -subj /CN=127.0.0.1 -addext subjectAltName=IP:127.0.0.1 2>/dev/null
    $PY "$ROOT/tests/integration/tls_relay.py" "$TLS_PORT" tls.pem tls.key "$RGW_PORT" >tls.log 2>&1 &
    tls_pid=$!
    for _ in $(seq 50); do grep -q ready tls.log && break; sleep 0.1; done
    run_cmd env -u AWS_CA_BUNDLE "$CKPT" verify --endpoint "https://127.0.0.1:$TLS_PORT" s3://$BK/p/tiny.tpack
    last_stderr_has "https to a private CA's certificate without AWS_CA_BUNDLE says to set it" \
        "https://127.0.0.1:$TLS_PORT" "certificate" "set AWS_CA_BUNDLE"
    expect_ok "https to a private CA's certificate with AWS_CA_BUNDLE" \
        env AWS_CA_BUNDLE=tls.pem "$CKPT" verify --endpoint "https://127.0.0.1:$TLS_PORT" s3://$BK/p/tiny.tpack
    kill "$tls_pid" 2>/dev/null
    wait "$tls_pid" 2>/dev/null
else
    skip "https with a private CA" "no openssl command"
fi

# ------------------------------------------------ an encrypted pack's bytes
expect_ok "pack big encrypted to S3" "$CKPT" pack big -o s3://$BK/enc/big.tpack --key-file key
expect_ok "verify the encrypted pack from S3" "$CKPT" verify s3://$BK/enc/big.tpack --key-file key
"$CKPT" cat s3://$BK/enc/big.tpack model.safetensors --key-file key >cat-enc.bin
expect_same_sha256 "cat of the encrypted pack from S3 is byte-identical" cat-enc.bin big/model.safetensors
run_cmd "$CKPT" ls s3://$BK/enc/big.tpack
last_stderr_has "without the key: no key" "no key"
s3py get $BK enc/big.tpack enc-object.bin
s3py get $BK p/big.tpack plain-object.bin
# A known tensor name and a known 64-byte plaintext run from inside a tensor.
$PY - big/model.safetensors enc-object.bin plain-object.bin >scan.txt <<'EOF'
import sys
src, enc, plain = (open(p, 'rb').read() for p in sys.argv[1:4])
name = b"h.0.attn.c_attn.weight"
hdr = int.from_bytes(src[:8], 'little') + 8
needle = src[hdr + 1000003: hdr + 1000003 + 64]
print("plain-name", plain.find(name) >= 0)
print("enc-name", enc.find(name) >= 0)
print("enc-data", enc.find(needle) >= 0)
print("src-data", src.find(needle) >= 0)
EOF
grep -q "plain-name True" scan.txt && grep -q "src-data True" scan.txt && pass "control: the plain pack holds the tensor name" || fail "control: the plain pack holds the tensor name" "$(cat scan.txt)"
grep -q "enc-name False" scan.txt && pass "the encrypted object holds no tensor name" || fail "the encrypted object holds no tensor name"
grep -q "enc-data False" scan.txt && pass "the encrypted object holds no 64-byte plaintext run" || fail "the encrypted object holds no 64-byte plaintext run"
rm -f enc-object.bin plain-object.bin

# ------------------------------- the gateway killed in the middle of a read
rgw_pid() { cat "$RGW/run/client.rgw.a.pid" 2>/dev/null; }
restart_rgw() { radosgw -c "$RGW/ceph.conf" -n client.rgw.a 2>>"$RGW/log/rgw-stderr.log"; }
t0=$(date +%s.%N)
# Its output is taken only after 1 s, so that the cat is still running when
# the gateway dies at 0.3 s however fast it reads (a cold open costs two
# requests now, and a cat of 250 MB had finished by 0.3 s): its reads
# after that meet the dead gateway.
("$CKPT" cat --threads 1 s3://$BK/p/big.tpack model.safetensors 2>cat-kill.err |
    { sleep 1; cat >cat-kill.bin; }
 exit "${PIPESTATUS[0]}") &
cat_pid=$!
sleep 0.3
if kill -0 "$cat_pid" 2>/dev/null; then pass "the gateway is killed while cat runs"; else fail "the gateway is killed while cat runs" "cat had finished already"; fi
kill -9 "$(rgw_pid)"
sleep 2
restart_rgw
wait "$cat_pid"
cat_rc=$?
secs=$($PY -c "import time; print(round(time.time() - $t0, 1))")
if [ "$cat_rc" -eq 0 ] && cmp -s cat-kill.bin big/model.safetensors; then
    pass "cat completed after retries, byte-identical (${secs} s)"
elif [ "$cat_rc" -eq 1 ] && grep -q "attempts" cat-kill.err; then
    pass "cat failed cleanly after retries (${secs} s): $(head -c 200 cat-kill.err)"
else
    fail "cat completes or fails cleanly" "exit $cat_rc after ${secs} s" "$(head -c 300 cat-kill.err)"
fi
if $PY -c "import sys; sys.exit(0 if $secs < 40 else 1)"; then pass "within the retry bound (30 s + slack): ${secs} s"; else fail "within the retry bound" "${secs} s"; fi
for _ in $(seq 100); do curl -s -o /dev/null "$S3_ENDPOINT/" && break; sleep 0.2; done

# -------------------------------- ckpt pack killed in a multipart upload
# Polled with curl (boto3 starts too slowly to catch a pack of a few
# seconds); one thread and level 9 make the pack last long enough.
# upload_started PREFIX [N]: N (default 1) uploads under PREFIX/ or more.
upload_started() {
    local n
    n=$(curl -s --aws-sigv4 "aws:amz:us-east-1:s3" --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" \
        -H "x-amz-content-sha256: UNSIGNED-PAYLOAD" "$S3_ENDPOINT/$BK?prefix=$1%2F&uploads=" |
        grep -o "<Upload>" | wc -l)
    [ "$n" -ge "${2:-1}" ]
}
"$CKPT" pack big -o s3://$BK/crash/big.tpack --threads 1 --level 9 >/dev/null 2>&1 &
pack_pid=$!
for _ in $(seq 300); do
    upload_started crash && break
    sleep 0.05
done
kill -9 "$pack_pid" 2>/dev/null
wait "$pack_pid" 2>/dev/null
left=$(s3py uploads $BK crash/)
if [ -n "$left" ]; then pass "SIGKILL mid-upload leaves an unfinished upload"; else fail "SIGKILL mid-upload leaves an unfinished upload" "none seen: the kill came too late?"; fi
state=$(s3py size $BK crash/big.tpack)
if [ "$state" = absent ]; then pass "no object is visible after the kill"; else fail "no object is visible after the kill" "size $state"; fi
run_cmd "$CKPT" s3-cleanup s3://$BK/crash
last_stdout_has "s3-cleanup spares young uploads by default" "aborted 0"
expect_ok "s3-cleanup --older-than 0 aborts it" "$CKPT" s3-cleanup s3://$BK/crash --older-than 0
last_stdout_has "s3-cleanup counts it" "aborted 1 unfinished upload"
left=$(s3py uploads $BK "")
if [ -z "$left" ]; then pass "list_multipart_uploads is empty after s3-cleanup"; else fail "list_multipart_uploads is empty after s3-cleanup" "$left"; fi

# SIGINT is caught: the pack aborts its own upload.
"$CKPT" pack big -o s3://$BK/int/big.tpack --threads 1 --level 9 >/dev/null 2>int.err &
pack_pid=$!
for _ in $(seq 300); do
    upload_started int && break
    sleep 0.05
done
kill -INT "$pack_pid"
wait "$pack_pid"
int_rc=$?
if [ "$int_rc" -eq 130 ] && [ -z "$(s3py uploads $BK int/)" ] && [ "$(s3py size $BK int/big.tpack)" = absent ]; then
    pass "SIGINT mid-upload: exit 130, no object, no upload left"
else
    fail "SIGINT mid-upload: exit 130, no object, no upload left" "exit $int_rc" "$(s3py uploads $BK int/)" "$(cat int.err)"
fi

# Another writer (another host, say) is packing the same name: SIGINT
# aborts this pack's own upload, never the other's.
other=$(s3py start-upload $BK int2/big.tpack)
"$CKPT" pack big -o s3://$BK/int2/big.tpack --threads 1 --level 9 >/dev/null 2>int2.err &
pack_pid=$!
for _ in $(seq 300); do
    upload_started int2 2 && break
    sleep 0.05
done
kill -INT "$pack_pid"
wait "$pack_pid"
int_rc=$?
left=$(s3py uploads $BK int2/)
if [ "$int_rc" -eq 130 ] && [ "$left" = "int2/big.tpack $other" ] && grep -q interrupted int2.err; then
    pass "SIGINT mid-upload beside another writer's upload of the name: exit 130, only ours aborted"
else
    fail "SIGINT mid-upload beside another writer's upload of the name: exit 130, only ours aborted" \
        "exit $int_rc" "other: $other" "left: $left" "$(cat int2.err)"
fi
run_cmd "$CKPT" s3-cleanup s3://$BK/int2 --older-than 0

# ------------------------------------------- the store API on the gateway
if [ -x "$BUILD/tests/test_s3" ]; then
    expect_ok "s3_live unit suite (lock, -ESTALE, rename, remove, multipart)" \
        env CKPT_TEST_S3_URL=s3://$BK/live "$BUILD/tests/test_s3" --filter 's3_live/*'
else
    skip "s3_live unit suite" "$BUILD/tests/test_s3 not built (make unit)"
fi
# ckpt-cuda's load pipeline, on its fake device, from an s3:// pack.
if [ -x "$BUILD/tests/cuda/test_cuda_load" ]; then
    expect_ok "ckpt-cuda loads an s3:// pack (fake device), byte-identical" \
        env CKPT_TEST_S3_URL=s3://$BK/cuda "$BUILD/tests/cuda/test_cuda_load" --filter 'load/pack_from_s3'
    if [ "$(s3py size $BK cuda/cuda/fixture.tpack)" != absent ]; then
        pass "boto3: the ckpt-cuda fixture pack is on the gateway"
    else
        fail "boto3: the ckpt-cuda fixture pack is on the gateway" "absent"
    fi
else
    skip "ckpt-cuda from s3://" "$BUILD/tests/cuda/test_cuda_load not built (make cuda-check)"
fi
finish
