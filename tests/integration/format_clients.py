"""Real clients of every container format ckptfs parses, for test_formats.sh.

Run with the pinned venv's python (scripts/venv.sh: torch 2.13, numpy,
safetensors, gguf, tensorizer). Each command prints "PASS name", "FAIL name"
(with indented details) and "SKIP name: reason" lines, which the shell test
tallies, and exits non-zero only when it could not run at all.

  write FMT DIR SEED         FMT's own client writes one checkpoint's files
                             into DIR (a plain directory or a checkpoint in
                             the writable mount). FMT: torch (a nested
                             state_dict, one bare tensor per file, tied
                             weights, a non-contiguous view, complex and
                             fnuz dtypes), tensorizer,
                             gguf (F32, F16, BF16 and Q8_0), dcp (dcp.save),
                             dcp_async (dcp.async_save), dcp_ranks (dcp.save
                             from 2 gloo ranks of DTensors on a device mesh,
                             Shard(0)), dcp_ranks_dim1 (the same, Shard(1)
                             for 2-d tensors), dcp_zlib (dcp.save with a
                             stream transform on every item, as torch's
                             ZStandard extension writes), safetensors, raw
                             (a headerless fp32 blob)
  hostile DIR SEED           malformed containers beside good files
  check FMT CKPT SRC SEED    CKPT is the committed checkpoint in the mount,
                             SRC the plain copy: containers, tensors/ and
                             the manifest against the sources, and FMT's
                             clients reading back through the mount
  check-hostile CKPT SRC     the hostile files stored opaque with a warning,
                             the good ones still tensors

DCP_REQUIRED=1 (test_formats.sh's default) makes missing DCP tensors a
failure; with 0 they are reported as "pending DCP parser".
"""
import hashlib
import json
import os
import struct
import sys
import warnings

warnings.filterwarnings("ignore")
os.environ.setdefault("TQDM_DISABLE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

DCP_REQUIRED = os.environ.get("DCP_REQUIRED", "0") == "1"
FAILED = 0


def report(ok, name, *details):
    global FAILED
    if ok:
        print("PASS " + name)
    else:
        FAILED += 1
        print("FAIL " + name)
        for d in details:
            print("     " + str(d)[:400])
    sys.stdout.flush()
    return ok


def skip(name, reason):
    print("SKIP %s: %s" % (name, reason))
    sys.stdout.flush()


def sha(b):
    return hashlib.sha256(b).hexdigest()


def file_sha(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def tensor_bytes(t):
    t = t.detach().contiguous().reshape(-1)
    return t.view(torch.uint8).numpy().tobytes() if t.numel() else b""


# --------------------------------------------------------------- sources

def model_sd(seed):
    """A small GPT-2-shaped state dict of several dtypes."""
    g = torch.Generator().manual_seed(seed)

    def w(*shape, dtype=torch.bfloat16):
        return (torch.randn(*shape, generator=g) * 0.02).to(dtype)

    sd = {
        "wte.weight": w(512, 64),
        "wpe.weight": w(128, 64),
        "h.0.ln_1.weight": w(64, dtype=torch.float32) + 1,
        "h.0.attn.c_attn.weight": w(64, 192),
        "h.0.attn.c_attn.bias": w(192, dtype=torch.float16),
        "h.0.mlp.c_fc.weight": w(64, 256, dtype=torch.float32),
        "h.0.mlp.c_proj.weight": w(256, 64),
        "ln_f.weight": w(64, dtype=torch.float32) + 1,
    }
    return sd


def write_torch(d, seed):
    sd = model_sd(seed)
    os.makedirs(os.path.join(d, "per_tensor"), exist_ok=True)
    optim = {
        "state": {i: {"step": torch.tensor(10.0), "exp_avg": torch.zeros_like(v, dtype=torch.float32) + 0.001 * i,
                      "exp_avg_sq": torch.full(v.shape, 1e-6 * (i + 1))}
                  for i, v in enumerate(list(sd.values())[:3])},
        "param_groups": [{"lr": 1e-4, "betas": (0.9, 0.95), "params": [0, 1, 2]}],
    }
    torch.save({"model": sd, "optim": optim, "step": 1000, "note": "train"},
               os.path.join(d, "state_dict.pt"))
    # The 002 flow: one bare tensor per file, named after the file.
    for name, t in sd.items():
        torch.save(t, os.path.join(d, "per_tensor", name + ".pt"))
    # Tied weights: two names over one storage.
    tied = {"wte.weight": sd["wte.weight"].clone()}
    tied["lm_head.weight"] = tied["wte.weight"]
    tied["ln_f.weight"] = sd["ln_f.weight"]
    torch.save(tied, os.path.join(d, "tied.pt"))
    # A non-contiguous view beside contiguous ones of the same storage.
    base = sd["h.0.mlp.c_fc.weight"].clone()
    torch.save({"transposed": base.t(), "rows": base[8:16], "base": base},
               os.path.join(d, "views.pt"))
    # dtypes a pack has no element type for, each in a storage of its own:
    # a legacy typed storage (complex64) and untyped ones that
    # _rebuild_tensor_v3 gives the dtype (complex32, float8_e4m3fnuz).
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(8, 4, generator=g)
    torch.save({"c64": torch.complex(x, -x), "c32": torch.complex(x, x).to(torch.complex32),
                "fnuz": x.to(torch.float8_e4m3fnuz), "f32": x}, os.path.join(d, "dtypes.pt"))


def write_tensorizer(d, seed):
    from tensorizer import TensorSerializer
    sd = model_sd(seed)
    s = TensorSerializer(os.path.join(d, "model.tensors"))
    s.write_state_dict(sd)
    s.close()


def gguf_arrays(seed):
    rng = np.random.default_rng(seed)
    f32 = (rng.standard_normal((64, 96)) * 0.02).astype(np.float32)
    f16 = (rng.standard_normal((32, 64)) * 0.02).astype(np.float16)
    bf16 = torch.from_numpy((rng.standard_normal((48, 64)) * 0.02).astype(np.float32)).to(torch.bfloat16)
    q = (rng.standard_normal((32, 128)) * 0.02).astype(np.float32)
    return f32, f16, bf16.view(torch.int16).numpy().view(np.uint16), q


def write_gguf(d, seed):
    import gguf
    from gguf import quants
    f32, f16, bf16_bits, q = gguf_arrays(seed)
    w = gguf.GGUFWriter(os.path.join(d, "model.gguf"), "gpt2")
    w.add_block_count(1)
    w.add_context_length(128)
    w.add_tensor("token_embd.weight", f32)
    w.add_tensor("blk.0.attn_norm.weight", f16)
    w.add_tensor("blk.0.ffn_up.weight", bf16_bits, raw_dtype=gguf.GGMLQuantizationType.BF16)
    w.add_tensor("blk.0.ffn_down.weight", quants.quantize(q, gguf.GGMLQuantizationType.Q8_0),
                 raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_dcp(d, seed, use_async):
    import torch.distributed.checkpoint as dcp
    sd = {k: v.clone() for k, v in model_sd(seed).items()}
    if use_async:
        fut = dcp.async_save(sd, checkpoint_id=d)
        for v in sd.values():  # training goes on: the save has its own copy
            v.mul_(3)
        fut.result()
    else:
        dcp.save(sd, checkpoint_id=d)


def zlib_extension():
    """A DCP stream transform as torch's ZStandard is one (every item
    compressed, "transform_descriptors" in .metadata), on the stdlib's zlib:
    the venv has neither zstandard nor pyzstd. Returns the extension class
    and a registry that reads it back."""
    import io
    import zlib
    from torch.distributed.checkpoint._extension import ExtensionRegistry, StreamTransformExtension

    class Zlib(StreamTransformExtension):
        @staticmethod
        def registry_name():
            return "stream.zlib@ckptfs-test"

        @staticmethod
        def from_descriptor(version):
            return Zlib()

        def get_descriptor(self):
            return self.registry_name() + "/1"

        def transform_to(self, output):
            class W(io.RawIOBase):
                def __init__(self):
                    self.z = zlib.compressobj()

                def writable(self):
                    return True

                def write(self, b):
                    output.write(self.z.compress(bytes(b)))
                    return len(b)

                def close(self):
                    if not self.closed:
                        output.write(self.z.flush())
                    super().close()
            return W()

        def transform_from(self, input):
            return io.BytesIO(zlib.decompress(input.read()))

    reg = ExtensionRegistry()
    reg.register(Zlib)
    return Zlib, reg


def write_dcp_zlib(d, seed):
    import torch.distributed.checkpoint as dcp
    Zlib, _ = zlib_extension()
    dcp.save(model_sd(seed), storage_writer=dcp.FileSystemWriter(d, _extensions=[Zlib()]))


def check_dcp_zlib(ckpt, seed):
    """Every item transformed: no tensor a loader could map, and the
    manifest's skipped list says so for each FQN; dcp.load still reads it."""
    import torch.distributed.checkpoint as dcp
    m = load_manifest(ckpt)
    want = model_sd(seed)
    report(not m["tensors"], "dcp_zlib: no tensors/ entry for compressed items", [t["name"] for t in m["tensors"]][:5])
    sk = {x["name"]: x for x in m.get("skipped", [])}
    bad = [k for k in want if k not in sk or "transformed" not in sk[k].get("reason", "")
           or not sk[k].get("file", "").endswith(".distcp")]
    report(not bad, "dcp_zlib: the manifest's skipped list names every FQN (%d) as transformed, with its .distcp"
           % len(want), "missing or wrong %s; skipped %s" % (bad[:5], m.get("skipped", [])[:3]))
    _, reg = zlib_extension()
    got = {k: torch.zeros_like(v) for k, v in want.items()}
    try:
        dcp.load(got, storage_reader=dcp.FileSystemReader(ckpt, _extension_registry=reg))
    except Exception as e:  # noqa: BLE001
        return report(False, "dcp_zlib: dcp.load through the mount", repr(e))
    bad = [k for k in want if not torch.equal(bits(got[k]), bits(want[k]))]
    report(not bad, "dcp_zlib: dcp.load through the mount equals the source (%d tensors)" % len(want), bad[:5])


def free_port():
    import socket
    with socket.socket() as so:
        so.bind(("127.0.0.1", 0))
        return so.getsockname()[1]


def _rank_main(rank, world, port, d, seed, dim):
    """One rank of a 2-rank save: gloo on CPU, every tensor a DTensor on a
    1-d mesh, Shard(dim) (Shard(0) for tensors of fewer dimensions)."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    dist.init_process_group("gloo", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    sd = {k: distribute_tensor(v, mesh, [Shard(dim if v.dim() > dim else 0)]) for k, v in model_sd(seed).items()}
    dcp.save(sd, checkpoint_id=d)
    dist.barrier()
    dist.destroy_process_group()


def write_dcp_ranks(d, seed, dim):
    import torch.multiprocessing as mp
    mp.spawn(_rank_main, args=(2, free_port(), d, seed, dim), nprocs=2, join=True)


def _rank_load(rank, world, port, d, seed, dim, out):
    """One rank of a 2-rank dcp.load: each rank asks for its own shard
    (Shard(dim) DTensors, as the save made them) and writes the names of the
    tensors whose local shard differs from the source's to out.RANK."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    dist.init_process_group("gloo", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    want = {k: distribute_tensor(v, mesh, [Shard(dim if v.dim() > dim else 0)]) for k, v in model_sd(seed).items()}
    got = {k: distribute_tensor(torch.zeros_like(v), mesh, [Shard(dim if v.dim() > dim else 0)])
           for k, v in model_sd(seed).items()}
    dcp.load(got, checkpoint_id=d)
    bad = [k for k in want if not torch.equal(bits(got[k].to_local()), bits(want[k].to_local()))]
    with open("%s.%d" % (out, rank), "w") as f:
        f.write(json.dumps({"bad": bad, "n": len(want)}))
    dist.barrier()
    dist.destroy_process_group()


def check_dcp_load_ranks(d, seed, dim, label):
    """2 gloo ranks dcp.load their shards through the mount."""
    import tempfile
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rank")
        try:
            mp.spawn(_rank_load, args=(2, free_port(), d, seed, dim, out), nprocs=2, join=True)
            res = [json.load(open("%s.%d" % (out, r))) for r in range(2)]
        except Exception as e:  # noqa: BLE001
            return report(False, label + ": dcp.load by 2 ranks through the mount", repr(e))
    bad = res[0]["bad"] + res[1]["bad"]
    report(not bad, label + ": dcp.load by 2 ranks through the mount: each rank's shards equal the source's (%d tensors)"
           % res[0]["n"], bad[:5])


def expected_dcp(src, seed, fmt):
    """{name: tensor} tensors/ must show for a DCP save, from torch's own
    reading of its .metadata: a tensor whose chunks are cut along dim 0
    only is one file under its FQN (assembled from its chunks); any other
    chunk is FQN@o0,o1,... with its slice of the tensor."""
    import torch.distributed.checkpoint as dcp
    g = model_sd(seed)
    if fmt == "dcp_async":
        return g  # the save's own copy, taken before training went on
    md = dcp.FileSystemReader(src).read_metadata()
    want = {}
    for fqn, t in g.items():
        chunks = md.state_dict_metadata[fqn].chunks
        if all(all(o == 0 for o in c.offsets[1:]) and list(c.sizes[1:]) == list(t.shape[1:]) for c in chunks):
            want[fqn] = t
            continue
        for c in chunks:
            sl = t[tuple(slice(o, o + n) for o, n in zip(c.offsets, c.sizes))]
            want[fqn + "@" + ",".join(str(o) for o in c.offsets)] = sl
    return want


def write_safetensors(d, seed):
    from safetensors.torch import save_file
    save_file(model_sd(seed), os.path.join(d, "model.safetensors"))


def write_raw(d, seed):
    with open(os.path.join(d, "weights.bin"), "wb") as f:
        for v in model_sd(seed).values():
            f.write(tensor_bytes(v.float()))


WRITERS = {
    "torch": write_torch,
    "tensorizer": write_tensorizer,
    "gguf": write_gguf,
    "dcp": lambda d, seed: write_dcp(d, seed, False),
    "dcp_async": lambda d, seed: write_dcp(d, seed, True),
    "dcp_ranks": lambda d, seed: write_dcp_ranks(d, seed, 0),
    "dcp_ranks_dim1": lambda d, seed: write_dcp_ranks(d, seed, 1),
    "dcp_zlib": write_dcp_zlib,
    "safetensors": write_safetensors,
    "raw": write_raw,
}


def write(fmt, d, seed):
    os.makedirs(d, exist_ok=True)
    WRITERS[fmt](d, seed)
    report(True, "%s: its client wrote into %s" % (fmt, d))


def write_hostile(d, seed):
    import gguf
    from safetensors.torch import save_file
    os.makedirs(d, exist_ok=True)

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    torch.save({"w": torch.ones(8, 8), "payload": Evil()}, os.path.join(d, "evil.pt"))
    torch.save({"w": torch.randn(64, 64)}, os.path.join(d, "whole.pt"))
    with open(os.path.join(d, "whole.pt"), "rb") as f:
        b = f.read()
    os.remove(os.path.join(d, "whole.pt"))
    with open(os.path.join(d, "truncated.pt"), "wb") as f:
        f.write(b[: len(b) // 2])
    w = gguf.GGUFWriter(os.path.join(d, "absurd.gguf"), "gpt2")
    w.add_tensor("x", np.ones((16, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with open(os.path.join(d, "absurd.gguf"), "r+b") as f:
        f.seek(8)  # magic, version, then the u64 tensor count
        f.write(struct.pack("<Q", 1 << 60))
    # The rest of the checkpoint: good files that must still be tensors.
    save_file({"good.a": torch.randn(32, 32)}, os.path.join(d, "good.safetensors"))
    torch.save({"good.b": torch.randn(16, 16).to(torch.bfloat16)}, os.path.join(d, "good.pt"))
    # The same tensor name as good.pt's, in another file: not a fault, its
    # tensor is named same_names.pt/good.b.
    torch.save({"good.b": torch.randn(4)}, os.path.join(d, "same_names.pt"))
    report(True, "hostile files written into " + os.path.basename(d.rstrip("/")))


# ------------------------------------------------- what the sources hold

def flatten(obj, prefix, out):
    if isinstance(obj, torch.Tensor):
        out[prefix] = obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            flatten(v, "%s.%s" % (prefix, k) if prefix else str(k), out)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            flatten(v, "%s.%d" % (prefix, i) if prefix else str(i), out)


def bare_name(rel):
    for ext in (".pt", ".pth", ".bin"):
        if rel.endswith(ext):
            return rel[: -len(ext)]
    return rel


def expected_tensors(src, rel, seed):
    """{name: tensor} a file's own client reads, and {name: why} of those
    that tensors/ must not show."""
    path = os.path.join(src, rel)
    want, absent = {}, {}
    if rel.endswith(".pt"):
        obj = torch.load(path, map_location="cpu", weights_only=True)
        flat = {}
        flatten(obj, bare_name(rel) if isinstance(obj, torch.Tensor) else "", flat)
        for k, v in flat.items():
            if v.dtype not in PACK_DTYPES:
                # the reason names it: torch.complex32, or a legacy
                # storage class (torch.ComplexFloatStorage)
                absent[k] = "dtype:" + LEGACY_STORAGE.get(v.dtype, str(v.dtype))
            elif v.is_contiguous():
                want[k] = v
            else:
                absent[k] = "non-contiguous"
    elif rel.endswith(".safetensors"):
        from safetensors.torch import load_file
        want = load_file(path)
    elif rel.endswith(".tensors"):
        from tensorizer import TensorDeserializer
        with TensorDeserializer(path, device="cpu") as de:
            want = {k: v.clone() for k, v in de.items()}
    elif rel.endswith(".gguf"):
        import gguf
        r = gguf.GGUFReader(path)
        for t in r.tensors:
            name = t.name
            if t.tensor_type.name in ("F32", "F16", "BF16"):
                arr = np.array(t.data)
                if t.tensor_type.name == "BF16":
                    want[name] = torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
                else:
                    want[name] = torch.from_numpy(arr)
            else:
                absent[name] = "quantized " + t.tensor_type.name
    return want, absent


PACK_DTYPES = {torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
               torch.int16, torch.int8, torch.uint8, torch.bool, torch.uint16, torch.uint32, torch.uint64,
               torch.float8_e4m3fn, torch.float8_e5m2}
LEGACY_STORAGE = {torch.complex64: "torch.ComplexFloatStorage", torch.complex128: "torch.ComplexDoubleStorage"}


CONTAINER = {".pt": "torch", ".safetensors": "safetensors", ".tensors": "tensorizer", ".gguf": "gguf",
             ".distcp": "dcp"}


def expected_container(rel):
    return CONTAINER.get(os.path.splitext(rel)[1], "")


def walk(root):
    out = []
    for dp, dns, fns in os.walk(root):
        dns.sort()
        for fn in sorted(fns):
            out.append(os.path.relpath(os.path.join(dp, fn), root))
    return sorted(out)


# ----------------------------------------------------- reading tensors/

TORCH_DTYPES = {str(getattr(torch, n)): getattr(torch, n) for n in (
    "float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool",
    "uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2")}


def read_tensor_file(path, entry):
    """tensors/NAME through torch.from_file and np.memmap, with the
    manifest's dtypes and shape."""
    shape = tuple(entry["shape"])
    numel = int(np.prod(shape)) if shape else 1
    dt = TORCH_DTYPES[entry["torch_dtype"]]
    if numel:
        via_torch = torch.from_file(path, shared=False, size=numel, dtype=dt).reshape(shape)
        via_np = np.memmap(path, dtype=np.dtype(entry["numpy_dtype"]), mode="r", shape=shape)
    else:
        via_torch = torch.empty(shape, dtype=dt)
        via_np = np.empty(shape, dtype=np.dtype(entry["numpy_dtype"]))
    return via_torch, via_np


def bits(t):
    """A tensor's values as integers of its width, so that equality is exact."""
    t = t.detach().contiguous()
    if t.dtype == torch.bool:
        return t.to(torch.uint8)
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.view(width)


def check_tensor(ckpt, entry, src_t, label):
    """manifest sha256 == recomputed sha256 of tensors/NAME == the source's
    bytes, and from_file/memmap values == the source's."""
    path = os.path.join(ckpt, entry["path"])
    src_t = src_t.detach()
    want = sha(tensor_bytes(src_t))
    got = file_sha(path)
    ok = report(entry["sha256"] == want and got == want, "%s: sha256 of tensors/%s (manifest and read)" % (label, entry["name"]),
                "manifest %s, read %s, source %s" % (entry["sha256"], got, want))
    if list(src_t.shape) != entry["shape"]:
        return report(False, "%s: shape of %s" % (label, entry["name"]), "%s vs %s" % (entry["shape"], list(src_t.shape)))
    if str(src_t.dtype) != entry["torch_dtype"]:
        return report(False, "%s: torch_dtype of %s" % (label, entry["name"]), "%s vs %s" % (entry["torch_dtype"], src_t.dtype))
    via_torch, via_np = read_tensor_file(path, entry)
    same_t = torch.equal(bits(via_torch), bits(src_t))
    np_want = bits(src_t).numpy()
    same_np = np_want.tobytes() == np.ascontiguousarray(via_np).tobytes() and via_np.shape == np_want.shape
    if not entry.get("numpy_raw_bits"):
        same_np = same_np and np.array_equal(np.asarray(via_np), src_t.numpy(), equal_nan=True)
    report(same_t and same_np, "%s: torch.from_file and np.memmap of tensors/%s equal the source" % (label, entry["name"]),
           "torch %s, numpy %s" % (same_t, same_np))
    return ok


def load_manifest(ckpt):
    with open(os.path.join(ckpt, "manifest.json")) as f:
        return json.load(f)


def check(fmt, ckpt, src, seed):
    m = load_manifest(ckpt)
    files = {f["path"]: f for f in m["files"]}
    rels = walk(src)
    report(sorted(files) == rels, "%s: the manifest lists every source file (%d)" % (fmt, len(rels)),
           sorted(set(files) ^ set(rels))[:5])

    # Every file byte-identical: the manifest's sha256, and reading it.
    bad = [r for r in rels if file_sha(os.path.join(src, r)) != file_sha(os.path.join(ckpt, r))
           or files.get(r, {}).get("sha256") != file_sha(os.path.join(src, r))]
    report(not bad, "%s: every file reads back byte-identical (sha256 of the mount and the manifest against the source)"
           % fmt, bad[:5])

    by_file = {}
    for t in m["tensors"]:
        by_file.setdefault(t["file"], {})[t["name"]] = t
    is_dcp = fmt.startswith("dcp")
    if fmt == "dcp_zlib":
        return check_dcp_zlib(ckpt, seed)
    dcp_on = DCP_REQUIRED or any(f.endswith(".distcp") for f in by_file)

    # Containers and warnings.
    for rel in rels:
        want = expected_container(rel)
        f = files.get(rel, {})
        if is_dcp and not dcp_on:
            skip("%s: container of %s" % (fmt, rel),
                 "pending DCP parser (today: %r, warning %r)" % (f.get("container"), f.get("warning")))
            continue
        if rel.endswith(".metadata"):
            want = f.get("container")  # DCP's metadata pickle: whatever the DCP parser calls it, without a warning
        report(f.get("container") == want and "warning" not in f,
               "%s: container of %s is %r, no warning" % (fmt, rel, want),
               "got %r, warning %r" % (f.get("container"), f.get("warning")))

    # Tensors file by file, against each file's own client.
    for rel in rels:
        if is_dcp:
            break
        want, absent = expected_tensors(src, rel, seed)
        got = by_file.get(rel, {})
        if not want and not got and not absent:
            continue
        report(sorted(got) == sorted(want), "%s: tensors/ shows each tensor its client reads (%d)" % (rel, len(want)),
               "extra %s, missing %s" % (sorted(set(got) - set(want))[:5], sorted(set(want) - set(got))[:5]))
        for name, t in want.items():
            if name in got:
                check_tensor(ckpt, got[name], t, rel)
        for name, why in absent.items():
            shown = name in got or os.path.exists(os.path.join(ckpt, "tensors", name))
            report(not shown, "%s: %s (%s) has no file under tensors/" % (rel, name, why))
            skipped = m.get("skipped", [])
            hit = [x for x in skipped if x.get("name") == name and x.get("file") == rel]
            reason = hit[0].get("reason", "") if hit else ""
            # an unsupported dtype: the reason names it, not another fault
            named = not why.startswith("dtype:") or ("not supported" in reason and why[6:] in reason)
            report(bool(reason) and named, "%s: the manifest says why %s is skipped (%s)"
                   % (rel, name, reason or "-"), skipped[:3])

    if is_dcp:
        # tensors/FQN, assembled from the shards, and dcp.load through the mount.
        got = {}
        for r in rels:
            got.update(by_file.get(r, {}))
        for t in m["tensors"]:
            # assembled: no one file; its parts are the shards, in row order
            if t["file"] is None and all(x["file"] in rels for x in t.get("parts", [])):
                got[t["name"]] = t
                rows = [x["row"] for x in t["parts"]]
                report(rows == sorted(rows) and len(rows) > 1 and all(not x["name"] in got for x in t["parts"]),
                       "%s: %s is assembled from %d chunks in row order, not shown apart" % (fmt, t["name"], len(rows)),
                       t["parts"][:3])
        want = expected_dcp(src, seed, fmt)
        if not got and not DCP_REQUIRED:
            skip(fmt + ": tensors/ shows each tensor by its FQN",
                 "pending DCP parser (no tensors from the .distcp files yet)")
        else:
            report(sorted(got) == sorted(want), fmt + ": tensors/ shows each tensor by its FQN", "got %s" % sorted(got)[:8])
            for n, e in got.items():
                if n in want:
                    check_tensor(ckpt, e, want[n], fmt)
        check_dcp_load(ckpt, seed, fmt)
        if fmt in ("dcp_ranks", "dcp_ranks_dim1"):
            check_dcp_load_ranks(ckpt, seed, 0 if fmt == "dcp_ranks" else 1, fmt)
    else:
        CLIENTS[fmt](ckpt, src, seed)


def check_dcp_load(d, seed, label):
    import torch.distributed.checkpoint as dcp
    want = model_sd(seed)
    got = {k: torch.zeros_like(v) for k, v in want.items()}
    try:
        dcp.load(got, checkpoint_id=d)
    except Exception as e:  # noqa: BLE001
        return report(False, label + ": dcp.load through the mount", repr(e))
    bad = [k for k in want if not torch.equal(bits(got[k]), bits(want[k]))]
    report(not bad, label + ": dcp.load through the mount equals the source (%d tensors)" % len(want), bad[:5])


def client_torch(ckpt, src, seed):
    """torch.load of every .pt through the mount, plain and mmap."""
    for rel in walk(src):
        a = torch.load(os.path.join(src, rel), map_location="cpu", weights_only=True)
        fa = {}
        flatten(a, "x", fa)
        for mm in (False, True):
            b = torch.load(os.path.join(ckpt, rel), map_location="cpu", weights_only=True, mmap=mm)
            fb = {}
            flatten(b, "x", fb)
            same = sorted(fa) == sorted(fb) and all(
                torch.equal(bits(fa[k]), bits(fb[k])) and fa[k].stride() == fb[k].stride() for k in fa)
            if rel == "tied.pt":
                same = same and (fb["x.lm_head.weight"].untyped_storage().data_ptr()
                                 == fb["x.wte.weight"].untyped_storage().data_ptr())
            report(same, "torch: torch.load(mmap=%s) of %s through the mount equals the source" % (mm, rel))


def client_tensorizer(ckpt, src, seed):
    from tensorizer import TensorDeserializer
    want = model_sd(seed)
    for lazy in (False, True):
        with TensorDeserializer(os.path.join(ckpt, "model.tensors"), device="cpu", lazy_load=lazy) as de:
            got = {k: de[k].clone() for k in de.keys()}
        bad = [k for k in want if k not in got or not torch.equal(bits(got[k]), bits(want[k]))]
        report(not bad and len(got) == len(want),
               "tensorizer: TensorDeserializer(lazy_load=%s) through the mount equals the source" % lazy, bad)


def client_gguf(ckpt, src, seed):
    import mmap
    import gguf
    p_src, p_mnt = os.path.join(src, "model.gguf"), os.path.join(ckpt, "model.gguf")
    with open(p_mnt, "rb") as f, open(p_src, "rb") as g:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        same = mm[:] == g.read()
        mm.close()
    report(same, "gguf: mmap of model.gguf through the mount equals the source")
    ra, rb = gguf.GGUFReader(p_src), gguf.GGUFReader(p_mnt)
    same = [t.name for t in ra.tensors] == [t.name for t in rb.tensors] and all(
        np.asarray(x.data).tobytes() == np.asarray(y.data).tobytes() for x, y in zip(ra.tensors, rb.tensors))
    report(same, "gguf: GGUFReader (np.memmap) through the mount equals the source, the Q8_0 tensor included")


def client_safetensors(ckpt, src, seed):
    from safetensors import safe_open
    want = model_sd(seed)
    with safe_open(os.path.join(ckpt, "model.safetensors"), "pt") as f:
        same = sorted(f.keys()) == sorted(want) and all(torch.equal(bits(f.get_tensor(k)), bits(v)) for k, v in want.items())
    report(same, "safetensors: safe_open (mmap) through the mount equals the source")


def client_raw(ckpt, src, seed):
    raw = np.fromfile(os.path.join(ckpt, "weights.bin"), dtype=np.float32)
    ref = np.concatenate([v.float().reshape(-1).numpy() for v in model_sd(seed).values()])
    report(np.array_equal(raw, ref), "raw: the fp32 blob reads back through the mount")


CLIENTS = {"torch": client_torch, "tensorizer": client_tensorizer, "gguf": client_gguf,
           "safetensors": client_safetensors, "raw": client_raw}


def check_hostile(ckpt, src):
    m = load_manifest(ckpt)
    files = {f["path"]: f for f in m["files"]}
    faults = {"evil.pt": "posix.system", "truncated.pt": "zip", "absurd.gguf": "tensor count"}
    for rel, fault in faults.items():
        f = files.get(rel, {})
        w = f.get("warning", "")
        report(f.get("container") == "" and rel in w and fault in w,
               "manifest: %s stored opaque, its warning names the file and the fault (%s)" % (rel, fault),
               "container %r, warning %r" % (f.get("container"), w))
    bad = [r for r in walk(src) if file_sha(os.path.join(src, r)) != file_sha(os.path.join(ckpt, r))]
    report(not bad, "every hostile and good file reads back byte-identical", bad)
    names = {t["name"]: t for t in m["tensors"]}
    report(set(names) == {"good.a", "good.b", "same_names.pt/good.b"} and names["good.b"]["file"] == "good.pt"
           and names["same_names.pt/good.b"]["file"] == "same_names.pt",
           "the rest of the checkpoint still packs: good.safetensors and good.pt are tensors, "
           "and same_names.pt's good.b is same_names.pt/good.b", sorted(names))
    for rel, name in (("good.safetensors", "good.a"), ("good.pt", "good.b"), ("same_names.pt", "same_names.pt/good.b")):
        if name in names:
            if rel.endswith(".pt"):
                t = torch.load(os.path.join(src, rel), weights_only=True)[name.split("/")[-1]]
            else:
                from safetensors.torch import load_file
                t = load_file(os.path.join(src, rel))[name]
            check_tensor(ckpt, names[name], t, rel)


def main(argv):
    cmd = argv[1] if len(argv) > 1 else ""
    if cmd == "write":
        write(argv[2], argv[3], int(argv[4]))
    elif cmd == "hostile":
        write_hostile(argv[2], int(argv[3]))
    elif cmd == "check":
        check(argv[2], argv[3], argv[4], int(argv[5]))
    elif cmd == "check-hostile":
        check_hostile(argv[2], argv[3])
    else:
        print(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
