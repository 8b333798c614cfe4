#!/usr/bin/python3
"""Checks a checkpoint written by ckpt-gen independently of the C code.

usage: check_gen.py OUTDIR [REFDIR]

Reads config.json, the safetensors file(s) (header parsed with json, data
with numpy) and tensors_npy/*.npy (with np.load), and checks names, shapes,
dtypes, the header layout, and the statistics of the values: N(0, 0.02) for
weights and biases, exact ones and zeros for layer norms. Where both formats
are present their values must agree.

REFDIR, if given, is an --dtype f32 run with the same seed and shape: the
values in OUTDIR must then be exactly the f32 values rounded to OUTDIR's
dtype (round to nearest even, as torch and numpy round).

Exits 0 when everything matches, 1 on any mismatch (each one printed), 2 on
usage errors. Uses Debian's python3-numpy; python3-torch is optional and,
when present, is the reference for bfloat16 rounding.
"""
import json
import math
import os
import struct
import sys

import numpy as np

STD = 0.02
N_POSITIONS = 1024
TORCH_DTYPES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}


class Checker:
    def __init__(self):
        self.problems = []

    def fail(self, what):
        self.problems.append(what)
        print("check_gen: " + what, file=sys.stderr)

    def expect(self, cond, what):
        if not cond:
            self.fail(what)
        return cond


def expected_tensors(cfg):
    """name -> (shape, init) for HF GPT-2, init in normal/ones/zeros."""
    d, v, n_layer = cfg["n_embd"], cfg["vocab_size"], cfg["n_layer"]
    t = {"wte.weight": ((v, d), "normal"), "wpe.weight": ((N_POSITIONS, d), "normal"),
         "ln_f.weight": ((d,), "ones"), "ln_f.bias": ((d,), "zeros")}
    for i in range(n_layer):
        p = "h.%d." % i
        t[p + "ln_1.weight"] = ((d,), "ones")
        t[p + "ln_1.bias"] = ((d,), "zeros")
        t[p + "attn.c_attn.weight"] = ((d, 3 * d), "normal")
        t[p + "attn.c_attn.bias"] = ((3 * d,), "normal")
        t[p + "attn.c_proj.weight"] = ((d, d), "normal")
        t[p + "attn.c_proj.bias"] = ((d,), "normal")
        t[p + "ln_2.weight"] = ((d,), "ones")
        t[p + "ln_2.bias"] = ((d,), "zeros")
        t[p + "mlp.c_fc.weight"] = ((d, 4 * d), "normal")
        t[p + "mlp.c_fc.bias"] = ((4 * d,), "normal")
        t[p + "mlp.c_proj.weight"] = ((4 * d, d), "normal")
        t[p + "mlp.c_proj.bias"] = ((d,), "normal")
    return t


def decode(raw, dtype):
    """Raw little-endian bytes of a safetensors dtype -> float32 array."""
    if dtype == "BF16":
        return (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32)
    if dtype == "F16":
        return np.frombuffer(raw, "<f2").astype(np.float32)
    return np.frombuffer(raw, "<f4").astype(np.float32, copy=False)


def check_values(ck, name, vals, init):
    n = vals.size
    if init == "ones":
        ck.expect(bool(np.all(vals == 1.0)), "%s: layer norm weight is not all ones" % name)
        return
    if init == "zeros":
        ck.expect(bool(np.all(vals == 0.0)), "%s: layer norm bias is not all zeros" % name)
        return
    v = vals.astype(np.float64)
    mean, std = float(v.mean()), float(v.std())
    # Sampling error of the mean is STD/sqrt(n) and of the std about
    # STD/sqrt(2n); allow six of each plus a little for dtype rounding.
    ck.expect(abs(mean) <= 6 * STD / math.sqrt(n) + 1e-5,
              "%s: mean %.6g is too far from 0 for %d values" % (name, mean, n))
    ck.expect(abs(std - STD) <= 6 * STD / math.sqrt(2 * n) + 2e-4,
              "%s: std %.6g is too far from %g for %d values" % (name, std, STD, n))
    if n >= 100000:
        # A normal puts 68.27% within one sigma; a uniform or a broken
        # Box-Muller would not.
        frac = float(np.mean(np.abs(v) < STD))
        ck.expect(abs(frac - 0.6827) < 0.01,
                  "%s: %.4f of values within one std, a normal has 0.6827" % (name, frac))


def read_safetensors(ck, path, want_dtype):
    """Validates one file's layout; returns {name: (dtype, shape, raw bytes)}."""
    size = os.path.getsize(path)
    data = np.memmap(path, dtype=np.uint8, mode="r")
    (n,) = struct.unpack("<Q", bytes(data[:8]))
    if not ck.expect(8 + n <= size, "%s: header length %d past end of file" % (path, n)):
        return {}
    header = json.loads(bytes(data[8:8 + n]).decode("utf-8"))
    ck.expect(header.pop("__metadata__", None) == {"format": "pt"},
              "%s: __metadata__ is not {\"format\": \"pt\"}" % path)
    ck.expect(n % 8 == 0, "%s: header length %d is not a multiple of 8" % (path, n))
    out = {}
    at = 0
    for name, info in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"]):
        begin, end = info["data_offsets"]
        shape = tuple(info["shape"])
        ck.expect(begin == at, "%s: %s starts at %d, not %d" % (path, name, begin, at))
        ck.expect(info["dtype"] == want_dtype,
                  "%s: %s is %s, config says %s" % (path, name, info["dtype"], want_dtype))
        esize = 4 if info["dtype"] == "F32" else 2
        ck.expect(end - begin == int(np.prod(shape, dtype=np.int64)) * esize,
                  "%s: %s holds %d bytes for shape %s" % (path, name, end - begin, shape))
        out[name] = (info["dtype"], shape, data[8 + n + begin:8 + n + end])
        at = end
    ck.expect(8 + n + at == size,
              "%s: tensors end at %d but the file is %d bytes" % (path, 8 + n + at, size))
    names = list(header)
    ck.expect(names == sorted(names), "%s: tensors are not in name order" % path)
    return out


def load_safetensors(ck, outdir, dtype):
    index_path = os.path.join(outdir, "model.safetensors.index.json")
    single = os.path.join(outdir, "model.safetensors")
    tensors = {}
    if os.path.exists(index_path):
        with open(index_path) as f:
            index = json.load(f)
        files = sorted(set(index["weight_map"].values()))
        for i, fname in enumerate(files):
            ck.expect(fname == "model-%05d-of-%05d.safetensors" % (i + 1, len(files)),
                      "unexpected shard name %s" % fname)
            got = read_safetensors(ck, os.path.join(outdir, fname), dtype)
            for name in got:
                ck.expect(index["weight_map"].get(name) == fname,
                          "index maps %s to %s, but it is in %s"
                          % (name, index["weight_map"].get(name), fname))
            tensors.update(got)
        total = sum(len(raw) for _, _, raw in tensors.values())
        ck.expect(index["metadata"]["total_size"] == total,
                  "index total_size %s, tensors hold %d" % (index["metadata"]["total_size"], total))
        ck.expect(set(index["weight_map"]) == set(tensors), "index and shards name different tensors")
        ck.expect(not os.path.exists(single), "both model.safetensors and shards present")
    elif os.path.exists(single):
        tensors = read_safetensors(ck, single, dtype)
    return tensors


def round_like(ref, dtype):
    """f32 reference values -> the raw bytes OUTDIR should hold."""
    if dtype == "F32":
        return ref.astype("<f4").tobytes()
    if dtype == "F16":
        return ref.astype("<f2").tobytes()
    try:
        import torch
        t = torch.from_numpy(np.array(ref, dtype=np.float32)).to(torch.bfloat16)
        return t.view(torch.int16).numpy().astype("<i2").tobytes()
    except ImportError:
        bits = np.array(ref, dtype=np.float32).view(np.uint32).astype(np.uint64)
        return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2").tobytes()


def main(argv):
    if len(argv) not in (2, 3):
        print("usage: check_gen.py OUTDIR [REFDIR]", file=sys.stderr)
        return 2
    outdir = argv[1]
    ck = Checker()
    with open(os.path.join(outdir, "config.json")) as f:
        cfg = json.load(f)
    ck.expect(cfg.get("model_type") == "gpt2", "config.json: model_type is not gpt2")
    ck.expect(cfg.get("n_embd", 0) % cfg.get("n_head", 1) == 0, "config.json: n_head does not divide n_embd")
    dtype = TORCH_DTYPES.get(cfg.get("torch_dtype"))
    if not ck.expect(dtype is not None, "config.json: torch_dtype %r" % cfg.get("torch_dtype")):
        return 1
    want = expected_tensors(cfg)

    st = load_safetensors(ck, outdir, dtype)
    npy_dir = os.path.join(outdir, "tensors_npy")
    has_npy = os.path.isdir(npy_dir)
    ck.expect(st or has_npy, "%s: neither safetensors nor tensors_npy found" % outdir)
    if st:
        ck.expect(set(st) == set(want), "safetensors tensors differ from GPT-2's: missing %s, extra %s"
                  % (sorted(set(want) - set(st))[:5], sorted(set(st) - set(want))[:5]))

    ref = None
    if len(argv) == 3:
        ref = load_safetensors(ck, argv[2], "F32")
        ck.expect(set(ref) == set(want), "REFDIR holds different tensors")

    first_values = {}
    for name, (shape, init) in sorted(want.items()):
        vals = None
        if name in st:
            _, sshape, raw = st[name]
            ck.expect(sshape == shape, "%s: shape %s, want %s" % (name, sshape, shape))
            vals = decode(raw, dtype)
            if ref is not None and name in ref:
                ck.expect(round_like(decode(ref[name][2], "F32"), dtype) == bytes(raw),
                          "%s: values are not the f32 reference rounded to %s" % (name, dtype))
        if has_npy:
            path = os.path.join(npy_dir, name + ".npy")
            if ck.expect(os.path.exists(path), "%s: missing" % path):
                arr = np.load(path, mmap_mode="r")
                ck.expect(arr.shape == shape, "%s: shape %s, want %s" % (path, arr.shape, shape))
                # numpy has no bfloat16: bf16 checkpoints carry float32 in npy.
                want_np = np.float16 if dtype == "F16" else np.float32
                ck.expect(arr.dtype == want_np and arr.dtype.byteorder in "<=|",
                          "%s: dtype %s, want %s" % (path, arr.dtype, np.dtype(want_np)))
                ck.expect(arr.flags["C_CONTIGUOUS"], "%s: not C order" % path)
                flat = np.asarray(arr, dtype=np.float32).reshape(-1)
                if vals is not None:
                    ck.expect(np.array_equal(flat, vals),
                              "%s: values differ from the safetensors tensor" % path)
                else:
                    vals = flat
        if vals is None:
            continue
        ck.expect(vals.size == int(np.prod(shape, dtype=np.int64)), "%s: wrong element count" % name)
        check_values(ck, name, vals, init)
        if init == "normal" and dtype == "F32" and vals.size >= 100:
            # Full-precision f32, not bf16 values widened: those would all
            # have zero low halves.
            low = np.asarray(vals).view(np.uint32) & 0xFFFF
            ck.expect(float(np.mean(low != 0)) > 0.9,
                      "%s: F32 values look like widened bf16" % name)
        if init == "normal":
            first_values[name] = bytes(np.asarray(vals[:16]).tobytes())

    # Each tensor has its own random stream: no two may start alike.
    ck.expect(len(set(first_values.values())) == len(first_values),
              "two tensors start with the same values: the per-tensor seeding is broken")

    if ck.problems:
        print("check_gen: %s: %d problems" % (outdir, len(ck.problems)), file=sys.stderr)
        return 1
    print("check_gen: %s ok (%d tensors, %s%s%s)" % (outdir, len(want), dtype,
          ", safetensors" if st else "", ", npy" if has_npy else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
