#!/usr/bin/env bash
# Builds the Debian packages (ckptfs, libckpt0, libckpt-dev) from the working
# tree: copies the tree to a scratch directory with packaging/debian as
# debian/, runs `dpkg-buildpackage -us -uc -b` there, and leaves the .deb
# files (with the .buildinfo and .changes) in $B/deb (B defaults to build).
#
# Usage: packaging/build-deb.sh
# Environment: B (the build directory, for the output), DEB_BUILD_OPTIONS
# (nocheck skips the unit tests), DEB_BUILD_PROFILES (pkg.ckptfs.cuda adds
# ckpt-cuda when a CUDA toolkit is found).
#
# Missing build tools and Build-Depends are installed with apt-get when run
# as root; otherwise the script prints the command to run and exits 1.
set -euo pipefail

if [ $# -gt 0 ]; then
    sed -n '2,13s/^# \{0,1\}//p' "$0"
    case $1 in -h | --help) exit 0 ;; *) exit 2 ;; esac
fi

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
B=${B:-build}
case $B in /*) out=$B/deb ;; *) out=$root/$B/deb ;; esac

die() { echo "build-deb: $*" >&2; exit 1; }

# Installs the packages named, or says how to.
need_packages() {
    [ $# -eq 0 ] && return 0
    if [ "$(id -u)" -ne 0 ]; then
        echo "build-deb: missing: $*" >&2
        echo "run as root:  apt-get update && apt-get install -y $*" >&2
        exit 1
    fi
    echo "build-deb: installing $*" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq "$@" >/dev/null
}

missing=()
for p in dpkg-dev debhelper fakeroot; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
need_packages ${missing[@]+"${missing[@]}"}

# The Build-Depends field, as one line.
build_depends=$(awk '
    /^Build-Depends:/ { on = 1; sub(/^Build-Depends:/, ""); print; next }
    on && /^[ \t]/    { print; next }
    { on = 0 }' packaging/debian/control | tr -s ' \t\n' ' ')
if ! unmet=$(dpkg-checkbuilddeps packaging/debian/control 2>&1); then
    echo "build-deb: ${unmet#dpkg-checkbuilddeps: error: }" >&2
    if [ "$(id -u)" -ne 0 ]; then
        echo "run as root:  apt-get update && apt-get satisfy -y '$build_depends'" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get satisfy -y -qq "$build_depends" >/dev/null
fi

version=$(dpkg-parsechangelog -l packaging/debian/changelog -S Version)
scratch=$(mktemp -d "${TMPDIR:-/tmp}/ckptfs-deb.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
src=$scratch/ckptfs-$version
mkdir -p "$src"

# The sources: what git tracks or would track (no build output), else the
# whole tree less build directories.
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git ls-files -z --cached --others --exclude-standard |
        while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done |
        tar --null -T - -cf - | tar -xf - -C "$src"
else
    tar --exclude='./build' --exclude='./build-*' --exclude='./.git' -cf - . | tar -xf - -C "$src"
fi
rm -rf "$src/debian"
cp -a packaging/debian "$src/debian"

echo "build-deb: building ckptfs $version in $src (log: $out/build.log)"
mkdir -p "$out"
if ! (cd "$src" && dpkg-buildpackage -us -uc -b) >"$out/build.log" 2>&1; then
    tail -n 40 "$out/build.log" >&2
    die "dpkg-buildpackage failed; the whole log is $out/build.log"
fi

# Replace what an earlier build left, then move the new files in.
rm -f "$out"/*.deb "$out"/*.ddeb "$out"/*.buildinfo "$out"/*.changes
shopt -s nullglob
built=("$scratch"/*.deb "$scratch"/*.ddeb "$scratch"/*.buildinfo "$scratch"/*.changes)
[ ${#built[@]} -gt 0 ] || die "dpkg-buildpackage made no packages (see $out/build.log)"
mv "${built[@]}" "$out/"
for f in "$out"/*.deb; do echo "built $f"; done
