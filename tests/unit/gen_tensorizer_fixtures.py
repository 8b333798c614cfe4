#!/usr/bin/env python3
"""Writes tensorizer files with the real writer (PyPI tensorizer's
TensorSerializer) for tests/unit/test_tensorizer_format.c, and a manifest.

Usage: gen_tensorizer_fixtures.py OUTDIR [SMALLDIR]

OUTDIR/manifest.tsv, one tab-separated line per fact:
  file    NAME  OPAQUE   (OPAQUE 1: the parser must keep the file opaque)
  tensor  NAME  DTYPE  D0,D1,...  SHA256   (the tensor's C-order bytes)
  region  DTYPE  NBYTES  SHA256            (complex tensors: grouped floats)
Each tensor/region line belongs to the file line above it.

The writer reserves 256 KiB for its index, so every file is over 256 KiB.
With SMALLDIR, each file but module.tensors is also written there compacted: the
index shrunk to what it uses and every offset moved to match (the per-tensor
headers and their hashes do not depend on position). TensorDeserializer
reads each compacted file back identical before it is kept; these are the
fuzzer's seeds.
"""
import hashlib
import os
import struct
import sys

import torch
from tensorizer import DecryptionParams, EncryptionParams, TensorDeserializer, TensorSerializer

out = sys.argv[1]
small = sys.argv[2] if len(sys.argv) > 2 else None
torch.manual_seed(1234)
manifest = []


def sha(t):
    return hashlib.sha256(raw_bytes(t)).hexdigest()


def raw_bytes(t):
    t = t.detach().contiguous().reshape(-1)
    return t.view(torch.uint8).numpy().tobytes() if t.numel() else b""


def record(name, t, dtype):
    shape = ",".join(str(d) for d in t.shape)
    manifest.append(f"tensor\t{name}\t{dtype}\t{shape}\t{sha(t)}")


def plain_dict():
    sd = {
        "f32": torch.randn(3, 4),
        "bf16": torch.randn(5, 2).to(torch.bfloat16),
        "f16": torch.randn(7).to(torch.float16),
        "i64": torch.randint(-1000, 1000, (2, 3), dtype=torch.int64),
        "bool": torch.rand(9) > 0.5,
        "u8": torch.randint(0, 255, (4,), dtype=torch.uint8),
        "f8": torch.randn(6).to(torch.float8_e4m3fn),
        "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 3),
        "layer.with.dots": torch.randn(2, 2, 2),
    }
    names = {"f32": "F32", "bf16": "BF16", "f16": "F16", "i64": "I64", "bool": "BOOL",
             "u8": "U8", "f8": "F8_E4M3", "scalar": "F32", "empty": "F32",
             "layer.with.dots": "F32"}
    return sd, names


def write(name, sd, opaque=False, encryption=None, expect=None, regions=()):
    path = os.path.join(out, name)
    manifest.append(f"file\t{name}\t{1 if opaque else 0}")
    s = TensorSerializer(path, encryption=encryption)
    s.write_state_dict(sd)
    s.close()
    if not opaque:
        for tname, dtype in (expect or {}).items():
            record(tname, lookup(sd, tname), dtype)
        for dtype, t in regions:
            b = raw_bytes(t)
            manifest.append(f"region\t{dtype}\t{len(b)}\t{hashlib.sha256(b).hexdigest()}")
    return path


def lookup(sd, dotted):
    if dotted in sd:
        return sd[dotted]
    cur = sd
    for part in dotted.split("."):
        cur = cur[int(part)] if isinstance(cur, list) else cur[part]
    return cur


def compact(src, dst, sd, decryption=None):
    """Shrinks the reserved index of src into dst and checks dst reads back."""
    with open(src, "rb") as f:
        data = bytearray(f.read())
    version, = struct.unpack_from("<I", data, 5)
    flags = int.from_bytes(data[9:41], "little")
    count, = struct.unpack_from("<Q", data, 57)
    meta_len, = struct.unpack_from("<Q", data, 65)
    meta = 73
    pos, fixups = meta, []
    for _ in range(count):
        long_shape = False
        if flags & 2:
            v, = struct.unpack_from("<I", data, pos)
            long_shape = v >= 5
            pos += 4
        nlen, = struct.unpack_from("<H", data, pos)
        pos += 2 + nlen + 1
        dlen = data[pos]
        pos += 1 + dlen
        ndim = data[pos]
        pos += 1 + ndim * (8 if long_shape else 4)
        fixups.append(pos)
        pos += 24
    used = pos - meta
    delta = meta_len - used
    for at in fixups:
        h, d, n = struct.unpack_from("<QQQ", data, at)
        struct.pack_into("<QQQ", data, at, h - delta, d - delta, n)
    struct.pack_into("<Q", data, 65, used)
    del data[meta + used: meta + meta_len]
    with open(dst, "wb") as f:
        f.write(data)
    # Meta tensors load as zeros (the long one would be 16 GiB): skip them.
    hollow = {k for k, v in sd.items() if isinstance(v, torch.Tensor) and v.device.type == "meta"}
    back = TensorDeserializer(dst, device="cpu", verify_hash=True, encryption=decryption,
                              filter_func=lambda name: name not in hollow)
    tree = back.tree()

    def walk(orig, got, path):
        if isinstance(orig, torch.Tensor):
            if orig.device.type == "meta":
                return
            if raw_bytes(got) != raw_bytes(orig):
                raise SystemExit(f"compacted {dst}: tensor {path} differs")
        elif isinstance(orig, dict):
            for k, v in orig.items():
                if k not in hollow:
                    walk(v, got[k], f"{path}.{k}")
        else:
            for i, v in enumerate(orig):
                walk(v, got[i], f"{path}.{i}")

    walk(sd, tree, "")
    back.close()


files = []

sd, names = plain_dict()
sd["c64"] = torch.randn(3, dtype=torch.complex64)
files.append((write("plain.tensors", sd, expect=names, regions=[("F32", sd["c64"])]), sd))

nested = {"layers": [{"w": torch.randn(2, 3)}, {"w": torch.randn(4).to(torch.bfloat16)}],
          "head": {"bias": torch.randn(5, dtype=torch.float64)}}
files.append((write("nested.tensors", nested,
                    expect={"layers.0.w": "F32", "layers.1.w": "BF16", "head.bias": "F64"}),
              nested))

# Meta tensors have a shape and no data; one longer than 2^32 elements makes
# the writer use data version 5 with versioned index entries.
meta = {"real": torch.randn(4, 4), "hollow": torch.empty(3, 5, device="meta"),
        "long": torch.empty(1 << 32, 1, device="meta"), "after": torch.arange(6, dtype=torch.int32)}
files.append((write("meta.tensors", meta, expect={"real": "F32", "after": "I32"}), meta))

module = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))
path = os.path.join(out, "module.tensors")
manifest.append("file\tmodule.tensors\t0")
s = TensorSerializer(path)
s.write_module(module)
s.close()
for k, v in module.state_dict().items():
    record(k, v, "F32")
files.append((path, dict(module.state_dict())))

enc = {"secret": torch.randn(8, 8), "also": torch.randn(3).to(torch.bfloat16)}
enc_params = EncryptionParams.random()
enc_path = write("encrypted.tensors", enc, opaque=True, encryption=enc_params)

with open(os.path.join(out, "manifest.tsv"), "w") as f:
    f.write("\n".join(manifest) + "\n")

if small:
    os.makedirs(small, exist_ok=True)
    for path, sd in files:
        if os.path.basename(path) == "module.tensors":
            continue  # loaded into a module, not a mapping; the others suffice
        compact(path, os.path.join(small, os.path.basename(path)), sd)
    compact(enc_path, os.path.join(small, "encrypted.tensors"), enc,
            DecryptionParams.from_key(enc_params.key))
