"""Writes real PyTorch DCP checkpoints (torch.distributed.checkpoint) and
what ckptfs must find in their .distcp files.

Usage: python gen_dcp_fixtures.py OUTDIR

Writes, under OUTDIR, DCP directories saved by torch itself:
  single/    dcp.save in one process: a model and its Adam state nested
             under "model" and "optim", tensors of several dtypes, and
             bytes items (ints, strings, lists)
  async/     the same state saved with dcp.async_save
  ranks2/    dcp.save from 2 ranks (gloo on CPU, torch.multiprocessing)
             with DTensors sharded on dim 0, so tensors are chunked
  megatron/  Megatron-core's torch_dist layout: the same .distcp files and
             .metadata, plus metadata.json and common.pt (torch.save)
and OUTDIR/expect.tsv, one line per fact, tab-separated:

  T  dir  file  name  dtype  shape  sha256   a tensor chunk in dir/file: its name
                                             (FQN, or FQN@o0,o1,... for a chunk
                                             that is not the whole tensor), its
                                             safetensors dtype, its shape and the
                                             sha256 of its C-order bytes, taken
                                             from the tensor the generator made
  N  dir  file  count                        how many tensors the file presents
  V  torch-version

Exits 3 when torch (or torch.distributed) cannot be imported.
"""
import hashlib
import json
import os
import socket
import sys

try:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict
except Exception as e:  # noqa: BLE001 - any import failure means "no torch"
    print(f"torch unavailable: {e}", file=sys.stderr)
    sys.exit(3)

DTYPES = {
    torch.float32: "F32", torch.float64: "F64", torch.float16: "F16",
    torch.bfloat16: "BF16", torch.int64: "I64", torch.int32: "I32",
    torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL",
}


def raw(t):
    """The tensor's C-order bytes, as ckptfs must present them."""
    t = t.detach().contiguous().cpu()
    if t.dtype == torch.bool:
        return t.to(torch.uint8).numpy().tobytes()
    if t.element_size() == 2 and t.dtype != torch.int16:
        t = t.view(torch.int16)
    return t.numpy().tobytes()


def make_state(seed):
    """A nested state dict: model + Adam state, several dtypes, bytes items."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.LayerNorm(6),
                                torch.nn.Linear(6, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(3, 8)).sum().backward()
    opt.step()
    return {
        "model": model.state_dict(),
        "optim": opt.state_dict(),
        "extra": {
            "emb": torch.randn(16, 8).to(torch.bfloat16),
            "half": torch.randn(5, 3).half(),
            "ids": torch.arange(7, dtype=torch.int64) * 1000003,
            "scalar": torch.tensor(2.5),
        },
        "step": 7,
        "name": "hello",
        "sched": [1, 2, 3],
    }


def expect_whole(lines, d, state):
    """T/N lines for a single-process save: every tensor is one chunk."""
    flat, _ = flatten_state_dict(state)
    n = 0
    for fqn, v in flat.items():
        if isinstance(v, torch.Tensor):
            shape = ",".join(str(x) for x in v.shape)
            lines.append(f"T\t{d}\t__0_0.distcp\t{fqn}\t{DTYPES[v.dtype]}\t{shape}\t"
                         f"{hashlib.sha256(raw(v)).hexdigest()}")
            n += 1
    lines.append(f"N\t{d}\t__0_0.distcp\t{n}")


def global_tensors():
    torch.manual_seed(99)
    return {
        "w": torch.randn(8, 6),                         # 2 chunks of 4 rows
        "emb": torch.randn(5, 4).to(torch.bfloat16),    # uneven: 3 + 2 rows
        "v": torch.arange(10, dtype=torch.int64),       # 1-d: 5 + 5
        "h": torch.randn(4, 2, 3).half(),               # 3-d
    }


def rank_main(rank, world, port, outdir):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    mesh = init_device_mesh("cpu", (world,))
    g = global_tensors()
    sd = {"model": {k: distribute_tensor(v, mesh, [Shard(0)]) for k, v in g.items()},
          "plain": torch.arange(6, dtype=torch.int32).reshape(2, 3),  # replicated
          "epoch": 3}
    dcp.save(sd, checkpoint_id=outdir)
    dist.barrier()
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def expect_ranks(lines, root, d):
    """T/N lines for the 2-rank save: each chunk's bytes are the slice of the
    global tensor the generator made; which file holds it is torch's choice
    (replicated tensors are balanced over the ranks), read back with torch's
    own FileSystemReader."""
    g = {f"model.{k}": v for k, v in global_tensors().items()}
    g["plain"] = torch.arange(6, dtype=torch.int32).reshape(2, 3)
    md = dcp.FileSystemReader(os.path.join(root, d)).read_metadata()
    per = {}
    for idx, info in md.storage_data.items():
        if idx.fqn not in g:
            continue  # a bytes item
        t = g[idx.fqn]
        chunk = next(c for c in md.state_dict_metadata[idx.fqn].chunks
                     if tuple(c.offsets) == tuple(idx.offset))
        c = t[tuple(slice(o, o + n) for o, n in zip(chunk.offsets, chunk.sizes))]
        whole = tuple(chunk.sizes) == tuple(t.shape)
        name = idx.fqn if whole else idx.fqn + "@" + ",".join(str(o) for o in chunk.offsets)
        shape = ",".join(str(x) for x in c.shape)
        per.setdefault(info.relative_path, []).append(
            f"T\t{d}\t{info.relative_path}\t{name}\t{DTYPES[t.dtype]}\t{shape}\t"
            f"{hashlib.sha256(raw(c)).hexdigest()}")
    for f, items in sorted(per.items()):
        lines.extend(items)
        lines.append(f"N\t{d}\t{f}\t{len(items)}")
    # every chunk of the sharded tensors was found, on both ranks
    assert sum(len(v) for v in per.values()) == 9, per
    assert len(per) == 2, per


def main():
    out = sys.argv[1]
    lines = [f"V\t{torch.__version__}"]

    state = make_state(1234)
    dcp.save(state, checkpoint_id=os.path.join(out, "single"))
    expect_whole(lines, "single", state)

    state = make_state(4321)
    dcp.async_save(state, checkpoint_id=os.path.join(out, "async")).result()
    expect_whole(lines, "async", state)

    # Megatron-core's torch_dist layout: the DCP files, then metadata.json
    # and common.pt, which megatron writes beside them.
    state = make_state(777)
    mdir = os.path.join(out, "megatron")
    dcp.save(state, checkpoint_id=mdir)
    with open(os.path.join(mdir, "metadata.json"), "w") as f:
        json.dump({"sharded_backend": "torch_dist", "sharded_backend_version": 1,
                   "common_backend": "torch", "common_backend_version": 1}, f)
    torch.save({"iteration": 10, "args": {"lr": 1e-4}, "rng": torch.arange(4)},
               os.path.join(mdir, "common.pt"))
    expect_whole(lines, "megatron", state)

    import torch.multiprocessing as mp
    world = 2
    mp.spawn(rank_main, args=(world, free_port(), os.path.join(out, "ranks2")),
             nprocs=world, join=True)
    expect_ranks(lines, out, "ranks2")

    with open(os.path.join(out, "expect.tsv"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
