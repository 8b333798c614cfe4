#!/usr/bin/python3
"""Runs the code blocks of README.md that a user would paste, for
tests/integration/test_readme.sh.

Every fenced block tagged ```sh or ```python is run, each in a scratch
directory of its own, with the README's example paths replaced by scratch
ones (/mnt/ckpt -> SCRATCH/mnt, /data/packs -> SCRATCH/packs; relative names
such as step1000.tpack, my.key, ./checkpoint and out/step2000 exist in the
scratch directory, which is the working directory). A block fails the test
when it exits non-zero (sh blocks run with bash -e -o pipefail).

An HTML comment on the line just before a block says how to run it; the
README shows these:

  <!-- snippet: skip (REASON) -->       not run; reported as skipped with REASON
  <!-- snippet: bare (...) -->          only the sources: ./checkpoint (a
                                        GPT-2-shaped checkpoint), out/step2000
  <!-- snippet: unmounted (...) -->     also my.key and packs/step1000.tpack,
                                        packed with it; nothing mounted
  (no comment)                          all of that, mounted writable with
                                        the key at /mnt/ckpt

The packed step1000 is ckpt-gen's tiny preset (bf16) plus what the README
loads from it: layer0.pt (torch.save), a torch.distributed.checkpoint save,
and extra.safetensors with F32, F16, F64, I64, I32, U8, BOOL, empty and
scalar tensors.
Blocks in other languages (json, plain ``` text) are reported as not code.

  readme_snippets.py README ROOT BUILD PYTHON

PYTHON runs the python blocks (it needs numpy, torch >= 2.2, safetensors);
the ckptfs package is taken from ROOT/python. Prints one line per block:
"ok", "FAIL" (with the block's output) or "skip"; exits 1 on any FAIL.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

FENCE = re.compile(r"^```(\S*)\s*$")
MARKER = re.compile(r"^<!--\s*snippet:\s*(\w+)\s*(?:\((.*)\))?\s*-->\s*$")
MODES = ("skip", "bare", "unmounted", "mounted")


def blocks(text):
    """(line number, language, mode, reason, code) for every fenced block."""
    lines = text.split("\n")
    out, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start, lang = i + 1, m.group(1)
        j = i + 1
        while j < len(lines) and not FENCE.match(lines[j]):
            j += 1
        if j == len(lines):
            raise SystemExit("README line %d: a code block is never closed" % start)
        mode, reason = "mounted", ""
        prev = lines[i - 1] if i else ""
        mm = MARKER.match(prev)
        if mm:
            mode, reason = mm.group(1), mm.group(2) or ""
            if mode not in MODES:
                raise SystemExit("README line %d: unknown snippet mode %r (known: %s)" % (i, mode, ", ".join(MODES)))
            if mode == "skip" and not reason.strip():
                raise SystemExit("README line %d: a skipped snippet must say why" % i)
        elif "snippet:" in prev:
            raise SystemExit("README line %d: malformed snippet marker %r" % (i, prev))
        out.append((start, lang, mode, reason, "\n".join(lines[i + 1:j]) + "\n"))
        i = j + 1
    return out


class Scratch:
    """One block's world: sources, key, packs and mount, as its mode asks."""

    def __init__(self, base, n, mode, root, build, python):
        self.dir = os.path.join(base, "snippet%02d" % n)
        self.mnt = os.path.join(self.dir, "mnt")
        self.packs = os.path.join(self.dir, "packs")
        self.build, self.python, self.root = build, python, root
        self.daemon = None
        os.makedirs(self.dir)
        shutil.copytree(os.path.join(base, "sources", "checkpoint"), os.path.join(self.dir, "checkpoint"), symlinks=True)
        shutil.copytree(os.path.join(base, "sources", "out"), os.path.join(self.dir, "out"), symlinks=True)
        os.makedirs(self.mnt)
        os.makedirs(self.packs)
        if mode == "bare":
            return
        shutil.copy(os.path.join(base, "sources", "my.key"), os.path.join(self.dir, "my.key"))
        os.chmod(os.path.join(self.dir, "my.key"), 0o600)
        shutil.copy(os.path.join(base, "sources", "step1000.tpack"), os.path.join(self.packs, "step1000.tpack"))
        shutil.copy(os.path.join(base, "sources", "step1000.tpack"), os.path.join(self.dir, "step1000.tpack"))
        if mode == "mounted":
            self.log = open(os.path.join(self.dir, "ckptfs.log"), "ab")
            self.daemon = subprocess.Popen(
                [os.path.join(build, "bin", "ckptfs"), "-f", "-o", "key_file=" + os.path.join(self.dir, "my.key"),
                 self.packs, self.mnt], stderr=self.log)
            for _ in range(400):
                if os.path.ismount(self.mnt):
                    break
                if self.daemon.poll() is not None:
                    raise SystemExit("ckptfs exited: see %s/ckptfs.log" % self.dir)
                time.sleep(0.05)
            else:
                raise SystemExit("ckptfs did not mount %s" % self.mnt)

    def substitute(self, code):
        return code.replace("/mnt/ckpt", self.mnt).replace("/data/packs", self.packs)

    def close(self):
        # Whatever the block mounted, or the mount made for it.
        for _ in range(50):
            if not os.path.ismount(self.mnt):
                break
            subprocess.call(["fusermount3", "-u", self.mnt], stderr=subprocess.DEVNULL)
            time.sleep(0.1)
        else:
            subprocess.call(["fusermount3", "-u", "-z", self.mnt])
        if self.daemon:
            try:
                self.daemon.wait(20)
            except subprocess.TimeoutExpired:
                self.daemon.kill()
                self.daemon.wait()
            self.log.close()


def make_sources(base, build, python):
    """The checkpoint the README's examples use, packed as step1000.tpack."""
    src = os.path.join(base, "sources")
    ck = os.path.join(src, "checkpoint")
    subprocess.check_call([os.path.join(build, "bin", "ckpt-gen"), ck, "--preset", "tiny"], stdout=subprocess.DEVNULL)
    # What the README loads besides: a torch.save file, a DCP checkpoint of a
    # torch.nn.Linear(16, 16), and tensors of other dtypes than ckpt-gen's
    # bf16 (an empty one too), so that dtype handling is exercised.
    subprocess.check_call([python, "-W", "ignore", "-c", """if True:
        import sys, torch, torch.distributed.checkpoint as dcp, safetensors.torch
        ck = sys.argv[1]
        torch.save({"w": torch.arange(12.0).reshape(3, 4)}, ck + "/layer0.pt")
        safetensors.torch.save_file({
            "extra.f32": torch.randn(3, 4), "extra.f16": torch.randn(5).half(),
            "extra.f64": torch.randn(2, 2).double(), "extra.i64": torch.arange(7),
            "extra.i32": torch.arange(3, dtype=torch.int32), "extra.u8": torch.arange(9, dtype=torch.uint8),
            "extra.mask": torch.tensor([True, False, True]), "extra.empty": torch.zeros(0, 4),
            "extra.scalar": torch.tensor(2.5)}, ck + "/extra.safetensors")
        dcp.save(torch.nn.Linear(16, 16).state_dict(), checkpoint_id=ck)
        """, ck])
    out = os.path.join(src, "out", "step2000")
    subprocess.check_call([os.path.join(build, "bin", "ckpt-gen"), out, "--preset", "tiny", "--seed", "1"],
                          stdout=subprocess.DEVNULL)
    ckpt = os.path.join(build, "bin", "ckpt")
    subprocess.check_call([ckpt, "keygen", "-o", os.path.join(src, "my.key")], stdout=subprocess.DEVNULL)
    subprocess.check_call([ckpt, "pack", ck, "-o", os.path.join(src, "step1000.tpack"),
                           "--key-file", os.path.join(src, "my.key")], stdout=subprocess.DEVNULL)


def main():
    readme, root, build, python = sys.argv[1:5]
    root, build = os.path.abspath(root), os.path.abspath(build)
    if os.sep in python:
        python = os.path.abspath(python)
    with open(readme) as f:
        found = blocks(f.read())
    base = tempfile.mkdtemp(prefix="ckpt-readme.")
    env = dict(os.environ)
    env["PATH"] = os.path.join(build, "bin") + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = os.path.join(root, "python")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    failed = ran = 0
    try:
        make_sources(base, build, python)
        for n, (line, lang, mode, reason, code) in enumerate(found):
            where = "README.md:%d (```%s)" % (line, lang or "")
            if lang not in ("sh", "python"):
                print("not code: %s: a %s block, shown, not run" % (where, lang or "plain text"))
                continue
            if mode == "skip":
                print("skip %s: %s" % (where, reason))
                continue
            scratch = Scratch(base, n, mode, root, build, python)
            try:
                code = scratch.substitute(code)
                cmd = ["bash", "-e", "-o", "pipefail", "-c", code] if lang == "sh" else [python, "-c", code]
                t0 = time.monotonic()
                r = subprocess.run(cmd, cwd=scratch.dir, env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, timeout=300)
                secs = time.monotonic() - t0
            finally:
                scratch.close()
            ran += 1
            first = code.strip().split("\n")[0]
            if r.returncode == 0:
                print("ok %s, %s: %s (%.1fs)" % (where, mode, first[:60], secs))
            else:
                failed += 1
                print("FAIL %s, %s: exit %d" % (where, mode, r.returncode))
                for out_line in r.stdout.decode("utf-8", "replace").rstrip("\n").split("\n")[-15:]:
                    print("     | " + out_line)
    finally:
        if os.environ.get("KEEP_TMP") == "1":
            print("kept " + base, file=sys.stderr)
        else:
            shutil.rmtree(base, ignore_errors=True)
    print("snippets: %d run, %d failed" % (ran, failed))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
