#!/usr/bin/env python3
"""Writes GGUF files with the real writer (PyPI gguf's GGUFWriter) for
tests/unit/test_gguf_format.c, and a manifest of what each holds.

Usage: gen_gguf_fixtures.py OUTDIR

OUTDIR/manifest.tsv, one tab-separated line per fact:
  file    NAME
  tensor  NAME  DTYPE  D0,D1,...  SHA256   (numpy's C-order bytes and shape)
  region  DTYPE  NBYTES  SHA256            (a quantized tensor's raw blocks)
Each tensor/region line belongs to the file line above it. Shapes are
numpy's (the C order the parser must give back, GGUF's ne reversed).
"""
import hashlib
import os
import sys

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import GGML_QUANT_SIZES, GGUFWriter
from gguf import quants

out = sys.argv[1]
rng = np.random.default_rng(1234)
manifest = []


def sha(b):
    return hashlib.sha256(b).hexdigest()


def tensor(w, name, arr, dtype_name, raw_dtype=None):
    arr = np.ascontiguousarray(arr)
    w.add_tensor(name, arr, raw_dtype=raw_dtype)
    shape = ",".join(str(d) for d in arr.shape)
    manifest.append(f"tensor\t{name}\t{dtype_name}\t{shape}\t{sha(arr.tobytes())}")


def region(w, name, raw, qtype):
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    w.add_tensor(name, raw, raw_dtype=qtype)
    manifest.append(f"region\tGGML_{qtype.name}\t{raw.nbytes}\t{sha(raw.tobytes())}")


def write(name, fill, alignment=None):
    manifest.append(f"file\t{name}")
    w = GGUFWriter(os.path.join(out, name), "llama")
    if alignment is not None:
        w.add_custom_alignment(alignment)
    # Metadata of every value type, arrays of strings and nested arrays.
    w.add_name("fixture " + name)
    w.add_uint8("t.u8", 7)
    w.add_int8("t.i8", -7)
    w.add_uint16("t.u16", 700)
    w.add_int16("t.i16", -700)
    w.add_uint32("t.u32", 70000)
    w.add_int32("t.i32", -70000)
    w.add_float32("t.f32", 1.5)
    w.add_bool("t.bool", True)
    w.add_uint64("t.u64", 1 << 40)
    w.add_int64("t.i64", -(1 << 40))
    w.add_float64("t.f64", 2.25)
    w.add_array("t.strings", ["alpha", "", "gamma" * 40])
    w.add_array("t.ints", [1, 2, 3, 4])
    w.add_array("t.nested", [[1, 2], [3], [4, 5, 6]])
    w.add_array("t.nested_strings", [["a", "bc"], ["def"]])
    fill(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def plain(w):
    tensor(w, "tok_embd.weight", rng.standard_normal((6, 8), dtype=np.float32), "F32")
    tensor(w, "blk.0.attn_norm.weight", rng.standard_normal(8).astype(np.float16), "F16")
    bf16 = (rng.standard_normal((2, 3, 4), dtype=np.float32).view(np.uint32) >> 16)
    tensor(w, "blk.0.ffn.bf16", bf16.astype(np.uint16), "BF16", raw_dtype=Q.BF16)
    tensor(w, "four.dims", rng.standard_normal((2, 1, 3, 2), dtype=np.float32), "F32")
    tensor(w, "f64", rng.standard_normal(5), "F64")
    tensor(w, "i8", rng.integers(-100, 100, 9, dtype=np.int8), "I8")
    tensor(w, "i16", rng.integers(-100, 100, (3, 3), dtype=np.int16), "I16")
    tensor(w, "i32", rng.integers(-100, 100, 4, dtype=np.int32), "I32")
    tensor(w, "i64", rng.integers(-100, 100, 2, dtype=np.int64), "I64")
    data = rng.standard_normal((4, 64), dtype=np.float32)
    try:
        q8 = quants.quantize(data, Q.Q8_0)
    except Exception:  # no quantizer: raw bytes of the right size
        q8 = rng.integers(0, 256, (4, 2 * 34), dtype=np.uint8)
    region(w, "blk.0.q8", q8, Q.Q8_0)


def aligned(w):
    tensor(w, "a", rng.standard_normal(3, dtype=np.float32), "F32")
    tensor(w, "b", rng.standard_normal((5, 3), dtype=np.float32).astype(np.float16), "F16")
    tensor(w, "c", rng.standard_normal(7, dtype=np.float32), "F32")


def every_quant(w):
    # One tensor per quantized type, random bytes of GGUF's size for it.
    for qt, (blck, size) in sorted(GGML_QUANT_SIZES.items()):
        if blck == 1:
            continue
        rows = 2
        raw = rng.integers(0, 256, (rows, 2 * size), dtype=np.uint8)
        region(w, f"q.{qt.name}", raw, qt)


def empty(w):
    pass


write("plain.gguf", plain)
write("align64.gguf", aligned, alignment=64)
write("align1.gguf", aligned, alignment=1)
write("quants.gguf", every_quant)
write("empty.gguf", empty)

with open(os.path.join(out, "manifest.tsv"), "w") as f:
    f.write("\n".join(manifest) + "\n")
