#!/usr/bin/env bash
# Packs one or more builds' binaries, with the shared libraries they link
# (all but the C library's own), into one tarball that runs on another
# x86-64 Linux machine without this project's build dependencies: a
# machine lent for a measurement (16 cores, a GPU), where nothing can be
# installed. Each build's bin/ holds wrappers that point the loader at the
# tarball's lib/; fusermount3 comes along for the mount benches.
#
# Usage: bench/carry.sh OUT.tar.xz NAME=BINDIR [NAME=BINDIR...]
#   e.g. bench/carry.sh /tmp/kit.tar.xz new=build/bin old=/tmp/old/bin
# There: tar -C DIR -xJf kit.tar.xz; PATH=DIR/sbin:$PATH (where the
# machine has no fusermount3 of its own);
# bench/bench-ab.sh WORK DIR/new/bin DIR/old/bin.
set -euo pipefail
[ $# -ge 2 ] || { sed -n '2,13p' "$0" >&2; exit 2; }
out=$1
shift
kit=$(mktemp -d)
trap 'rm -rf "$kit"' EXIT
mkdir -p "$kit/lib" "$kit/sbin"
for spec in "$@"; do
    name=${spec%%=*} dir=${spec#*=}
    [ "$name" != "$spec" ] && [ -d "$dir" ] || { echo "carry: not NAME=BINDIR: $spec" >&2; exit 2; }
    mkdir -p "$kit/$name/real" "$kit/$name/bin"
    for f in "$dir"/*; do
        [ -f "$f" ] && [ -x "$f" ] || continue
        n=$(basename "$f")
        cp "$f" "$kit/$name/real/$n"
        # The loader finds the carried libraries through the wrapper, not
        # through the environment of everything else run there.
        printf '#!/bin/sh\nd=$(cd "$(dirname "$0")/.." && pwd)\nLD_LIBRARY_PATH="$d/../lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$d/real/%s" "$@"\n' \
            "$n" >"$kit/$name/bin/$n"
        chmod +x "$kit/$name/bin/$n"
    done
done
# The C library and the C++ runtime stay the target's: a newer one there
# runs binaries linked against an older one, and not the other way round.
find "$kit" -path '*/real/*' -type f -exec ldd {} \; 2>/dev/null | awk '$3 ~ /^\// { print $3 }' |
    grep -v -E '/(libc|libm|libdl|librt|libpthread|libresolv|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so' |
    sort -u | while read -r lib; do cp -L "$lib" "$kit/lib/"; done
if command -v fusermount3 >/dev/null; then cp "$(command -v fusermount3)" "$kit/sbin/"; fi
tar -C "$kit" -cJf "$out" .
echo "carry: $out ($(du -h "$out" | cut -f1)): $(cd "$kit" && ls -d ./*/real | sed 's|^\./||; s|/real$||' | tr '\n' ' ')"
