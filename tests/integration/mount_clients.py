#!/usr/bin/python3
"""Real clients of a ckptfs mount, for tests/integration/test_mount*.sh.

Every check compares what a client reads through the mount with the source
files the pack was made from, parsed here independently of libckpt. Each
command prints one "ok ..." line per check that held and exits 1 (after a
"FAIL ..." line) on the first that did not.

  make-data OUT            write the source tree the tests pack
  manifest CKPT SRC [PACK] manifest.json against the sources (and the pack)
  tensors CKPT SRC         np.memmap and np.fromfile of tensors/*
  npy CKPT SRC             np.load(mmap_mode='r') of packed .npy files
  torch-file CKPT SRC      torch.from_file(shared=False) of BF16 tensors
  torch-load CKPT SRC      torch.load of packed .pt files
  safetensors CKPT SRC     a packed .safetensors file read through mmap
  random-reads CKPT SRC N  N preads at random offsets and sizes
  concurrent CKPT SRC N    N processes reading tensors at once
  erofs CKPT               opening for writing fails with EROFS
  read-errno PATH OFF LEN  prints the errno of one pread (0: it worked)
"""
import errno
import hashlib
import json
import mmap
import multiprocessing
import os
import random
import struct
import sys

import numpy as np

from clients_common import fail, ok, write_safetensors

# Tensor names that are not usable path components, to check the escaping.
ODD_NAMES = ["a//b", "/lead", "trail/", "..", ".", "x%y", "ctl\x01c", "sub/./x",
             "deep/er/name", "sp ace"]
# Escaped paths the mount must show them at (see fs/common/name_escape.h).
ODD_PATHS = {"a//b": "a%2F/b", "/lead": "%2Flead", "trail/": "trail%2F",
             "..": "%2E%2E", ".": "%2E", "x%y": "x%25y", "ctl\x01c": "ctl%01c",
             "sub/./x": "sub/%2E/x", "deep/er/name": "deep/er/name", "sp ace": "sp ace"}

NUMPY_DTYPES = {"BF16": np.uint16, "F16": np.float16, "F32": np.float32, "F64": np.float64,
                "I8": np.int8, "U8": np.uint8, "I16": np.int16, "I32": np.int32,
                "I64": np.int64, "U16": np.uint16, "U32": np.uint32, "U64": np.uint64,
                "BOOL": np.bool_}


# ------------------------------------------------------------------ sources

def bf16_bytes(rng, shape):
    f32 = rng.standard_normal(shape).astype(np.float32)
    return (f32.view(np.uint32) >> 16).astype(np.uint16).tobytes()


def make_data(out):
    import torch
    rng = np.random.default_rng(20240601)
    os.makedirs(os.path.join(out, "sub", "dir"), exist_ok=True)
    os.makedirs(os.path.join(out, "pt"), exist_ok=True)
    os.makedirs(os.path.join(out, "tensors"), exist_ok=True)

    model = [
        ("embed.weight", "BF16", (512, 384), bf16_bytes(rng, (512, 384))),
        ("layers.0.attn.q", "F32", (256, 256),
         rng.standard_normal((256, 256)).astype(np.float32).tobytes()),
        ("layers.0.attn.k", "F16", (128, 96),
         rng.standard_normal((128, 96)).astype(np.float16).tobytes()),
        ("layers.0.norm", "BF16", (384,), bf16_bytes(rng, (384,))),
        ("scalar", "F32", (), np.float32(3.5).tobytes()),
        ("empty", "F32", (0, 4), b""),
    ]
    for i, name in enumerate(ODD_NAMES):
        model.append((name, "I32", (3, i + 1), np.arange(3 * (i + 1), dtype=np.int32).tobytes()))
    write_safetensors(os.path.join(out, "model.safetensors"), model)
    # Many chunks at 64K: for mmap, random reads and concurrent readers.
    write_safetensors(os.path.join(out, "big.safetensors"), [
        ("big.bf16", "BF16", (2048, 1536), bf16_bytes(rng, (2048, 1536))),
        ("big.f32", "F32", (512, 1024), rng.standard_normal((512, 1024)).astype(np.float32).tobytes()),
    ])
    np.save(os.path.join(out, "layer.npy"), rng.standard_normal((100, 333)).astype(np.float32))
    np.save(os.path.join(out, "ints.npy"), np.arange(70000, dtype=np.int64))
    np.save(os.path.join(out, "fortran.npy"), np.asfortranarray(rng.standard_normal((40, 30))))
    for i in range(3):
        torch.save(torch.from_numpy(rng.standard_normal((64, 48 + i)).astype(np.float32)),
                   os.path.join(out, "pt", "w%d.pt" % i))
    torch.save({"a": torch.arange(5000), "b": torch.ones(3, 3, dtype=torch.bfloat16)},
               os.path.join(out, "pt", "state.pt"))
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump({"hidden": 384, "layers": 1}, f)
    with open(os.path.join(out, "sub", "dir", "readme.txt"), "w") as f:
        f.write("hello from a packed checkpoint\n")
    open(os.path.join(out, "empty.txt"), "w").close()
    with open(os.path.join(out, "blob.bin"), "wb") as f:
        f.write(rng.integers(0, 256, 300000, dtype=np.uint8).tobytes())
    with open(os.path.join(out, "run.sh"), "w") as f:
        f.write("#!/bin/sh\necho hi\n")
    os.chmod(os.path.join(out, "run.sh"), 0o755)
    with open(os.path.join(out, "private.txt"), "w") as f:
        f.write("only the owner\n")
    os.chmod(os.path.join(out, "private.txt"), 0o600)
    # Packed files whose names ckptfs reserves: shown under .packed/.
    with open(os.path.join(out, "manifest.json"), "w") as f:
        f.write('{"packed": "manifest"}\n')
    with open(os.path.join(out, "tensors", "raw.bin"), "wb") as f:
        f.write(b"raw bytes under a reserved directory\n")
    ok("wrote sources to " + out)


def all_files(src):
    """The sources' paths, relative to src."""
    for root, _, files in os.walk(src):
        for fname in files:
            yield os.path.relpath(os.path.join(root, fname), src)


def source_tensors(src):
    """{name: (file, offset, nbytes, dtype, shape)} parsed from the sources."""
    found = {}
    for root, _, files in os.walk(src):
        for fname in files:
            path = os.path.join(root, fname)
            rel = os.path.relpath(path, src)
            if fname.endswith(".safetensors"):
                with open(path, "rb") as f:
                    n = struct.unpack("<Q", f.read(8))[0]
                    header = json.loads(f.read(n))
                for name, t in header.items():
                    if name == "__metadata__":
                        continue
                    start, end = t["data_offsets"]
                    found[name] = (rel, 8 + n + start, end - start, t["dtype"], t["shape"])
            elif fname.endswith(".npy"):
                arr = np.load(path, mmap_mode="r")
                if arr.flags.f_contiguous and not arr.flags.c_contiguous:
                    continue
                found[os.path.splitext(rel)[0]] = (rel, arr.offset, arr.nbytes, None, list(arr.shape))
    return found


TORCH_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64",
                "int64": "I64", "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8",
                "bool": "BOOL"}


def torch_tensors(src):
    """{name: (file, dtype, shape, bytes)} of the tensors in the sources'
    torch.save archives, as torch itself loads them: a bare tensor is named
    after its file, a dict's tensors by their dotted keys."""
    import torch
    found = {}

    def walk(obj, prefix, rel):
        if isinstance(obj, torch.Tensor):
            t = obj.contiguous()
            raw = (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy().tobytes()
            found[prefix] = (rel, TORCH_DTYPES[str(t.dtype)[6:]], list(t.shape), raw)
        elif isinstance(obj, dict):
            for k, v in obj.items():
                walk(v, "%s.%s" % (prefix, k) if prefix else str(k), rel)

    for rel in all_files(src):
        if rel.endswith(".pt"):
            obj = torch.load(os.path.join(src, rel))
            walk(obj, os.path.splitext(rel)[0] if isinstance(obj, torch.Tensor) else "", rel)
    return found


def check_torch_tensor(src, t, want):
    """A manifest tensor found in a torch.save archive: its recorded bytes in
    the source file are the tensor's bytes as torch loads them."""
    rel, dtype, shape, raw = want
    if (t["file"], t["dtype"], t["shape"], t["nbytes"]) != (rel, dtype, shape, len(raw)):
        fail("tensor %r: manifest says %s, torch says %s %s %s" % (t["name"], t, rel, dtype, shape))
    got = source_bytes(src, rel, t["offset"], t["nbytes"])
    if got != raw or t["sha256"] != hashlib.sha256(raw).hexdigest():
        fail("tensor %r: bytes at offset %d of %s are not torch's" % (t["name"], t["offset"], rel))
    return got


def source_bytes(src, rel, offset, nbytes):
    with open(os.path.join(src, rel), "rb") as f:
        f.seek(offset)
        return f.read(nbytes)


def load_manifest(ckpt):
    with open(os.path.join(ckpt, "manifest.json")) as f:
        return json.load(f)


# ------------------------------------------------------------------- checks

def check_manifest(ckpt, src, pack=None):
    m = load_manifest(ckpt)
    for key in ("format_version", "name", "cipher", "kdf", "chunk_size", "codec",
                "stored_bytes", "logical_bytes", "files", "tensors"):
        if key not in m:
            fail("manifest lacks %r" % key)
    if m["codec"] != ("bytegroup+zstd" if m["format_version"] >= 3 else "bytegroup+deflate"):
        fail("codec is %r" % m["codec"])
    if m["name"] != os.path.basename(os.path.normpath(ckpt)):
        fail("name is %r" % m["name"])
    if pack and m["stored_bytes"] != os.path.getsize(pack):
        fail("stored_bytes %d, the pack has %d" % (m["stored_bytes"], os.path.getsize(pack)))
    total = 0
    for f in m["files"]:
        data = open(os.path.join(src, f["path"]), "rb").read()
        total += len(data)
        if f["size"] != len(data) or f["sha256"] != hashlib.sha256(data).hexdigest():
            fail("manifest entry for %s is wrong" % f["path"])
        shown = f.get("mount_path", f["path"])
        if open(os.path.join(ckpt, shown), "rb").read() != data:
            fail("%s differs from its source" % shown)
    if total != m["logical_bytes"]:
        fail("logical_bytes %d, sources hold %d" % (m["logical_bytes"], total))
    ok("manifest files: %d" % len(m["files"]))
    truth = source_tensors(src)
    from_torch = torch_tensors(src)
    if sorted(t["name"] for t in m["tensors"]) != sorted(list(truth) + list(from_torch)):
        fail("tensor names differ: %s vs %s" % (sorted(t["name"] for t in m["tensors"]),
                                                sorted(list(truth) + list(from_torch))))
    for t in m["tensors"]:
        if t["name"] in from_torch:
            check_torch_tensor(src, t, from_torch[t["name"]])
            continue
        rel, off, nbytes, dtype, shape = truth[t["name"]]
        if (t["file"], t["offset"], t["nbytes"], t["shape"]) != (rel, off, nbytes, shape):
            fail("tensor %r: manifest says %s" % (t["name"], t))
        if dtype and t["dtype"] != dtype:
            fail("tensor %r: dtype %s, source says %s" % (t["name"], t["dtype"], dtype))
        raw = source_bytes(src, rel, off, nbytes)
        if t["sha256"] != hashlib.sha256(raw).hexdigest():
            fail("tensor %r: sha256 differs" % t["name"])
        if t["name"] in ODD_PATHS and t["path"] != "tensors/" + ODD_PATHS[t["name"]]:
            fail("tensor %r shown at %r, want tensors/%s" % (t["name"], t["path"], ODD_PATHS[t["name"]]))
    ok("manifest tensors: %d, odd names escaped" % len(m["tensors"]))


def tensor_views(ckpt, src):
    """(manifest entry, source bytes) for every tensor with a path."""
    truth = source_tensors(src)
    from_torch = torch_tensors(src)
    for t in load_manifest(ckpt)["tensors"]:
        if t["name"] in from_torch:
            yield t, check_torch_tensor(src, t, from_torch[t["name"]])
            continue
        rel, off, nbytes, _, _ = truth[t["name"]]
        yield t, source_bytes(src, rel, off, nbytes)


def check_tensors(ckpt, src):
    n = 0
    for t, raw in tensor_views(ckpt, src):
        path = os.path.join(ckpt, t["path"])
        if os.path.getsize(path) != t["nbytes"]:
            fail("%s: size %d, want %d" % (path, os.path.getsize(path), t["nbytes"]))
        dtype = NUMPY_DTYPES[t["dtype"]]
        shape = tuple(t["shape"])
        via_fromfile = np.fromfile(path, dtype=dtype).reshape(shape)
        if via_fromfile.tobytes() != raw:
            fail("np.fromfile of %s differs" % path)
        if t["nbytes"]:
            # np.memmap refuses empty files; the others map page by page.
            via_memmap = np.memmap(path, dtype=dtype, mode="r", shape=shape)
            if via_memmap.tobytes() != raw:
                fail("np.memmap of %s differs" % path)
            del via_memmap
        n += 1
    ok("np.memmap and np.fromfile of %d tensors" % n)


def check_npy(ckpt, src):
    n = 0
    for rel in all_files(src):
        if not rel.endswith(".npy"):
            continue
        want = np.load(os.path.join(src, rel))
        got = np.load(os.path.join(ckpt, rel), mmap_mode="r")
        if got.dtype != want.dtype or got.shape != want.shape or not np.array_equal(got, want):
            fail("np.load(mmap_mode='r') of %s differs" % rel)
        n += 1
    ok("np.load(mmap_mode='r') of %d .npy files" % n)


def check_torch_file(ckpt, src):
    import torch
    n = 0
    for t, raw in tensor_views(ckpt, src):
        if t["dtype"] != "BF16" or not t["nbytes"]:
            continue
        numel = t["nbytes"] // 2
        got = torch.from_file(os.path.join(ckpt, t["path"]), shared=False, size=numel,
                              dtype=torch.bfloat16)
        if got.view(torch.int16).numpy().tobytes() != raw:
            fail("torch.from_file of %s differs" % t["path"])
        n += 1
    if n == 0:
        fail("no BF16 tensor to read")
    ok("torch.from_file of %d BF16 tensors" % n)


def check_torch_load(ckpt, src):
    import torch
    n = 0
    for rel in all_files(src):
        if not rel.endswith(".pt"):
            continue
        want = torch.load(os.path.join(src, rel))
        got = torch.load(os.path.join(ckpt, rel))
        if isinstance(want, dict):
            same = want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
        else:
            same = torch.equal(want, got)
        if not same:
            fail("torch.load of %s differs" % rel)
        n += 1
    ok("torch.load of %d .pt files" % n)


def check_safetensors(ckpt, src):
    n = 0
    for rel in all_files(src):
        if not rel.endswith(".safetensors"):
            continue
        with open(os.path.join(ckpt, rel), "rb") as f, \
                mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            hlen = struct.unpack("<Q", mm[:8])[0]
            header = json.loads(mm[8:8 + hlen])
            source = open(os.path.join(src, rel), "rb").read()
            for name, t in header.items():
                if name == "__metadata__":
                    continue
                start, end = t["data_offsets"]
                a, b = 8 + hlen + start, 8 + hlen + end
                if mm[a:b] != source[a:b]:
                    fail("mmap of %s: tensor %r differs" % (rel, name))
                n += 1
    ok("mmap of .safetensors files: %d tensors" % n)


def shown_path(rel):
    top = rel.split("/")[0]
    return ".packed/" + rel if top in ("manifest.json", "tensors", ".packed") else rel


def check_random_reads(ckpt, src, count):
    rng = random.Random(7)
    files = [f for f in all_files(src) if os.path.getsize(os.path.join(src, f)) > 0]
    for _ in range(count):
        rel = rng.choice(files)
        data = open(os.path.join(src, rel), "rb").read()
        off = rng.randrange(len(data))
        size = rng.choice([1, 7, 4095, 4097, 65535, 65537, 200000])
        fd = os.open(os.path.join(ckpt, shown_path(rel)), os.O_RDONLY)
        try:
            got = os.pread(fd, size, off)
        finally:
            os.close(fd)
        if got != data[off:off + size]:
            fail("pread(%s, %d, %d) differs" % (rel, size, off))
    ok("%d random preads" % count)


def read_tensor_job(args):
    path, want_sha, rounds = args
    for _ in range(rounds):
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while True:
                block = f.read(1 << 17)
                if not block:
                    break
                h.update(block)
        if h.hexdigest() != want_sha:
            return "%s: sha256 differs" % path
    return None


def check_concurrent(ckpt, src, nproc):
    views = [(os.path.join(ckpt, t["path"]), t["sha256"])
             for t, _ in tensor_views(ckpt, src) if t["nbytes"] > 100000]
    if not views:
        fail("no large tensors to read")
    # Half the workers on the same tensor, the rest spread out.
    jobs = [(views[0][0], views[0][1], 2) for _ in range(nproc // 2)]
    jobs += [(p, s, 2) for p, s in (views * nproc)[:nproc - nproc // 2]]
    with multiprocessing.Pool(nproc) as pool:
        for err in pool.map(read_tensor_job, jobs):
            if err:
                fail(err)
    ok("%d processes reading %d tensors at once" % (nproc, len(views)))


def check_erofs(ckpt):
    targets = [os.path.join(ckpt, "config.json"), os.path.join(ckpt, "new-file"),
               os.path.join(ckpt, "manifest.json")]
    for path in targets:
        for mode in ("w", "a", "r+"):
            try:
                open(path, mode).close()
            except OSError as e:
                if e.errno != errno.EROFS and not (mode == "r+" and e.errno == errno.ENOENT):
                    fail("open(%s, %r): errno %d, want EROFS" % (path, mode, e.errno))
            else:
                fail("open(%s, %r) worked" % (path, mode))
    ok("opening for writing fails with EROFS")


def read_errno(path, off, length):
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as e:
        print(e.errno)
        return
    try:
        os.pread(fd, length, off)
        print(0)
    except OSError as e:
        print(e.errno)
    finally:
        os.close(fd)


def main(argv):
    if len(argv) < 2:
        print(__doc__)
        sys.exit(2)
    cmd, args = argv[1], argv[2:]
    if cmd == "make-data":
        make_data(args[0])
    elif cmd == "manifest":
        check_manifest(*args)
    elif cmd == "tensors":
        check_tensors(*args)
    elif cmd == "npy":
        check_npy(*args)
    elif cmd == "torch-file":
        check_torch_file(*args)
    elif cmd == "torch-load":
        check_torch_load(*args)
    elif cmd == "safetensors":
        check_safetensors(*args)
    elif cmd == "random-reads":
        check_random_reads(args[0], args[1], int(args[2]))
    elif cmd == "concurrent":
        check_concurrent(args[0], args[1], int(args[2]))
    elif cmd == "erofs":
        check_erofs(args[0])
    elif cmd == "read-errno":
        read_errno(args[0], int(args[1]), int(args[2]))
    else:
        print(__doc__)
        sys.exit(2)


if __name__ == "__main__":
    main(sys.argv)
