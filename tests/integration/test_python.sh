#!/usr/bin/env bash
# The ckptfs Python package (python/) against a real mount, installed three
# ways and run by two interpreters:
#   - `make install DESTDIR=... PREFIX=/usr` (dist-packages), run by Debian's
#     /usr/bin/python3 with its numpy and torch 1.13;
#   - `pip install ./python` into a fresh venv of Debian's python3
#     (--system-site-packages, so Debian's numpy and torch);
#   - `pip install --target` into the pinned venv of scripts/venv.sh
#     (torch 2.13, numpy 2), which has every dtype, float8 included.
# Each runs python_module.py: every dtype a manifest can hold, read with
# .numpy(), .torch() and load_state_dict, bit-identical to the sources;
# status and commit on the writable mount; clear errors for bad paths; and
# hand-written checkpoint directories (no mount) for what no pack gives.
# shellcheck source-path=SCRIPTDIR
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/write_lib.sh"

PYMOD=$ROOT/tests/integration/python_module.py
"$PY" -c 'import numpy' 2>/dev/null || skip_all "Debian's python3 has no numpy (apt-get install python3-numpy)"

# ------------------------------------------------------------ the packs

run_cmd "$PY" "$PYMOD" make-data "$TMP/src"
if [ "$LAST_RC" -ne 0 ]; then fail "sources written" "$(cat "$LAST_OUT" "$LAST_ERR")"; finish; fi
pass "sources written: safetensors (by hand) and .npy with every dtype"
mkdir -p "$BACK" "$TMP/back-key"
expect_ok "ckpt pack all" "$CKPT" pack "$TMP/src/all" -o "$BACK/all.tpack"
expect_ok "ckpt pack common" "$CKPT" pack "$TMP/src/common" -o "$BACK/common.tpack"
"$CKPT" keygen -o "$TMP/key" >/dev/null
expect_ok "ckpt pack with a key" "$CKPT" pack "$TMP/src/common" -o "$TMP/back-key/secret.tpack" --key-file "$TMP/key"
mount_ckptfs "$BACK" "$MNT" "$LOG" -o commit_delay=0 || { fail "mount" "$(cat "$LOG")"; finish; }
pass "mounted (writable, commit_delay=0)"
mount_ckptfs "$TMP/back-key" "$TMP/mnt-nokey" "$LOG" -o ro || { fail "mount without the key" "$(cat "$LOG")"; finish; }

# python_module.py CMD ARGS... with interpreter $1 and environment $2 (a
# PYTHONPATH or ""); each "ok" line becomes a PASS, a "FAIL" line a FAIL.
run_module() {
    local label=$1 py=$2 pypath=$3 line n=0
    shift 3
    (cd "$TMP" && env ${pypath:+PYTHONPATH="$pypath"} "$py" "$PYMOD" "$@") >"$LAST_OUT" 2>"$LAST_ERR"
    LAST_RC=$?
    while IFS= read -r line; do
        case $line in
            "ok "*) pass "$label: ${line#ok }"; n=$((n + 1)) ;;
            "FAIL "*) fail "$label: ${line#FAIL }" ;;
        esac
    done <"$LAST_OUT"
    if [ "$LAST_RC" -ne 0 ] && ! grep -q '^FAIL ' "$LAST_OUT"; then
        fail "$label: python_module.py $1 ran to the end" "exit $LAST_RC"
        sed -n '1,20s/^/     stderr: /p' "$LAST_ERR"
    fi
}

# The package this interpreter imports must be the installed copy.
expect_from() {
    local label=$1 py=$2 pypath=$3 where=$4 got
    got=$(cd "$TMP" && env ${pypath:+PYTHONPATH="$pypath"} "$py" -c 'import ckptfs; print(ckptfs.__file__, ckptfs.__version__)' 2>&1)
    case $got in
        "$where"/ckptfs/__init__.py" $VERSION") pass "$label: imports ckptfs $VERSION from $where" ;;
        *) fail "$label: imports ckptfs $VERSION from $where" "got: $got" ;;
    esac
}

all_checks() {
    local label=$1 py=$2 pypath=$3
    run_module "$label all" "$py" "$pypath" check "$MNT/all" "$TMP/src/all"
    run_module "$label common" "$py" "$pypath" check "$MNT/common" "$TMP/src/common"
    run_module "$label no key" "$py" "$pypath" no-key "$TMP/mnt-nokey/secret"
    run_module "$label plain" "$py" "$pypath" plain
}
VERSION=$(sed -n 's/.*define CKPT_VERSION_STRING "\(.*\)"/\1/p' "$ROOT/core/include/ckpt.h")
if grep -qx "version = \"$VERSION\"" "$ROOT/python/pyproject.toml" &&
    grep -qx "__version__ = \"$VERSION\"" "$ROOT/python/ckptfs/__init__.py"; then
    pass "pyproject.toml and __version__ say $VERSION, as ckpt.h"
else
    fail "pyproject.toml and __version__ say $VERSION, as ckpt.h"
fi

# ------------------------------- make install, Debian's python3 and torch

D=$TMP/inst
run_cmd make --no-print-directory -C "$ROOT" B="$B" DESTDIR="$D" PREFIX=/usr MOUNT_HELPER_DIR= install
if [ "$LAST_RC" -eq 0 ] && [ -f "$D/usr/lib/python3/dist-packages/ckptfs/__init__.py" ]; then
    pass "make install PREFIX=/usr puts the package in /usr/lib/python3/dist-packages"
else
    fail "make install PREFIX=/usr puts the package in /usr/lib/python3/dist-packages"
    show_last make install
fi
SITE=$D/usr/lib/python3/dist-packages
expect_from "debian" "$PY" "$SITE" "$SITE"
if "$PY" -c 'import torch' 2>/dev/null; then
    pass "Debian's python3 has torch $("$PY" -c 'import torch; print(torch.__version__)')"
else
    skip "Debian's torch" "python3-torch is not installed: .torch() is checked with the venv only"
fi
all_checks "debian" "$PY" "$SITE"
run_module "debian write" "$PY" "$SITE" write "$MNT" deb- "$BACK"

# ---------------------------------- pip install ./python into a fresh venv

# A copy: pip's in-tree build writes build/ and *.egg-info next to it.
cp -r "$ROOT/python" "$TMP/pysrc"
rm -rf "$TMP/pysrc/build" "$TMP/pysrc"/*.egg-info

if "$PY" -m venv --system-site-packages "$TMP/venv" >"$LAST_OUT" 2>&1; then
    expect_ok "pip install ./python into a venv" "$TMP/venv/bin/python" -m pip install -q "$TMP/pysrc"
    VSITE=$("$TMP/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    expect_from "pip venv" "$TMP/venv/bin/python" "" "$VSITE"
    run_module "pip venv all" "$TMP/venv/bin/python" "" check "$MNT/all" "$TMP/src/all"
    expect_ok "pip uninstall ckptfs" "$TMP/venv/bin/python" -m pip uninstall -y -q ckptfs
    expect_absent "pip uninstall removes it" "$VSITE/ckptfs"
else
    skip "pip install ./python" "python3 -m venv failed (apt-get install python3-venv): $(tail -n 1 "$LAST_OUT")"
fi

# ----------------------------------------------- torch 2.13 (the pinned venv)

VPY=$(cd "$ROOT" && B=$B scripts/venv.sh 2>"$LAST_ERR")
case $VPY in /* | "") ;; *) VPY=$ROOT/$VPY ;; esac
if [ -n "$VPY" ] && [ -x "$VPY" ]; then
    expect_ok "pip install --target ./python with the pinned venv's pip" \
        "$VPY" -m pip install -q --target "$TMP/site213" "$TMP/pysrc"
    expect_from "torch 2.13" "$VPY" "$TMP/site213" "$TMP/site213"
    run_cmd "$VPY" -c 'import torch; assert hasattr(torch, "float8_e4m3fn") and hasattr(torch, "uint64"); print(torch.__version__)'
    if [ "$LAST_RC" -eq 0 ]; then pass "the venv's torch $(cat "$LAST_OUT") has every dtype"; else fail "the venv's torch has every dtype" "$(cat "$LAST_ERR")"; fi
    all_checks "torch 2.13" "$VPY" "$TMP/site213"
    run_module "torch 2.13 write" "$VPY" "$TMP/site213" write "$MNT" venv- "$BACK"
else
    skip "torch 2.13" "scripts/venv.sh could not make the pinned venv: $(tail -n 1 "$LAST_ERR")"
fi

unmount_ckptfs "$TMP/mnt-nokey"
unmount_ckptfs "$MNT" && pass "the daemon exits cleanly" || fail "the daemon exits cleanly" "$(tail -n 5 "$LOG")"
finish
