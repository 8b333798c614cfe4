#!/usr/bin/env bash
# The README's code blocks run: readme_snippets.py extracts every ```sh and
# ```python block and runs it on a generated checkpoint in a scratch mount
# (the README's paths replaced by scratch ones), so a wrong snippet fails
# here. Blocks marked `<!-- snippet: skip (REASON) -->` in the README are
# reported as skipped with their reason. Python blocks run with the pinned
# venv of scripts/venv.sh (torch 2.13, numpy, safetensors), with the ckptfs
# package from python/.
# shellcheck source-path=SCRIPTDIR
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/mount_lib.sh"

VPY=$(cd "$ROOT" && B=$B scripts/venv.sh 2>"$LAST_ERR") || skip_all "scripts/venv.sh could not make the pinned venv: $(tail -n 1 "$LAST_ERR")"
case $VPY in /*) ;; *) VPY=$ROOT/$VPY ;; esac

"$PY" "$ROOT/tests/integration/readme_snippets.py" "$ROOT/README.md" "$ROOT" "$BUILD" "$VPY" >"$LAST_OUT" 2>"$LAST_ERR"
LAST_RC=$?
blocks=0
while IFS= read -r line; do
    case $line in
        "ok "*) pass "snippet ${line#ok }"; blocks=$((blocks + 1)) ;;
        "FAIL "*) fail "snippet ${line#FAIL }"; blocks=$((blocks + 1)) ;;
        "     | "*) echo "$line" ;;
        "skip "*) r=${line#skip }; skip "snippet ${r%%: *}" "${r#*: }" ;;
        *) echo "$line" ;;
    esac
done <"$LAST_OUT"
if [ "$LAST_RC" -ne 0 ] && ! grep -q '^FAIL ' "$LAST_OUT"; then
    fail "readme_snippets.py ran" "exit $LAST_RC"
    sed -n '1,20s/^/     stderr: /p' "$LAST_ERR"
fi
[ "$blocks" -gt 0 ] && pass "the README has runnable snippets ($blocks)" || fail "the README has runnable snippets"
finish
