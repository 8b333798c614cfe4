#!/usr/bin/python3
"""Checks the include layout that fs/README.md draws; exits 1 on a fault.

  fs/main.c -> fs/fuse/ -> fs/read/, fs/write/ -> fs/common/ -> core
  tools/ -> core

- a file includes only its own directory, or a lower layer;
- fs/read and fs/write never include each other;
- across directories only a directory's public header is included
  (read/read.h, write/write.h, fuse/frontend.h; every header of common/);
- *_internal.h stays inside its directory (tests may include it);
- inside fs/fuse, read_ops.c and write_ops.c do not include each other's
  header: ops.c alone dispatches;
- fs/ and tools/ include only core's public headers (core/include), and
  the internal one only with CKPT_INTERNAL_API;
- no include cycle between files, or between directories.
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
# Search paths after the including file's own directory, as the Makefile
# passes them (-Ifs for fs/, -Icore/include everywhere, -Icore/src in core).
SEARCH = {"fs": ["fs", "core/include"], "tools": ["core/include"],
          "core": ["core/include", "core/src"]}
FS_RANK = {"common": 0, "read": 1, "write": 1, "fuse": 2, "": 3}
PUBLIC = {"read": {"read.h"}, "write": {"write.h"}, "fuse": {"frontend.h"}}
CORE_PUBLIC = {"core/include/ckpt.h", "core/include/ckpt_mount.h", "core/include/ckpt_names.h",
               "core/include/ckpt_internal.h"}
# The library's base header (errors, byte order, maps, dtype sizes), like
# zstd's lib/common/: every directory of core may include it, so it makes
# no directory-level edge.
CORE_BASE = "core/src/common.h"


def sources():
    for top in ("core", "fs", "tools"):
        for dirpath, _, files in os.walk(os.path.join(ROOT, top)):
            if "/tests" in dirpath[len(ROOT):]:
                continue
            for f in files:
                if f.endswith((".c", ".h")):
                    yield os.path.relpath(os.path.join(dirpath, f), ROOT)


def resolve(src, name):
    here = os.path.dirname(src)
    for d in [here] + SEARCH[src.split("/")[0]]:
        cand = os.path.normpath(os.path.join(d, name))
        if os.path.exists(os.path.join(ROOT, cand)):
            return cand
    return None


def fs_dir(path):
    parts = path.split("/")
    return parts[1] if len(parts) > 2 else ""


def check(src, dst, text, faults):
    top, dtop = src.split("/")[0], dst.split("/")[0]
    say = lambda why: faults.append(f"{src}: includes {dst}: {why}")
    if top in ("fs", "tools") and dtop == "core":
        if dst not in CORE_PUBLIC:
            say("not one of core's public headers (core/include)")
        elif dst.endswith("ckpt_internal.h") and "CKPT_INTERNAL_API" not in text:
            say("the internal header needs #define CKPT_INTERNAL_API first")
        return
    if top == "core" and dtop != "core":
        say("core depends on nothing above it")
        return
    if top != dtop:
        say(f"{top}/ and {dtop}/ are separate parts")
        return
    if top != "fs":
        return
    a, b = fs_dir(src), fs_dir(dst)
    if a == b:
        if a == "fuse" and {os.path.basename(src), os.path.basename(dst)} & {
                "read_ops.c", "write_ops.c"}:
            pair = {os.path.basename(src).split(".")[0], os.path.basename(dst).split(".")[0]}
            if pair == {"read_ops", "write_ops"}:
                say("the read and write sides meet only in ops.c")
        return
    if {a, b} == {"read", "write"}:
        say("fs/read and fs/write never include each other")
    elif FS_RANK[b] >= FS_RANK[a]:
        say(f"fs/{a or 'main.c'} may not include a layer at or above it (fs/{b})")
    elif dst.endswith("_internal.h"):
        say("a private header of another directory")
    elif b in PUBLIC and os.path.basename(dst) not in PUBLIC[b]:
        say(f"only {', '.join(sorted(PUBLIC[b]))} is public in fs/{b}")


def cycles(graph):
    found, state = [], {}

    def visit(n, stack):
        state[n] = 1
        stack.append(n)
        for m in graph.get(n, ()):
            if state.get(m) == 1:
                found.append(stack[stack.index(m):] + [m])
            elif m not in state:
                visit(m, stack)
        stack.pop()
        state[n] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n, [])
    return found


def main():
    faults, files, dirs = [], {}, {}
    for src in sorted(sources()):
        text = open(os.path.join(ROOT, src), encoding="utf-8", errors="replace").read()
        for name in INCLUDE.findall(text):
            dst = resolve(src, name)
            if dst is None:
                faults.append(f"{src}: includes \"{name}\", which is not found")
                continue
            check(src, dst, text, faults)
            files.setdefault(src, set()).add(dst)
            a, b = os.path.dirname(src), os.path.dirname(dst)
            if a != b and dst != CORE_BASE:
                dirs.setdefault(a, set()).add(b)
    for c in cycles(files):
        faults.append("include cycle: " + " -> ".join(c))
    for c in cycles(dirs):
        faults.append("directory cycle: " + " -> ".join(c))
    # Two .c files that include each other's headers call each other.
    for src, dsts in files.items():
        if not src.endswith(".c"):
            continue
        for d in dsts:
            peer = d[:-2] + ".c"
            if peer != src and src[:-2] + ".h" in files.get(peer, ()):
                if src < peer:
                    faults.append(f"{src} and {peer} include each other's header")
    for f in faults:
        print("lint-layout:", f)
    if faults:
        return 1
    print(f"lint-layout: {len(files)} files, {sum(map(len, files.values()))} includes, layout ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
