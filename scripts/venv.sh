#!/usr/bin/env bash
# Makes (or reuses) the virtual environment of pinned Python clients that the
# integration tests and benchmarks use: build/venv, from Debian's python3.
# Prints the venv's python path. Re-running is cheap: it reinstalls only when
# tests/python/requirements.txt changed.
#   scripts/venv.sh s3   the same for build/venv-s3 and requirements-s3.txt
#                        (boto3 only, for the S3 test and benchmark)
set -euo pipefail
cd "$(dirname "$0")/.."
B=${B:-build}
venv=$B/venv${1:+-$1}
req=tests/python/requirements${1:+-$1}.txt
[ -f "$req" ] || { echo "no $req" >&2; exit 2; }
stamp=$venv/.requirements
if [ -x "$venv/bin/python" ] && cmp -s "$req" "$stamp"; then
  echo "$venv/bin/python"
  exit 0
fi
rm -rf "$venv"
/usr/bin/python3 -m venv "$venv" >&2
"$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$req" >&2
cp "$req" "$stamp"
echo "$venv/bin/python"
