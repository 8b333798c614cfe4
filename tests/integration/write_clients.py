#!/usr/bin/python3
"""Real writers into a ckptfs mount, for tests/integration/test_write*.sh.

Each command prints one "ok ..." line per check that held and exits 1 (after
a "FAIL ..." line) on the first that did not. Data is generated from a seed,
so the same command writes the same bytes into a plain directory and into
the mount, and a reader can regenerate what it should find.

  save DIR KIND SEED        write a checkpoint the way a trainer would:
                            torch (one torch.save of a state_dict),
                            torch-per-tensor (one torch.save per tensor),
                            npy (np.save per array), safetensors (written per
                            its format), dcp (the file protocol of PyTorch
                            DCP's FileSystemWriter, saved from a background
                            thread as async_save does), mixed (all five in
                            subdirectories)
  verify DIR KIND SEED      load it back (torch.load, np.load with mmap,
                            safetensors parsed over mmap) and compare
  random-ops A B SEED N     N random file operations (writes at random
                            offsets, appends, overwrites, truncates, mmap
                            writes, renames, unlinks, fsync) applied alike to
                            directories A and B, reading back as it goes
  same-tree A B [--packed]  the files under A and B have the same bytes; with
                            --packed, B is a committed checkpoint whose
                            manifest.json and tensors/ are not A's files
  crash-writer DIR LOG SEED write files into DIR one after another, fsync
                            each, then append "name size sha256" to LOG
                            (fsynced) until killed
  crash-check DIR LOG SEED  every file LOG lists is in DIR, intact
  errno-of OP PATH [TO]     run one operation, print the errno (0: worked);
                            OP rename renames PATH to TO
  held-open DIR CKPT        a file open since before its checkpoint's commit
                            reads that generation, before and after a later
                            one replaces it (CKPT: the ckpt binary)
  same-inodes DIR...        readdir's d_ino of every entry of each DIR, "."
                            and ".." too (but a mount root's ".."), is the
                            st_ino stat gives it (what find -inum and ls -i
                            rely on)
"""
import ctypes
import errno
import hashlib
import json
import mmap
import os
import random
import struct
import sys

import numpy as np


def fail(msg):
    print("FAIL " + msg)
    sys.exit(1)


def ok(msg):
    print("ok " + msg)


# ------------------------------------------------------------- checkpoints

def tensors_for(seed):
    """A small model's worth of named arrays: bf16 weights as uint16, f32 norms,
    i64 step counters, f16 extras."""
    rng = np.random.default_rng(seed)
    out = {}
    for layer in range(3):
        w = rng.standard_normal((96, 64), dtype=np.float32) * 0.02
        out["layers.%d.attn.weight" % layer] = (w.view(np.uint32) >> 16).astype(np.uint16)
        out["layers.%d.norm.weight" % layer] = rng.standard_normal(64, dtype=np.float32)
    out["embed.weight"] = (rng.standard_normal((300, 64), dtype=np.float32).view(np.uint32)
                           >> 16).astype(np.uint16)
    out["step"] = np.array([seed * 1000 + 7], dtype=np.int64)
    out["extra.half"] = rng.standard_normal((5, 7)).astype(np.float16)
    return out


ST_DTYPES = {np.dtype(np.uint16): "BF16", np.dtype(np.float32): "F32",
             np.dtype(np.int64): "I64", np.dtype(np.float16): "F16"}


def write_safetensors(path, arrays):
    """The safetensors layout, by hand: u64 header length, JSON header, data."""
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        raw = a.tobytes()
        header[name] = {"dtype": ST_DTYPES[a.dtype], "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for raw in blobs:
            f.write(raw)


def read_safetensors_mmap(path):
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    (n,) = struct.unpack_from("<Q", m, 0)
    header = json.loads(bytes(m[8:8 + n]))
    back = {}
    inv = {v: k for k, v in ST_DTYPES.items()}
    for name, spec in header.items():
        if name == "__metadata__":
            continue
        a, b = spec["data_offsets"]
        back[name] = np.frombuffer(m[8 + n + a:8 + n + b], dtype=inv[spec["dtype"]]).reshape(
            spec["shape"])
    return back


def torch_tensors(arrays):
    import torch
    out = {}
    for name, a in arrays.items():
        if a.dtype == np.uint16:  # bf16 bits
            out[name] = torch.from_numpy(a.astype(np.int16)).view(torch.bfloat16)
        else:
            out[name] = torch.from_numpy(a.copy())
    return out


def safe_name(name):
    return name.replace("/", "_")


KINDS = ("torch", "torch-per-tensor", "npy", "safetensors", "dcp")

# Debian's torch 1.13 has no torch.distributed.checkpoint, so this follows
# what its FileSystemWriter (torch >= 2.0) does to the filesystem: each rank
# writes __RANK_0.distcp (torch.save of each tensor, back to back) and fsyncs
# it, then the coordinator writes .metadata.tmp, fsyncs it and renames it to
# .metadata. async_save first stages the state dict to CPU copies and runs
# all of that on a thread while training goes on.
DCP_RANKS = 2


def dcp_save(d, arrays):
    import pickle
    import threading
    import torch
    live = torch_tensors(arrays)
    staged = {name: t.clone() for name, t in live.items()}
    names = sorted(staged)
    where = {}
    lock = threading.Lock()

    def write_rank(rank):
        fname = "__%d_0.distcp" % rank
        with open(os.path.join(d, fname), "wb") as f:
            for name in names[rank::DCP_RANKS]:
                start = f.tell()
                torch.save(staged[name], f)
                with lock:
                    where[name] = (fname, start, f.tell() - start)
            f.flush()
            os.fsync(f.fileno())

    def save_all():
        ranks = [threading.Thread(target=write_rank, args=(r,)) for r in range(DCP_RANKS)]
        for t in ranks:
            t.start()
        for t in ranks:
            t.join()
        tmp = os.path.join(d, ".metadata.tmp")
        with open(tmp, "wb") as f:
            pickle.dump({"storage": dict(sorted(where.items()))}, f)
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, os.path.join(d, ".metadata"))

    writer = threading.Thread(target=save_all)
    writer.start()
    for t in live.values():  # the next training step changes the live weights
        t.mul_(2)
    writer.join()
    if len(where) != len(names):
        fail("dcp: a rank did not write all its tensors")


def dcp_load(d):
    import io
    import pickle
    import torch
    if os.path.exists(os.path.join(d, ".metadata.tmp")):
        fail("dcp: .metadata.tmp is still there after the rename")
    with open(os.path.join(d, ".metadata"), "rb") as f:
        where = pickle.load(f)["storage"]
    out = {}
    for name, (fname, start, length) in where.items():
        with open(os.path.join(d, fname), "rb") as f:
            f.seek(start)
            blob = f.read(length)
        if len(blob) != length:
            fail("dcp: %s: short read at %d in %s" % (name, start, fname))
        out[name] = torch.load(io.BytesIO(blob))
    return out


def save(d, kind, seed):
    arrays = tensors_for(seed)
    os.makedirs(d, exist_ok=True)
    if kind == "torch":
        import torch
        torch.save({"model": torch_tensors(arrays), "epoch": seed}, os.path.join(d, "model.pt"))
    elif kind == "torch-per-tensor":
        import torch
        for name, t in torch_tensors(arrays).items():
            torch.save(t, os.path.join(d, safe_name(name) + ".pt"))
    elif kind == "npy":
        for name, a in arrays.items():
            np.save(os.path.join(d, safe_name(name) + ".npy"), a)
    elif kind == "safetensors":
        write_safetensors(os.path.join(d, "model.safetensors"), arrays)
    elif kind == "dcp":
        dcp_save(d, arrays)
    elif kind == "mixed":
        for k in KINDS:
            save(os.path.join(d, k), k, seed)
        return
    else:
        fail("unknown kind " + kind)
    ok("saved %s into %s" % (kind, d))


def same_array(name, got, want):
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape or got.tobytes() != want.tobytes():
        fail("%s differs (shape %s, want %s)" % (name, got.shape, want.shape))


def verify(d, kind, seed):
    arrays = tensors_for(seed)
    if kind == "torch":
        import torch
        obj = torch.load(os.path.join(d, "model.pt"))
        if obj["epoch"] != seed:
            fail("epoch")
        for name, a in arrays.items():
            t = obj["model"][name]
            got = t.view(torch.int16).numpy().astype(np.uint16) if t.dtype == torch.bfloat16 else t.numpy()
            same_array(name, got, a)
    elif kind == "torch-per-tensor":
        import torch
        for name, a in arrays.items():
            t = torch.load(os.path.join(d, safe_name(name) + ".pt"))
            got = t.view(torch.int16).numpy().astype(np.uint16) if t.dtype == torch.bfloat16 else t.numpy()
            same_array(name, got, a)
    elif kind == "npy":
        for name, a in arrays.items():
            same_array(name, np.load(os.path.join(d, safe_name(name) + ".npy"), mmap_mode="r"), a)
    elif kind == "safetensors":
        back = read_safetensors_mmap(os.path.join(d, "model.safetensors"))
        if sorted(back) != sorted(arrays):
            fail("safetensors names differ")
        for name, a in arrays.items():
            same_array(name, back[name], a)
    elif kind == "dcp":
        import torch
        back = dcp_load(d)
        if sorted(back) != sorted(arrays):
            fail("dcp: names differ")
        for name, a in arrays.items():
            t = back[name]
            got = t.view(torch.int16).numpy().astype(np.uint16) if t.dtype == torch.bfloat16 else t.numpy()
            same_array(name, got, a)
    elif kind == "mixed":
        for k in KINDS:
            verify(os.path.join(d, k), k, seed)
        return
    ok("%s in %s loads back identical" % (kind, d))


# ------------------------------------------------------------ random ops

def file_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def all_files(root, packed=False):
    out = []
    for base, dirs, files in os.walk(root):
        for name in files:
            out.append(os.path.relpath(os.path.join(base, name), root))
    return sorted(out)


def pack_view(p):
    """Is p what the mount adds to a pack (fs/read/pack_tree.h), at the top
    of any checkpoint below the compared root (namespaces hold several)?"""
    parts = p.split("/")
    return parts[-1] == "manifest.json" or "tensors" in parts[:-1]


def same_tree(a, b, quiet=False, packed=False):
    fa, fb = all_files(a), all_files(b)
    if packed:
        have = set(fa)
        fb = [p for p in fb if p in have or not pack_view(p)]
    if fa != fb:
        fail("file lists differ: %s vs %s" % (fa[:8], fb[:8]))
    for rel in fa:
        if file_bytes(os.path.join(a, rel)) != file_bytes(os.path.join(b, rel)):
            fail("%s differs" % rel)
    if not quiet:
        ok("%d files identical" % len(fa))


def random_ops(a, b, seed, count):
    rng = random.Random(seed)
    names = ["f%d" % i for i in range(6)] + ["sub/g%d" % i for i in range(3)]
    for root in (a, b):
        os.makedirs(os.path.join(root, "sub"), exist_ok=True)
    done = {}
    for step in range(count):
        name = rng.choice(names)
        op = rng.choice(["write", "write", "write", "append", "truncate", "overwrite",
                         "mmap", "rename", "unlink", "fsync", "read"])
        size = rng.choice([1, 7, 4096, 4097, 65535, 65536, 65537, 200000, 1 << 20])
        off = rng.choice([0, 1, 4095, 65536, 70000, 1 << 20, 3 * 65536 - 5])
        data = rng.randbytes(size) if hasattr(rng, "randbytes") else bytes(
            rng.getrandbits(8) for _ in range(size))
        target = rng.choice(names)
        for root in (a, b):
            path = os.path.join(root, name)
            exists = os.path.exists(path)
            if op == "write":
                fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
                os.pwrite(fd, data, off)
                os.close(fd)
            elif op == "append":
                with open(path, "ab") as f:
                    f.write(data)
            elif op == "overwrite":
                with open(path, "wb") as f:
                    f.write(data)
            elif op == "truncate" and exists:
                os.truncate(path, off + size // 3)
            elif op == "mmap" and exists and os.path.getsize(path) > 0:
                n = os.path.getsize(path)
                with open(path, "r+b") as f:
                    m = mmap.mmap(f.fileno(), n)
                    at = off % n
                    piece = data[:n - at]
                    m[at:at + len(piece)] = piece
                    m.flush()
                    m.close()
            elif op == "rename" and exists:
                os.rename(path, os.path.join(root, target))
            elif op == "unlink" and exists:
                os.unlink(path)
            elif op == "fsync" and exists:
                fd = os.open(path, os.O_RDWR)
                os.fsync(fd)
                os.close(fd)
        if op == "read":
            pa, pb = os.path.join(a, name), os.path.join(b, name)
            if os.path.exists(pa) != os.path.exists(pb):
                fail("step %d: %s exists in one tree only" % (step, name))
            if os.path.exists(pa) and file_bytes(pa) != file_bytes(pb):
                fail("step %d: reading %s back differs" % (step, name))
        done[op] = done.get(op, 0) + 1
        if step % 25 == 24:
            same_tree(a, b, quiet=True)
    same_tree(a, b, quiet=True)
    ok("%d random operations (%s) match a plain directory" % (
        count, ", ".join("%s %d" % kv for kv in sorted(done.items()))))


# ------------------------------------------------------------- crash loop

def crash_content(seed, k):
    rng = np.random.default_rng([seed, k])
    size = int(rng.integers(1, 3 << 20))
    return rng.integers(0, 256, size, dtype=np.uint8).tobytes()


def crash_writer(d, log, seed):
    k = 0
    while k < 80:  # bounded: about 120 MB per checkpoint
        data = crash_content(seed, k)
        name = "file%04d.bin" % k
        fd = os.open(os.path.join(d, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        view, pos = memoryview(data), 0
        while pos < len(data):
            pos += os.write(fd, view[pos:pos + (1 << 20)])
        os.fsync(fd)
        os.close(fd)
        with open(log, "a") as f:
            f.write("%s %d %s\n" % (name, len(data), hashlib.sha256(data).hexdigest()))
            f.flush()
            os.fsync(f.fileno())
        k += 1


def crash_check(d, log, seed):
    n = 0
    if not os.path.exists(log):
        # Killed before it fsynced (and logged) anything: nothing promised.
        ok("0 fsynced files intact (the writer died before its first fsync)")
        return
    with open(log) as f:
        for line in f:
            parts = line.split()
            if len(parts) != 3:
                continue  # the writer died while logging: not promised
            name, size, digest = parts
            path = os.path.join(d, name)
            try:
                data = file_bytes(path)
            except OSError as e:
                fail("%s: fsynced, but now: %s" % (name, e))
            if len(data) != int(size) or hashlib.sha256(data).hexdigest() != digest:
                fail("%s: fsynced, but now %d bytes, differing" % (name, len(data)))
            n += 1
    ok("%d fsynced files intact" % n)


# ---------------------------------------------------------------- errno

def errno_of(op, path, to=None):
    try:
        if op == "create":
            open(path, "wb").close()
        elif op == "write":
            with open(path, "r+b") as f:
                f.write(b"x")
        elif op == "append":
            with open(path, "ab") as f:
                f.write(b"x")
        elif op == "read":
            with open(path, "rb") as f:
                f.read()
        elif op == "unlink":
            os.unlink(path)
        elif op == "mkdir":
            os.mkdir(path)
        elif op == "rmdir":
            os.rmdir(path)
        elif op == "truncate":
            os.truncate(path, 0)
        elif op == "rename":
            os.rename(path, to)
        else:
            fail("unknown op " + op)
    except OSError as e:
        print(errno.errorcode.get(e.errno, str(e.errno)))
        return
    print(0)


# ------------------------------------------------------------------ inodes

class _Dirent(ctypes.Structure):
    _fields_ = [("d_ino", ctypes.c_uint64), ("d_off", ctypes.c_int64),
                ("d_reclen", ctypes.c_ushort), ("d_type", ctypes.c_ubyte),
                ("d_name", ctypes.c_char * 256)]


def raw_listing(d):
    """[(name, d_ino)] of d as readdir(3) gives them, "." and ".." included
    (os.scandir leaves those out)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.opendir.restype = ctypes.c_void_p
    libc.opendir.argtypes = [ctypes.c_char_p]
    libc.readdir.restype = ctypes.POINTER(_Dirent)
    libc.readdir.argtypes = [ctypes.c_void_p]
    libc.closedir.argtypes = [ctypes.c_void_p]
    h = libc.opendir(os.fsencode(d))
    if not h:
        fail("opendir %s: %s" % (d, os.strerror(ctypes.get_errno())))
    out = []
    while True:
        e = libc.readdir(h)
        if not e:
            break
        out.append((os.fsdecode(e.contents.d_name), e.contents.d_ino))
    libc.closedir(h)
    return out


def same_inodes(dirs):
    for d in dirs:
        entries = raw_listing(d)
        for name, ino in entries:
            if name == ".." and os.path.ismount(d):
                continue
            st = os.lstat(os.path.join(d, name))
            if ino != st.st_ino:
                fail("%s/%s: readdir says inode %d, stat %d" % (d, name, ino, st.st_ino))
        ok("%s: %d entries, readdir's inodes are stat's" % (d, len(entries)))


# ------------------------------------------------------------- held open

def drop_page_cache(fd):
    # The kernel would answer from pages it kept; the daemon must.
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1")
    except OSError:
        pass


def read_all(fd, what):
    drop_page_cache(fd)
    try:
        return os.pread(fd, 1 << 24, 0)
    except OSError as e:
        fail("%s: %s" % (what, os.strerror(e.errno)))


def commit(ckpt, d):
    import subprocess
    r = subprocess.run([ckpt, "commit", "--wait", d], capture_output=True, text=True)
    if r.returncode != 0:
        fail("ckpt commit --wait %s: %s" % (d, r.stderr.strip()))


def held_open(d, ckpt):
    rng = random.Random(7)
    v1 = bytes(rng.getrandbits(8) for _ in range(3 << 20))
    v2 = bytes(b ^ 0xFF for b in v1)
    v3 = bytes(b ^ 0x55 for b in v1)
    os.mkdir(d)
    path = os.path.join(d, "w.bin")
    with open(path, "wb") as f:
        f.write(v1)
    fd = os.open(path, os.O_RDONLY)
    # Opened again after the commit through the inode it had before (as
    # /proc/self/fd does): the read side opens it, with a handle to free.
    opath = os.open(path, os.O_PATH)
    try:
        commit(ckpt, d)
        if read_all(fd, "a file open across its commit") != v1:
            fail("a file open across its commit reads what was written")
        ok("a file open across its commit reads what was written")
        again = os.open("/proc/self/fd/%d" % opath, os.O_RDONLY)
        got = read_all(again, "its inode opened again after the commit")
        os.close(again)
        if got != v1:
            fail("its inode opened again after the commit reads the same")
        ok("its inode opened again after the commit reads the same")
        # A packed file opened for writing reopens the checkpoint (a
        # forwarded handle), held open across that generation's commit.
        w2 = os.open(path, os.O_RDWR)
        os.pwrite(w2, v2, 0)
        commit(ckpt, d)
        with open(path, "rb") as f:
            if f.read() != v2:
                fail("the new generation reads as written")
        ok("the new generation reads as written")
        with open(path, "r+b") as f:  # a third generation
            f.write(v3)
        commit(ckpt, d)
        if read_all(fd, "the file open since before the first commit") != v1:
            fail("the file open since before the first commit still reads that generation")
        ok("the file open since before the first commit still reads that generation")
        got = read_all(w2, "the file opened for writing, across its commit")
        os.close(w2)
        if got != v2:
            fail("the file opened for writing reads the generation it wrote")
        ok("the file opened for writing reads the generation it wrote")
    finally:
        os.close(fd)
        os.close(opath)


def main(argv):
    if len(argv) < 2:
        fail(__doc__)
    cmd, args = argv[1], argv[2:]
    if cmd == "save":
        save(args[0], args[1], int(args[2]))
    elif cmd == "verify":
        verify(args[0], args[1], int(args[2]))
    elif cmd == "random-ops":
        random_ops(args[0], args[1], int(args[2]), int(args[3]))
    elif cmd == "same-tree":
        same_tree(args[0], args[1], packed="--packed" in args[2:])
    elif cmd == "crash-writer":
        crash_writer(args[0], args[1], int(args[2]))
    elif cmd == "crash-check":
        crash_check(args[0], args[1], int(args[2]))
    elif cmd == "errno-of":
        errno_of(*args[:3])
    elif cmd == "same-inodes":
        same_inodes(args)
    elif cmd == "held-open":
        held_open(args[0], args[1])
    else:
        fail("unknown command " + cmd)


if __name__ == "__main__":
    main(sys.argv)
