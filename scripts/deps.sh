#!/usr/bin/env bash
# Installs what the build and the tests need on Debian 12, or, when not root,
# prints the exact command to run. Usage: scripts/deps.sh [build|test|bench]
set -euo pipefail
want=(gcc clang make pkg-config libfuse3-dev fuse3 libsodium-dev zlib1g-dev libdeflate-dev libzstd-dev
      libcriterion-dev libjansson-dev libssl-dev libcurl4-openssl-dev libxml2-dev attr)
case "${1:-build}" in
  test)  want+=(python3-numpy python3-torch python3-venv valgrind strace libclang-rt-14-dev clang-format openssl) ;;
  bench) want+=(python3-numpy squashfs-tools squashfuse gocryptfs gnuplot-nox time zstd s3fs) ;;
esac
missing=()
for p in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
cmd="apt-get install -y ${missing[*]}"
if [ "$(id -u)" -ne 0 ]; then
  echo "missing packages: ${missing[*]}" >&2
  echo "run as root:  apt-get update && $cmd" >&2
  exit 1
fi
echo "installing: ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq "${missing[@]}" >/dev/null
