"""Writes real torch.save archives and what ckptfs must find in them.

Usage: python gen_torch_fixtures.py OUTDIR

Runs under whichever torch the interpreter has (the venv's torch 2.x, or
Debian's python3-torch 1.13) and writes into OUTDIR the .pt files and
OUTDIR/expect.tsv, one line per fact, tab-separated:

  T  file  name  dtype  shape  sha256   a tensor under tensors/: its safetensors
                                        dtype, shape "2,3" ("" for 0-d) and the
                                        sha256 of its C-order bytes
  S  file  name  reason                 a tensor found but skipped; reason is a
                                        fragment of the message
  N  file  count                        how many tensors the file presents
  V  torch-version

Exits 3 when torch cannot be imported, so the caller can skip plainly.
"""
import collections
import hashlib
import io
import os
import sys

try:
    import torch
except Exception as e:  # noqa: BLE001 - any import failure means "no torch"
    print(f"torch unavailable: {e}", file=sys.stderr)
    sys.exit(3)

DTYPES = {
    torch.float32: "F32", torch.float64: "F64", torch.float16: "F16",
    torch.bfloat16: "BF16", torch.int64: "I64", torch.int32: "I32",
    torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL",
}
for attr, name in [("float8_e4m3fn", "F8_E4M3"), ("float8_e5m2", "F8_E5M2"),
                   ("uint16", "U16"), ("uint32", "U32"), ("uint64", "U64")]:
    if hasattr(torch, attr):
        DTYPES[getattr(torch, attr)] = name


def raw(t):
    """The tensor's C-order bytes, as ckptfs must present them."""
    t = t.detach().contiguous().cpu()
    if t.dtype == torch.bool:
        return t.to(torch.uint8).numpy().tobytes()
    if t.element_size() == 2 and t.dtype != torch.int16:
        t = t.view(torch.int16)
    elif t.element_size() == 1 and t.dtype not in (torch.int8, torch.uint8):
        t = t.view(torch.uint8)
    elif t.dtype in (getattr(torch, "uint32", None), getattr(torch, "uint64", None)):
        t = t.view(torch.int32 if t.element_size() == 4 else torch.int64)
    return t.numpy().tobytes()


class Out:
    def __init__(self, outdir):
        self.dir = outdir
        self.lines = [f"V\t{torch.__version__}"]

    def save(self, fname, obj, tensors, skipped=()):
        """tensors: {name: tensor} presented; skipped: {name: reason}."""
        torch.save(obj, os.path.join(self.dir, fname))
        for name, t in tensors.items():
            shape = ",".join(str(d) for d in t.shape)
            digest = hashlib.sha256(raw(t)).hexdigest()
            self.lines.append(f"T\t{fname}\t{name}\t{DTYPES[t.dtype]}\t{shape}\t{digest}")
        for name, reason in dict(skipped).items():
            self.lines.append(f"S\t{fname}\t{name}\t{reason}")
        self.lines.append(f"N\t{fname}\t{len(tensors)}")

    def close(self):
        with open(os.path.join(self.dir, "expect.tsv"), "w") as f:
            f.write("\n".join(self.lines) + "\n")


def flat(prefix, obj, into):
    """Dotted names for the tensors in nested dicts/lists, as ckptfs names them."""
    if isinstance(obj, torch.Tensor):
        into[prefix] = obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            flat(f"{prefix}.{k}" if prefix else str(k), v, into)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            flat(f"{prefix}.{i}" if prefix else str(i), v, into)
    return into


def main():
    out = Out(sys.argv[1])
    torch.manual_seed(1234)

    # A state_dict of many dtypes.
    sd = collections.OrderedDict()
    sd["emb.weight"] = torch.randn(16, 8).to(torch.bfloat16)
    sd["fc.weight"] = torch.randn(3, 5)
    sd["fc.bias"] = torch.randn(7).half()
    sd["fc.double"] = torch.randn(2, 2).double()
    sd["steps"] = torch.arange(6, dtype=torch.int64) * 1000003
    sd["ids32"] = torch.arange(5, dtype=torch.int32) - 2
    sd["ids16"] = torch.arange(4, dtype=torch.int16) - 9
    sd["ids8"] = torch.arange(3, dtype=torch.int8) - 1
    sd["bytes"] = torch.arange(9, dtype=torch.uint8)
    sd["mask"] = torch.rand(2, 3) > 0.5
    sd["scalar"] = torch.tensor(2.5)
    sd["empty"] = torch.zeros(0, 3)
    out.save("state_dict.pt", sd, dict(sd))

    # A model and its optimizer, nested, with lists and a tuple.
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.LayerNorm(6),
                                torch.nn.Linear(6, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    nested = {"model": model.state_dict(), "optim": opt.state_dict(),
              "extra": [torch.randn(3), (torch.ones(2, 2, dtype=torch.int64), torch.randn(1))],
              "epoch": 3, "note": "hello"}
    out.save("nested.ckpt", nested, flat("", nested, {}))

    # An optimizer state_dict alone (int keys), as HF's optimizer.pt.
    ostate = opt.state_dict()
    out.save("optimizer.pt", ostate, flat("", ostate, {}))

    # One bare tensor per file, named after the file; a bare Parameter.
    w = torch.randn(4, 4).to(torch.bfloat16)
    out.save("layer0.weight.pt", w, {"layer0.weight": w})
    p = torch.nn.Parameter(torch.randn(5))
    out.save("head.bias.pth", p, {"head.bias": p})
    b = torch.arange(10, dtype=torch.int32)
    out.save("blob.bin", b, {"blob": b})

    # Tied weights: the same tensor under two names; and a second tensor
    # object over the same storage.
    emb = torch.randn(6, 4)
    tied = {"emb.weight": emb, "head.weight": emb, "emb.alias": emb.view(24)}
    out.save("tied.pt", tied, tied)

    # Views: a slice with a storage offset is contiguous; a transpose and a
    # column are not.
    x = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    views = {"base": x, "rows": x[1:3], "tail": x.view(24)[5:], "t": x.t(), "col": x[:, 1]}
    out.save("views.pt", views, {k: views[k] for k in ("base", "rows", "tail")},
             {"t": "non-contiguous", "col": "non-contiguous"})

    # A negated view is saved as its storage's bytes plus {'neg': True}
    # (torch.load negates them): not those bytes, so skipped. torch 1.13
    # drops the flag (it loads back its storage's bytes), so presented.
    if hasattr(torch, "_neg_view"):
        y = torch.arange(1, 7, dtype=torch.float32)
        neg = {"base": y, "neg": torch._neg_view(y)}
        buf = io.BytesIO()
        torch.save(neg, buf)
        buf.seek(0)
        back = torch.load(buf)["neg"]
        if torch.equal(back, neg["neg"]):
            out.save("negated.pt", neg, {"base": y}, {"neg": "negated"})
        else:
            out.save("negated.pt", neg, {"base": y, "neg": back})

    # Dtypes that torch >= 2.1 saves as untyped storages (_rebuild_tensor_v3).
    extra = {}
    for attr in ("float8_e4m3fn", "float8_e5m2", "uint16", "uint32", "uint64"):
        if hasattr(torch, attr):
            extra[attr] = (torch.arange(12) % 7).to(getattr(torch, attr)).reshape(3, 4)
    if extra:
        out.save("new_dtypes.pt", extra, extra)

    out.close()


if __name__ == "__main__":
    main()
