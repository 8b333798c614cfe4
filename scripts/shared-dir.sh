#!/usr/bin/env bash
# Prints the steering side's shared directory (services/ceph-rgw.sh and
# friends): $CKPT_SHARED, else ../shared beside the checkout, else beside
# the main checkout when this is a git worktree (made elsewhere, e.g. in /tmp).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
if [ -n "${CKPT_SHARED:-}" ]; then
    echo "$CKPT_SHARED"
    exit 0
fi
if [ -d "$root/../shared" ]; then
    (cd "$root/../shared" && pwd)
    exit 0
fi
common=$(git -C "$root" rev-parse --path-format=absolute --git-common-dir 2>/dev/null || true)
if [ -n "$common" ] && [ -d "$common/../../shared" ]; then
    (cd "$common/../../shared" && pwd)
    exit 0
fi
echo "$root/../shared"
