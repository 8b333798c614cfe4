#!/usr/bin/python3
"""Checks of the ckptfs Python package (python/) against a real mount, for
tests/integration/test_python.sh. Run with the interpreter under test; the
package must be importable by it (installed, or on PYTHONPATH).

  make-data OUT            write OUT/all (every dtype a manifest can hold)
                           and OUT/common (the dtypes every torch has)
  check CKPT SRC           ckptfs.open/.numpy/.torch/load_state_dict of a
                           mounted pack of SRC, against SRC parsed here
  write MNT PREFIX         status and commit on a writable mount, in
                           checkpoints named PREFIX...
  no-key CKPT              open() of a pack the mount has no key for
  plain [CHECK...]         the checks of PLAIN (all by default) on
                           checkpoint directories written by hand in a
                           temporary directory, no mount needed

Every check prints "ok ..."; the first that fails prints "FAIL ..." and
exits 1. What is compared is always the bit patterns: the sources are
parsed here, independently of ckptfs and libckpt.
"""
import errno
import hashlib
import json
import os
import struct
import sys
import time

import numpy as np

from clients_common import fail, ok, write_safetensors


def expect_raises(what, exc, fn, *args, contains=(), **kw):
    try:
        got = fn(*args, **kw)
    except exc as e:
        for text in contains:
            if text not in str(e):
                fail("%s: the %s says %r, without %r" % (what, type(e).__name__, str(e), text))
        ok("%s: %s: %s" % (what, type(e).__name__, e))
        return e
    except Exception as e:  # noqa: BLE001 - the wrong exception is the failure
        fail("%s: raised %s (%s), not %s" % (what, type(e).__name__, e, exc.__name__))
    fail("%s: returned %r instead of raising %s" % (what, got, exc.__name__))


# The reference tables, written out here rather than taken from the package.
NUMPY = {"BOOL": "|b1", "U8": "|u1", "I8": "|i1", "F8_E5M2": "|u1", "F8_E4M3": "|u1",
         "I16": "<i2", "U16": "<u2", "F16": "<f2", "BF16": "<u2", "I32": "<i4", "U32": "<u4",
         "F32": "<f4", "F64": "<f8", "I64": "<i8", "U64": "<u8"}
TORCH = {"BOOL": "bool", "U8": "uint8", "I8": "int8", "F8_E5M2": "float8_e5m2",
         "F8_E4M3": "float8_e4m3fn", "I16": "int16", "U16": "uint16", "F16": "float16",
         "BF16": "bfloat16", "I32": "int32", "U32": "uint32", "F32": "float32", "F64": "float64",
         "I64": "int64", "U64": "uint64"}
NPY_DESCR = {"|b1": "BOOL", "|i1": "I8", "|u1": "U8", "<i2": "I16", "<u2": "U16", "<f2": "F16",
             "<i4": "I32", "<u4": "U32", "<f4": "F32", "<i8": "I64", "<u8": "U64", "<f8": "F64"}
# Dtypes every torch (1.13 on Debian 12 included) has.
COMMON = ["F32", "F16", "BF16", "I64", "BOOL", "F64", "I32", "I16", "I8", "U8"]
# Names that are not usable path components: the manifest's path escapes them.
ODD_NAMES = ["a//b", "x%y", "sp ace", "ctl\x01c", "deep/er/name", ".."]
# Tensor names that clash in tensors/ (a file and a directory of one name).
CLASH_NAMES = ["clash", "clash/x"]
# The header metadata of every safetensors file written here; transformers'
# save_pretrained marks its files the same way.
PT_METADATA = {"format": "pt"}


# ------------------------------------------------------------------ sources

def values(rng, dtype, shape):
    """Raw little-endian bytes of a tensor: real values, no NaN (so that
    value comparisons are meaningful), the extremes of the integer types."""
    n = int(np.prod(shape, dtype=np.int64))
    if dtype == "BF16":
        f32 = rng.standard_normal(n).astype(np.float32)
        return (f32.view(np.uint32) >> 16).astype("<u2").tobytes()
    if dtype in ("F16", "F32", "F64"):
        return (rng.standard_normal(n) * 3).astype(NUMPY[dtype]).tobytes()
    if dtype == "F8_E4M3":  # every byte but the two NaNs (0x7F, 0xFF)
        pool = np.array([b for b in range(256) if b & 0x7F != 0x7F], dtype=np.uint8)
        return rng.choice(pool, n).astype(np.uint8).tobytes()
    if dtype == "F8_E5M2":  # every byte but the NaNs (exponent 11111, mantissa != 0)
        pool = np.array([b for b in range(256) if (b & 0x7C) != 0x7C or (b & 0x03) == 0], dtype=np.uint8)
        return rng.choice(pool, n).astype(np.uint8).tobytes()
    if dtype == "BOOL":
        return rng.integers(0, 2, n).astype(np.uint8).tobytes()
    info = np.iinfo(np.dtype(NUMPY[dtype]))
    a = rng.integers(info.min, info.max, n, dtype=np.dtype(NUMPY[dtype]), endpoint=True)
    if n >= 2:
        a[0], a[1] = info.min, info.max
    return a.astype(NUMPY[dtype]).tobytes()


def make_set(out, dtypes, rng):
    os.makedirs(os.path.join(out, "npy"), exist_ok=True)
    tensors = []
    for i, dt in enumerate(dtypes):
        shape = (3 + i, 7, 5)
        tensors.append(("t.%s" % dt.lower(), dt, shape, values(rng, dt, shape)))
    tensors.append(("scalar", "F32", (), np.float32(3.5).tobytes()))
    tensors.append(("empty", "F16", (0, 3), b""))
    tensors.append(("vector.bf16", "BF16", (4096,), values(rng, "BF16", (4096,))))
    for i, name in enumerate(ODD_NAMES):
        tensors.append((name, "I32", (2, i + 1), np.arange(2 * (i + 1), dtype="<i4").tobytes()))
    # One name is a directory of the other: one of them gets no tensors/
    # file ("path": null in the manifest) and is read from its file.
    for k, name in enumerate(CLASH_NAMES):
        tensors.append((name, "F32", (2, 3), (np.arange(6, dtype="<f4") + 10 * k).tobytes()))
    write_safetensors(os.path.join(out, "model.safetensors"), tensors[: len(tensors) // 2], PT_METADATA)
    write_safetensors(os.path.join(out, "model-2.safetensors"), tensors[len(tensors) // 2:], PT_METADATA)
    # numpy's own files, for the dtypes .npy can hold.
    for dt in dtypes:
        if dt in NPY_DESCR.values():
            raw = values(rng, dt, (6, 11))
            np.save(os.path.join(out, "npy", dt.lower() + ".npy"),
                    np.frombuffer(raw, dtype=NUMPY[dt]).reshape(6, 11))
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump({"dtypes": dtypes}, f)
    with open(os.path.join(out, "notes.txt"), "w") as f:
        f.write("not a tensor\n")


def make_data(out):
    rng = np.random.default_rng(17)
    make_set(os.path.join(out, "all"), list(NUMPY), rng)
    make_set(os.path.join(out, "common"), COMMON, rng)
    ok("wrote %s/all (%d dtypes) and %s/common (%d dtypes)" % (out, len(NUMPY), out, len(COMMON)))


def source_tensors(src):
    """{name: (dtype, shape, raw bytes, file)} parsed from the sources."""
    found = {}
    for root, _, files in os.walk(src):
        for fname in sorted(files):
            path = os.path.join(root, fname)
            rel = os.path.relpath(path, src)
            with open(path, "rb") as f:
                data = f.read()
            if fname.endswith(".safetensors"):
                n = struct.unpack("<Q", data[:8])[0]
                header = json.loads(data[8:8 + n])
                for name, t in header.items():
                    if name == "__metadata__":
                        continue
                    start, end = t["data_offsets"]
                    found[name] = (t["dtype"], tuple(t["shape"]), data[8 + n + start:8 + n + end], rel)
            elif fname.endswith(".npy"):
                a = np.load(path)
                found[os.path.splitext(rel)[0]] = (NPY_DESCR[a.dtype.str], a.shape, a.tobytes(), rel)
    return found


def source_files(src):
    out = {}
    for root, _, files in os.walk(src):
        for fname in files:
            path = os.path.join(root, fname)
            with open(path, "rb") as f:
                out[os.path.relpath(path, src)] = f.read()
    return out


# ------------------------------------------------------- reference decoding

def reference_values(dtype, raw, shape):
    """The values as float64 (floats) or the integers, decoded here."""
    if dtype == "BF16":
        u = np.frombuffer(raw, "<u2")
        return np.array([struct.unpack("<f", b"\0\0" + int(x).to_bytes(2, "little"))[0] for x in u],
                        dtype=np.float64).reshape(shape)
    if dtype == "F8_E5M2":  # the top byte of a float16
        return (np.frombuffer(raw, np.uint8).astype("<u2") << 8).view("<f2").astype(np.float64).reshape(shape)
    if dtype == "F8_E4M3":  # 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities
        b = np.frombuffer(raw, np.uint8).astype(np.int64)
        sign = np.where(b & 0x80, -1.0, 1.0)
        e, m = (b >> 3) & 0xF, b & 0x7
        mag = np.where(e == 0, m / 8.0 * 2.0 ** -6, (1 + m / 8.0) * 2.0 ** (e - 7))
        return (sign * mag).reshape(shape)
    return np.frombuffer(raw, NUMPY[dtype]).reshape(shape)


def tensor_bytes(t):
    return t.reshape(-1).view(__import__("torch").uint8).numpy().tobytes()


# ------------------------------------------------------------------- checks

def check(ckpt, src):
    import ckptfs

    truth = source_tensors(src)
    ck = ckptfs.open(ckpt)
    with open(os.path.join(ckpt, "manifest.json")) as f:
        manifest = json.load(f)
    if ck.manifest != manifest:
        fail(".manifest differs from manifest.json")
    if list(ck) != [t["name"] for t in manifest["tensors"]]:
        fail("the mapping's order is not the manifest's")
    if set(ck) != set(truth) or len(ck) != len(truth):
        fail("tensor names: %s vs sources %s" % (sorted(ck), sorted(truth)))
    ok("open(): %d tensors, the sources' names, in manifest order" % len(ck))
    paths = {t["name"]: t["path"] for t in manifest["tensors"]}
    seen_dtypes, no_path = set(), []
    for name, (dtype, shape, raw, rel) in truth.items():
        info = ck[name]
        seen_dtypes.add(dtype)
        if (info.name, info.dtype, info.shape, info.nbytes, info.file) != (name, dtype, shape, len(raw), rel):
            fail("%r: TensorInfo %r, the source says %s %s %d bytes in %s"
                 % (name, info, dtype, shape, len(raw), rel))
        if info.sha256 != hashlib.sha256(raw).hexdigest():
            fail("%r: sha256 %s" % (name, info.sha256))
        want_filename = None if paths[name] is None else os.path.join(ckpt, paths[name])
        if info.path != paths[name] or info.filename != want_filename:
            fail("%r: path %r / filename %r, the manifest says %r" % (name, info.path, info.filename, paths[name]))
        if paths[name] is None:
            no_path.append(name)
        elif os.getxattr(info.filename, "user.ckptfs.dtype").decode() != dtype:
            fail("%r: the file's dtype xattr differs" % name)
        if not isinstance(info.offset, int):
            fail("%r: offset %r" % (name, info.offset))
        for field in ("numpy_dtype", "torch_dtype", "container"):
            if field in manifest["tensors"][list(ck).index(name)] and field not in info.extra:
                fail("%r: the manifest's %s is not in .extra" % (name, field))
        # numpy: the values, raw bits for BF16 and F8.
        if info.numpy_dtype != np.dtype(NUMPY[dtype]) or ckptfs.numpy_dtype(dtype) != np.dtype(NUMPY[dtype]):
            fail("%r: numpy dtype %s, want %s" % (name, info.numpy_dtype, NUMPY[dtype]))
        if info.raw_bits != (dtype in ("BF16", "F8_E4M3", "F8_E5M2")):
            fail("%r: raw_bits %r" % (name, info.raw_bits))
        a = ck.numpy(name)
        if a.dtype != np.dtype(NUMPY[dtype]) or a.shape != shape or a.tobytes() != raw:
            fail("%r: numpy() gives %s %s, bytes equal: %s" % (name, a.dtype, a.shape, a.tobytes() == raw))
        # Every array carries the manifest's dtype, a zero-byte one too.
        if not isinstance(a, np.memmap) or getattr(a, "ckptfs_dtype", None) != dtype:
            fail("%r: numpy() is a %s, ckptfs_dtype %r" % (name, type(a).__name__, getattr(a, "ckptfs_dtype", None)))
        if a.flags.writeable:
            fail("%r: the memmap is writable" % name)
        ref = reference_values(dtype, raw, shape)
        if dtype == "BF16":
            got = ckptfs.bfloat16_to_float32(a)
            if got.dtype != np.float32 or not np.array_equal(got, ref):
                fail("%r: bfloat16_to_float32 differs from the reference decoding" % name)
        elif not info.raw_bits and not np.array_equal(a, ref):
            fail("%r: numpy() values differ" % name)
        # copy-on-write: the array changes, the file does not.
        if len(raw):
            c = ck.numpy(name, mode="c")
            c.reshape(-1)[0] = c.reshape(-1)[-1] if len(raw) > c.itemsize else c.reshape(-1)[0]
            if ck.numpy(name).tobytes() != raw:
                fail("%r: mode='c' wrote through" % name)
    ok("numpy(): every tensor bit-identical to its source, dtypes %s" % " ".join(sorted(seen_dtypes)))
    # The clash leaves one name without a tensors/ file: read from its file.
    if len(no_path) != 1 or no_path[0] not in CLASH_NAMES:
        fail("tensors without a path: %r, want one of %r" % (no_path, CLASH_NAMES))
    ok("numpy(): %r, with no tensors/ file (\"path\": null), read from %s at offset %d"
       % (no_path[0], ck[no_path[0]].file, ck[no_path[0]].offset))
    expect_raises("numpy(mode='r+')", ValueError, ck.numpy, next(iter(ck)), mode="r+")
    expect_raises("ck['no such tensor']", KeyError, lambda: ck["no such tensor"])
    expect_raises("an unknown dtype name", ckptfs.UnsupportedDtypeError, ckptfs.numpy_dtype, "F128",
                  contains=("F128",))

    # The files, where the mount shows them.
    files = source_files(src)
    if set(ck.files) != set(files):
        fail(".files: %s vs %s" % (sorted(ck.files), sorted(files)))
    for path, data in files.items():
        fi = ck.files[path]
        with open(fi.filename, "rb") as f:
            if fi.size != len(data) or fi.sha256 != hashlib.sha256(data).hexdigest() or f.read() != data:
                fail(".files[%r] is wrong" % path)
    ok(".files: %d files, sizes, sha256 and contents right" % len(files))

    try:
        import torch
    except ImportError:
        ok("torch is not installed here: .torch() and load_state_dict not checked")
        return
    check_torch(ck, truth, torch, ckptfs)


def check_torch(ck, truth, torch, ckptfs):
    supported, unsupported = [], []
    for name, (dtype, shape, raw, _) in truth.items():
        want = getattr(torch, TORCH[dtype], None)
        if not isinstance(want, torch.dtype):
            e = expect_raises("torch %s: .torch(%r) of %s" % (torch.__version__, name, dtype),
                              ckptfs.UnsupportedDtypeError, ck.torch, name, contains=(dtype, TORCH[dtype]))
            if not isinstance(e, TypeError):
                fail("UnsupportedDtypeError is not a TypeError")
            unsupported.append(dtype)
            continue
        t = ck.torch(name)
        if t.dtype != want or tuple(t.shape) != shape or ck[name].torch_dtype() != want:
            fail("%r: .torch() is %s %s, want %s %s" % (name, t.dtype, tuple(t.shape), want, shape))
        if ckptfs.torch_dtype(dtype) != want:
            fail("ckptfs.torch_dtype(%r) is %s" % (dtype, ckptfs.torch_dtype(dtype)))
        if tensor_bytes(t) != raw:
            fail("%r: .torch() bytes differ from the source" % name)
        ref = reference_values(dtype, raw, shape)
        if t.is_floating_point():
            if not torch.equal(t.to(torch.float64), torch.from_numpy(np.array(ref, dtype=np.float64))):
                fail("%r: .torch() values differ from the reference decoding" % name)
        elif not torch.equal(t, torch.from_numpy(ref.copy())):
            fail("%r: .torch() values differ" % name)
        # shared=False: the tensor is writable and private.
        if t.numel():
            t.reshape(-1)[0] = t.reshape(-1)[-1]
            if tensor_bytes(ck.torch(name)) != raw:
                fail("%r: writing the tensor changed the file" % name)
        supported.append(dtype)
    ok("torch %s: .torch() bit-identical with the right dtype for %s"
       % (torch.__version__, " ".join(sorted(set(supported)))))
    if unsupported:
        ok("torch %s lacks %s: a clear UnsupportedDtypeError" % (torch.__version__, " ".join(sorted(set(unsupported)))))
        expect_raises("load_state_dict with a dtype torch %s lacks" % torch.__version__,
                      ckptfs.UnsupportedDtypeError, ckptfs.load_state_dict, ck.path)
        return
    t0 = time.monotonic()
    sd = ckptfs.load_state_dict(ck.path)
    if list(sd) != list(ck):
        fail("load_state_dict keys: %s" % list(sd))
    for name, (dtype, shape, raw, _) in truth.items():
        if tensor_bytes(sd[name]) != raw or sd[name].dtype != getattr(torch, TORCH[dtype]):
            fail("load_state_dict[%r] differs" % name)
    ok("load_state_dict: all %d tensors, bit-identical (%.2fs)" % (len(sd), time.monotonic() - t0))
    meta = ckptfs.load_state_dict(ck.path, device="meta")
    for name, t in meta.items():
        if t.device.type != "meta" or t.dtype != sd[name].dtype or t.shape != sd[name].shape:
            fail("load_state_dict(device='meta')[%r] is %s %s on %s" % (name, t.dtype, t.shape, t.device))
    ok("load_state_dict(device='meta'): %d tensors moved with .to(device)" % len(meta))


def check_write(mnt, prefix, back):
    import ckptfs

    # A checkpoint written into the mount, then committed.
    ck = os.path.join(mnt, prefix + "pyw")
    os.mkdir(ck)
    rng = np.random.default_rng(2)
    raw = values(rng, "BF16", (64, 32))
    write_safetensors(os.path.join(ck, "model.safetensors"), [("w", "BF16", (64, 32), raw)], PT_METADATA)
    np.save(os.path.join(ck, "b.npy"), np.arange(10, dtype=np.int64))
    st = ckptfs.status(ck)
    if st.state != "writing" or st.name != prefix + "pyw" or st.size <= 0:
        fail("status of a new checkpoint: %r" % st)
    ok("status(): %r" % st)
    every = ckptfs.status(mnt)
    if every.get(prefix + "pyw") != st or list(every) != sorted(every):
        fail("status(MOUNT): %r" % every)
    ok("status(MOUNT): %d checkpoints by name: %s" % (len(every), ", ".join("%s %s" % (n, s.state) for n, s in every.items())))
    expect_raises("open() of a checkpoint still writing", ckptfs.NotACheckpointError, ckptfs.open, ck,
                  contains=("writing",))
    st = ckptfs.commit(ck, wait=True)
    if st.state != "committed" or ckptfs.status(ck).state != "committed":
        fail("commit(wait=True) gave %r" % st)
    ok("commit(wait=True): %r" % st)
    c = ckptfs.open(ck)
    if c.numpy("w").tobytes() != raw or c.numpy("b").tolist() != list(range(10)):
        fail("the committed checkpoint reads back wrong")
    ok("the committed checkpoint reads back through open()")
    if ckptfs.commit(ck).state != "committed":
        fail("committing a committed checkpoint")
    ok("committing it again does nothing")

    # Without waiting, and with a timeout that ends first.
    big = os.path.join(mnt, prefix + "pybig")
    os.mkdir(big)
    with open(os.path.join(big, "blob.bin"), "wb") as f:
        f.write(np.random.default_rng(3).integers(0, 256, 48 << 20, dtype=np.uint8).tobytes())
    e = expect_raises("commit(timeout=0) while packing 48 MB", ckptfs.CommitTimeout, ckptfs.commit, big, timeout=0)
    if not isinstance(e, TimeoutError) or e.status.state != "packing":
        fail("the CommitTimeout's status: %r" % e.status)
    for _ in range(600):
        st = ckptfs.status(big)
        if st.state != "packing":
            break
        if st.progress is not None and not 0 <= st.progress <= 1:
            fail("progress %r" % st.progress)
        time.sleep(0.1)
    if st.state != "committed":
        fail("it went on packing to %r" % st)
    ok("and packing goes on to committed")
    small = os.path.join(mnt, prefix + "pynowait")
    os.mkdir(small)
    with open(os.path.join(small, "x.txt"), "w") as f:
        f.write("x\n")
    st = ckptfs.commit(small, wait=False)
    if st.state not in ("packing", "committed"):
        fail("commit(wait=False) gave %r" % st)
    ok("commit(wait=False): %s" % st.state)

    # Packing that fails: a file named like its pack already sits in the
    # backing directory (a damaged container would only be stored opaque).
    bad = os.path.join(mnt, prefix + "pybad")
    os.mkdir(bad)
    with open(os.path.join(bad, "x.bin"), "wb") as f:
        f.write(b"x" * 100)
    with open(os.path.join(back, prefix + "pybad.tpack"), "wb") as f:
        f.write(b"not a pack")
    e = expect_raises("commit() of a checkpoint whose packing fails", ckptfs.CommitError, ckptfs.commit, bad,
                      contains=("packing failed", "pybad.tpack", "already exists"))
    if e.state != "failed" or "already exists" not in e.error or e.path != bad:
        fail("CommitError fields: state %r error %r path %r" % (e.state, e.error, e.path))
    st = ckptfs.status(bad)
    if st.state != "failed" or st.error != e.error:
        fail("status after the failure: %r" % st)
    ok("status() shows it failed with the reason: %r" % st)

    # The daemon refuses a commit with EBUSY when the checkpoint was written
    # to while the commit waited for writes under way (a race a test cannot
    # time): the error says it is writing again, not "resource busy".
    real_setxattr = os.setxattr

    def busy_setxattr(*args, **kw):
        raise OSError(errno.EBUSY, os.strerror(errno.EBUSY))
    os.setxattr = busy_setxattr
    try:
        e = expect_raises("commit() refused with EBUSY", ckptfs.CommitError, ckptfs.commit, bad,
                          contains=("written to while committing", "writing again"))
    finally:
        os.setxattr = real_setxattr
    if e.state != "writing" or e.errno != errno.EBUSY:
        fail("its state %r and errno %r" % (e.state, e.errno))

    # Paths that are no checkpoint.
    expect_raises("commit(MOUNT)", ckptfs.NotACheckpointError, ckptfs.commit, mnt, contains=(mnt,))
    expect_raises("commit(a missing path)", ckptfs.NotACheckpointError, ckptfs.commit,
                  os.path.join(mnt, "nope"), contains=("no such checkpoint",))
    expect_raises("commit(a file)", ckptfs.NotACheckpointError, ckptfs.commit, os.path.join(ck, "b.npy"))
    expect_raises("status(/)", ckptfs.NotACheckpointError, ckptfs.status, "/", contains=("not a ckptfs mount",))
    expect_raises("status(a missing path)", ckptfs.NotACheckpointError, ckptfs.status, "/no/such/dir")
    expect_raises("open(MOUNT)", ckptfs.NotACheckpointError, ckptfs.open, mnt, contains=("not a checkpoint",))
    # A namespace (a directory of checkpoints) reads committed and has no
    # manifest: it was a bare CkptfsError naming a missing manifest.json.
    ns = os.path.join(mnt, prefix + "pyns")
    os.makedirs(os.path.join(ns, "step-1"))
    with open(os.path.join(ns, "step-1", "x.txt"), "w") as f:
        f.write("x\n")
    ckptfs.commit(ns, wait=True)
    expect_raises("open(a namespace)", ckptfs.NotACheckpointError, ckptfs.open, ns, contains=("a namespace",))
    e = expect_raises("open(a missing path)", ckptfs.NotACheckpointError, ckptfs.open, os.path.join(mnt, "nope"),
                      contains=("no such checkpoint",))
    if e.errno != errno.ENOENT or not isinstance(e, ckptfs.CkptfsError):
        fail("its errno %r" % e.errno)


def check_no_key(ckpt):
    import ckptfs

    st = ckptfs.status(ckpt)
    ok("status of a pack without its key: %r" % st)
    e = expect_raises("open() of a pack the mount has no key for", ckptfs.CkptfsError, ckptfs.open, ckpt,
                      contains=("key",))
    if e.errno != errno.EACCES:
        fail("errno %r, want EACCES" % e.errno)


# ------------------------------------------- hand-written checkpoint dirs

def tensor_entry(name, dtype, shape, raw, path=None, file="model.bin", offset=0, nbytes=None):
    """A manifest tensor entry; path None is "path": null (no tensors/ file)."""
    return {"name": name, "dtype": dtype, "shape": list(shape), "nbytes": len(raw) if nbytes is None else nbytes,
            "path": path, "file": file, "offset": offset, "sha256": hashlib.sha256(raw).hexdigest()}


def file_entry(path, data, **more):
    return dict({"path": path, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}, **more)


def plain_checkpoint(top, name, tensors, files=None, file_entries=None):
    """TOP/NAME with a manifest.json of the given entries and, from files
    (relative path -> bytes), the files; ckptfs.open() accepts any directory
    with a manifest, so no mount is needed."""
    d = os.path.join(top, name)
    os.makedirs(os.path.join(d, "tensors"))
    for rel, data in (files or {}).items():
        os.makedirs(os.path.dirname(os.path.join(d, rel)), exist_ok=True)
        with open(os.path.join(d, rel), "wb") as f:
            f.write(data)
    with open(os.path.join(d, "manifest.json"), "w") as f:
        json.dump({"name": name, "tensors": tensors, "files": file_entries or []}, f)
    return d


def plain_empty_dtype(top, ckptfs, torch):
    """A zero-byte tensor: its array carries ckptfs_dtype like any other."""
    ck = ckptfs.open(plain_checkpoint(top, "empty", [
        tensor_entry("e.f16", "F16", (0, 3), b"", path="tensors/e.f16"),
        tensor_entry("e.bf16", "BF16", (4, 0), b"", path="tensors/e.bf16"),
    ], {"tensors/e.f16": b"", "tensors/e.bf16": b""}))
    for name, dtype, npdt, shape in (("e.f16", "F16", "<f2", (0, 3)), ("e.bf16", "BF16", "<u2", (4, 0))):
        for mode in ("r", "c"):
            a = ck.numpy(name, mode=mode)
            if (a.shape, a.dtype, getattr(a, "ckptfs_dtype", None)) != (shape, np.dtype(npdt), dtype):
                fail("numpy(%r, mode=%r) of a zero-byte tensor: %s %s, ckptfs_dtype %r"
                     % (name, mode, a.shape, a.dtype, getattr(a, "ckptfs_dtype", None)))
            if a.flags.writeable != (mode == "c"):
                fail("numpy(%r, mode=%r): writeable %r" % (name, mode, a.flags.writeable))
    ok("numpy() of zero-byte tensors: empty arrays with ckptfs_dtype F16 / BF16 (mode r and c)")


def plain_zero_nbytes(top, ckptfs, torch):
    """nbytes 0 for a shape that needs 16 bytes: an error from numpy() and
    torch() alike; a genuinely empty [0, 4] tensor reads in both."""
    ck = ckptfs.open(plain_checkpoint(top, "zero", [
        tensor_entry("bad0", "F32", (2, 2), b"", path="tensors/bad0"),
        tensor_entry("empty", "F32", (0, 4), b"", path="tensors/empty"),
    ], {"tensors/bad0": b"", "tensors/empty": b""}))
    expect_raises("numpy() of nbytes 0 for F32 [2, 2]", ckptfs.CkptfsError, ck.numpy, "bad0",
                  contains=("bad0", "0 bytes", "needs 16"))
    a = ck.numpy("empty")
    if a.shape != (0, 4) or a.dtype != np.float32:
        fail("numpy() of an F32 [0, 4] tensor: %s %s" % (a.shape, a.dtype))
    ok("numpy() of an F32 [0, 4] tensor: an empty float32 array")
    if torch is not None:
        expect_raises("torch() of nbytes 0 for F32 [2, 2]", ckptfs.CkptfsError, ck.torch, "bad0",
                      contains=("bad0", "0 bytes", "needs 16"))
        t = ck.torch("empty")
        if tuple(t.shape) != (0, 4) or t.dtype != torch.float32:
            fail("torch() of an F32 [0, 4] tensor: %s %s" % (t.dtype, tuple(t.shape)))
        ok("torch() of an F32 [0, 4] tensor: an empty float32 tensor")


def plain_no_path(top, ckptfs, torch):
    """"path": null: the bytes are read from the packed file at the offset,
    where the mount shows the file (its "mount_path" when moved); a tensor
    with nowhere to read from is an error, and load_state_dict skips it
    with a warning."""
    import warnings

    clash = (np.arange(6, dtype="<f4") * 1.5).tobytes()
    moved = (np.array([1.0, -2.0, 0.5, 3.0], dtype="<f4").view("<u4") >> 16).astype("<u2").tobytes()
    model = b"H" * 16 + clash + b"T" * 8
    packed = b"P" * 8 + moved
    nopath = plain_checkpoint(top, "nopath", [
        tensor_entry("clash", "F32", (2, 3), clash, file="model.bin", offset=16),
        tensor_entry("clash/x", "I32", (3,), np.arange(3, dtype="<i4").tobytes(), path="tensors/clash/x",
                     file="model.bin", offset=0),
        tensor_entry("moved", "BF16", (2, 2), moved, file="tensors/w.bin", offset=8),
        tensor_entry("nothing", "F32", (0,), b"", file="model.bin", offset=40),
        # Nowhere to read from: assembled from parts, and a file the mount
        # does not show.
        dict(tensor_entry("assembled", "F32", (2,), b"\0" * 8, file=None, offset=None),
             parts=[{"name": "p0", "row": 0, "shape": [2], "nbytes": 8, "file": "model.bin", "offset": 0,
                     "sha256": hashlib.sha256(b"\0" * 8).hexdigest()}]),
        tensor_entry("hidden", "F32", (1,), b"\0" * 4, file="dup.bin", offset=0),
    ], {"model.bin": model, ".packed/tensors/w.bin": packed,
        "tensors/clash/x": np.arange(3, dtype="<i4").tobytes()},
        [file_entry("model.bin", model), file_entry("tensors/w.bin", packed, mount_path=".packed/tensors/w.bin"),
         file_entry("dup.bin", b"\0" * 4, mount_path=None)])
    ck = ckptfs.open(nopath)
    want = {"clash": (clash, np.float32, (2, 3)), "moved": (moved, np.uint16, (2, 2)),
            "nothing": (b"", np.float32, (0,))}
    for name, (raw, npdt, shape) in want.items():
        for mode in ("r", "c"):
            try:
                a = ck.numpy(name, mode=mode)
            except ckptfs.CkptfsError as e:
                fail("numpy(%r, mode=%r) with \"path\": null: %s" % (name, mode, e))
            if a.tobytes() != raw or a.dtype != npdt or a.shape != shape or a.ckptfs_dtype != ck[name].dtype:
                fail("numpy(%r, mode=%r) with \"path\": null: %s %s, bytes equal %s"
                     % (name, mode, a.dtype, a.shape, a.tobytes() == raw))
        if raw:
            c = ck.numpy(name, mode="c")
            c.reshape(-1)[0] = c.reshape(-1)[-1]
            if ck.numpy(name).tobytes() != raw:
                fail("numpy(%r, mode='c') wrote through" % name)
    ok("numpy() with \"path\": null: the bytes of the file at its offset (a moved file's mount_path followed)")
    for name, why in (("assembled", "assembled"), ("hidden", "dup.bin")):
        expect_raises("numpy(%r), with nowhere to read from" % name, ckptfs.CkptfsError, ck.numpy, name,
                      contains=(name, why))
    if torch is not None:
        for name, (raw, _, shape) in want.items():
            t = ck.torch(name)
            if tensor_bytes(t) != raw or tuple(t.shape) != shape or t.dtype != ck[name].torch_dtype():
                fail("torch(%r) with \"path\": null: %s %s" % (name, t.dtype, tuple(t.shape)))
            if t.numel():
                t.reshape(-1)[0] = t.reshape(-1)[-1]
                if tensor_bytes(ck.torch(name)) != raw or ck.numpy(name).tobytes() != raw:
                    fail("writing torch(%r) changed the file" % name)
        ok("torch() with \"path\": null: the bytes of the file at its offset, writes private")
        expect_raises("torch('assembled'), with nowhere to read from", ckptfs.CkptfsError, ck.torch, "assembled",
                      contains=("assembled",))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            sd = ckptfs.load_state_dict(nopath)
        said = [str(w.message) for w in caught]
        if list(sd) != ["clash", "clash/x", "moved", "nothing"] or tensor_bytes(sd["clash"]) != clash:
            fail("load_state_dict with \"path\": null entries: %r" % list(sd))
        if len(said) != 2 or "'assembled'" not in said[0] or "'hidden'" not in said[1]:
            fail("load_state_dict warned %r" % said)
        ok("load_state_dict: the null-path tensors read from their files; skipped with a warning: %s"
           % "; ".join(said))

    # A packed file shorter than offset + nbytes: an error, not a short read.
    ck = ckptfs.open(plain_checkpoint(top, "short", [
        tensor_entry("cut", "F32", (2, 3), clash, file="model.bin", offset=len(model) - 8),
    ], {"model.bin": model}, [file_entry("model.bin", model)]))
    expect_raises("numpy() of a tensor past the end of its file", ckptfs.CkptfsError, ck.numpy, "cut",
                  contains=("model.bin", "'cut'", "offset %d" % (len(model) - 8)))
    if torch is not None:
        expect_raises("torch() of a tensor past the end of its file", ckptfs.CkptfsError, ck.torch, "cut",
                      contains=("model.bin", "'cut'", "offset %d" % (len(model) - 8)))


def plain_missing_field(top, ckptfs, torch):
    """A manifest entry that lacks a field: CkptfsError naming the manifest
    and the field, not a bare KeyError."""
    for what, tensors, files in (
            ("a file entry without size", [], [{"path": "a.bin", "sha256": "0" * 64}]),
            ("a file entry without path", [], [{"size": 1, "sha256": "0" * 64}]),
            ("a file entry that is no object", [], ["a.bin"]),
            ("a tensor entry without nbytes", [{k: v for k, v in tensor_entry("t", "F32", (1,), b"\0" * 4).items()
                                               if k != "nbytes"}], []),
            ("a tensor entry that is no object", ["t"], [])):
        d = plain_checkpoint(top, "bad-%d" % len(os.listdir(top)), tensors, file_entries=files)
        field = what.split(" without ")[1] if " without " in what else "object"
        expect_raises("open() of %s" % what, ckptfs.CkptfsError, ckptfs.open, d,
                      contains=(os.path.join(d, "manifest.json"), field))


PLAIN = {"empty-dtype": plain_empty_dtype, "zero-nbytes": plain_zero_nbytes, "no-path": plain_no_path,
         "missing-field": plain_missing_field}


def check_plain(*which):
    """The checks of PLAIN named (all by default), in a temporary directory."""
    import shutil
    import tempfile

    import ckptfs

    try:
        import torch
    except ImportError:
        torch = None
    top = tempfile.mkdtemp(prefix="ckptfs-plain-")
    try:
        for name in which or PLAIN:
            PLAIN[name](top, ckptfs, torch)
    finally:
        shutil.rmtree(top)


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "make-data":
        make_data(*args)
    elif cmd == "check":
        check(*args)
    elif cmd == "write":
        check_write(*args)
    elif cmd == "no-key":
        check_no_key(*args)
    elif cmd == "plain":
        check_plain(*args)
    else:
        fail("unknown command %r" % cmd)


if __name__ == "__main__":
    main()
