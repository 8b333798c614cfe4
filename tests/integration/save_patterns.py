"""Real trainers saving checkpoints the way they do, for test_savepatterns.sh.

Run with the venv's python (scripts/venv.sh), from the directory to save
into. The test runs it twice, into a plain directory and into the mount,
both bind-mounted at the same path (savers record absolute paths: Lightning
its dirpath), with the ids savers draw at random (DCP's save_id) drawn from
a seeded generator, so the bytes written are the same in both places and
the test compares them.

  save_patterns.py PATTERN          write the pattern into the current directory
  save_patterns.py check PATTERN    load it back the framework's way
  save_patterns.py sums DIR         sha256 of every file below DIR (links as
                                    "-> target"), the mount's views left out

Patterns: hf-trainer-safetensors, hf-trainer-bin (HF Trainer on a tiny
GPT-2 from a config, save_steps=1, save_total_limit=2, then a resume from
the last checkpoint), dcp (dcp.save and dcp.async_save into step-100/model/
and step-100/optim/), lightning (ModelCheckpoint: save_top_k=2, save_last
as a link), hf-cache (a huggingface_hub cache tree with relative links,
copied with cp -a by the shell side), deepspeed (a ZeRO stage 2 engine's
save_checkpoint, twice, on DeepSpeed's CPU accelerator; load_checkpoint)
megatron (megatron-core's dist_checkpointing.save, torch_dist, from two
ranks on gloo; dist_checkpointing.load on one) and megatron-async (the same
with async_sharded_save=True, scheduled and finalized on an
AsyncCallsQueue as Megatron-LM's --async-save does). Both run on the CPU with
two shims, each explained where it is made, neither on the way to a file:
DeepSpeed is kept from compiling a shared-memory allreduce kernel, and
megatron-core 0.16.1's two calls into the CUDA runtime become the CPU's.
"""
import hashlib
import json
import os
import sys
import time

SEED = 1234

import random
import uuid

_ids = random.Random(SEED)
uuid.uuid4 = lambda: uuid.UUID(int=_ids.getrandbits(128), version=4)


def log(msg):
    print(msg, flush=True)


def tiny_gpt2():
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    # One thread: the same sums in the same order in both runs, however
    # busy the machine (the daemon packs meanwhile).
    torch.set_num_threads(1)
    torch.manual_seed(SEED)
    cfg = GPT2Config(vocab_size=256, n_positions=32, n_embd=64, n_layer=2, n_head=2,
                     bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(cfg)


def lm_dataset(n=16, length=32):
    import torch
    g = torch.Generator().manual_seed(SEED)
    data = torch.randint(0, 256, (n, length), generator=g)
    return [{"input_ids": row, "labels": row} for row in data]


# ------------------------------------------------------------- HF Trainer

def hf_trainer(safetensors):
    import torch
    from transformers import Trainer, TrainingArguments, set_seed
    set_seed(SEED)
    model = tiny_gpt2()
    args = TrainingArguments(
        output_dir="out", logging_dir="out/runs", max_steps=3, per_device_train_batch_size=4, save_steps=1,
        save_total_limit=2, save_safetensors=safetensors, logging_steps=1, report_to=[],
        use_cpu=True, seed=SEED, data_seed=SEED, dataloader_num_workers=0,
        disable_tqdm=True, learning_rate=1e-3)
    Trainer(model=model, args=args, train_dataset=lm_dataset()).train()
    # Reloading through the mount, the way users do, then training on
    # from the last checkpoint (writes checkpoint-4, rotates one out).
    from transformers import GPT2LMHeadModel
    again = GPT2LMHeadModel.from_pretrained("out/checkpoint-3")
    for (n, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items()):
        if not torch.equal(a, b):
            raise SystemExit("from_pretrained: %s differs" % n)
    args.max_steps = 4
    set_seed(SEED)
    Trainer(model=tiny_gpt2(), args=args, train_dataset=lm_dataset()).train(
        resume_from_checkpoint="out/checkpoint-3")
    left = sorted(d for d in os.listdir("out") if d.startswith("checkpoint-"))
    if left != ["checkpoint-3", "checkpoint-4"]:
        raise SystemExit("save_total_limit=2 should leave checkpoint-3 and -4, not %s" % left)


def hf_check():
    from transformers import GPT2LMHeadModel
    GPT2LMHeadModel.from_pretrained("out/checkpoint-4")
    state = json.load(open("out/checkpoint-4/trainer_state.json"))
    if state["global_step"] != 4:
        raise SystemExit("trainer_state.json: global_step %s" % state["global_step"])


# ------------------------------------------------------------------ DCP

def dcp_states():
    import torch
    model = tiny_gpt2()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = lm_dataset(4)[0]["input_ids"].unsqueeze(0)
    model(input_ids=batch, labels=batch).loss.backward()
    opt.step()
    return model, opt


def dcp_save():
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    model, opt = dcp_states()
    msd, osd = get_state_dict(model, opt)
    os.makedirs("step-100", exist_ok=True)
    _ids.seed(SEED)
    dcp.save(msd, checkpoint_id="step-100/model")
    _ids.seed(SEED + 1)
    fut = dcp.async_save({"optim": osd}, checkpoint_id="step-100/optim")
    time.sleep(2.5)  # training goes on while the shards are written
    fut.result()


def dcp_check():
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    model, opt = dcp_states()
    msd, osd = get_state_dict(model, opt)
    want = {k: v.clone() for k, v in msd.items()}
    for v in msd.values():
        v.zero_()
    dcp.load(msd, checkpoint_id="step-100/model")
    for k, v in msd.items():
        if not torch.equal(v, want[k]):
            raise SystemExit("dcp.load: %s differs" % k)
    dcp.load({"optim": osd}, checkpoint_id="step-100/optim")


# ------------------------------------------------------------ Lightning

def lightning_save():
    import lightning as L
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = tiny_gpt2()

        def training_step(self, batch, i):
            loss = self.net(input_ids=batch["input_ids"], labels=batch["labels"]).loss
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    L.seed_everything(SEED, verbose=False)
    ck = ModelCheckpoint(dirpath="checkpoints", every_n_train_steps=1, save_top_k=2,
                         monitor="train_loss", mode="min", save_last="link")
    trainer = L.Trainer(max_steps=4, accelerator="cpu", logger=False, callbacks=[ck],
                        enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=".", deterministic=True)
    loader = torch.utils.data.DataLoader(lm_dataset(), batch_size=4)
    trainer.fit(Tiny(), loader)


def lightning_check():
    import torch
    names = sorted(os.listdir("checkpoints"))
    if not os.path.islink("checkpoints/last.ckpt"):
        raise SystemExit("last.ckpt is not a link: %s" % names)
    ckpts = [n for n in names if n.endswith(".ckpt") and n != "last.ckpt"]
    if len(ckpts) != 2:
        raise SystemExit("save_top_k=2 should leave 2 files, not %s" % names)
    sd = torch.load("checkpoints/last.ckpt", weights_only=False)
    if "state_dict" not in sd:
        raise SystemExit("last.ckpt has no state_dict")


# -------------------------------------------------------------- HF cache

def hf_cache_tree():
    """models--org--tiny as huggingface_hub lays it out: blobs named by
    their sha256, snapshots/<rev>/ linking into ../../blobs, refs/main."""
    from safetensors.torch import save_model
    model = tiny_gpt2()
    root = "models--org--tiny"
    rev = "0123456789abcdef0123456789abcdef01234567"
    os.makedirs(root + "/blobs")
    os.makedirs(root + "/refs")
    os.makedirs(root + "/snapshots/" + rev)
    os.makedirs(root + "/.no_exist/" + rev)
    open(root + "/.no_exist/%s/generation_config.json" % rev, "w").close()
    save_model(model, "staging.safetensors", metadata={"format": "pt"})
    model.config.to_json_file("staging.json")
    for src, name in (("staging.safetensors", "model.safetensors"), ("staging.json", "config.json")):
        digest = hashlib.sha256(open(src, "rb").read()).hexdigest()
        os.replace(src, "%s/blobs/%s" % (root, digest))
        os.symlink("../../blobs/" + digest, "%s/snapshots/%s/%s" % (root, rev, name))
    with open(root + "/refs/main", "w") as f:
        f.write(rev)


def hf_cache_check():
    from transformers import GPT2LMHeadModel
    rev = open("models--org--tiny/refs/main").read()
    GPT2LMHeadModel.from_pretrained("models--org--tiny/snapshots/" + rev)


# ------------------------------------------------------------- DeepSpeed

def free_port():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def deepspeed_engine():
    """A ZeRO stage 2 engine on the tiny GPT-2, one rank, on DeepSpeed's CPU
    accelerator (gloo)."""
    os.environ.update(DS_ACCELERATOR="cpu", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
                      RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_SIZE="1")
    import importlib
    import deepspeed
    import torch
    # On the CPU accelerator every engine first compiles a shared-memory
    # allreduce kernel (deepspeed_shm_comm, 75-90 s of g++ here, again on
    # every fresh machine); it only speeds up collectives between ranks on
    # one host, and without it DeepSpeed runs them on gloo, as it does
    # wherever the op is not compatible. It never touches a checkpoint.
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    model = tiny_gpt2()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    cfg = {"train_batch_size": 1, "zero_optimization": {"stage": 2}, "steps_per_print": 1000}
    return deepspeed.initialize(model=model, optimizer=opt, config=cfg)[0]


def deepspeed_steps(engine, save):
    """Two steps, with engine.save_checkpoint(save) after each: the default
    tags global_step1 and global_step2, so the second save rewrites latest
    and the recovery scripts."""
    for i, row in enumerate(lm_dataset(2)):
        if save and i:
            # Training goes on between saves, longer than the mount's
            # commit_delay: the second save rewrites committed files.
            time.sleep(2.5)
        batch = row["input_ids"].unsqueeze(0)
        engine.backward(engine(input_ids=batch, labels=batch).loss)
        engine.step()
        if save:
            engine.save_checkpoint(save)


def deepspeed_save():
    deepspeed_steps(deepspeed_engine(), "save")


def deepspeed_check():
    """engine.load_checkpoint into an engine that made the same two steps
    without saving, its weights, ZeRO's fp32 master partition and Adam's
    moments then zeroed: all must come back (the weights from the model
    states file, the rest from the optimizer states file)."""
    import torch
    tag = open("save/latest").read()
    if tag != "global_step2":
        raise SystemExit("latest says %r" % tag)
    if not os.access("save/zero_to_fp32.py", os.X_OK):
        raise SystemExit("zero_to_fp32.py is not executable")
    engine = deepspeed_engine()
    deepspeed_steps(engine, None)
    zero = engine.optimizer

    def tensors():
        out = {"module." + k: v for k, v in engine.module.state_dict().items()}
        out.update(("fp32_master.%d" % i, t) for i, t in enumerate(zero.single_partition_of_fp32_groups))
        for i, st in enumerate(zero.optimizer.state.values()):
            out.update(("adam.%d.%s" % (i, k), v) for k, v in st.items() if torch.is_tensor(v))
        return out

    want = {k: v.detach().clone() for k, v in tensors().items()}
    with torch.no_grad():
        for v in tensors().values():
            v.zero_()
    engine.global_steps = 0
    path, _ = engine.load_checkpoint("save")
    if path is None or engine.global_steps != 2:
        raise SystemExit("load_checkpoint: %s at step %d" % (path, engine.global_steps))
    got = tensors()
    if set(got) != set(want):
        raise SystemExit("load_checkpoint: %s" % sorted(set(got) ^ set(want)))
    for k, v in got.items():
        if not torch.equal(v, want[k]):
            raise SystemExit("load_checkpoint: %s differs" % k)


# -------------------------------------------------------------- Megatron

def megatron_state(rank, world, zeros=False):
    """A tensor-parallel layer's sharded state dict as Megatron models make
    it (ShardedTensors): a weight split by rows across the ranks, a bias
    every rank holds (rank 0's copy is saved), and a plain value that goes
    to common.pt. The values every rank draws from the seed, or zeros to
    load into."""
    import torch
    from megatron.core.dist_checkpointing.mapping import ShardedTensor
    g = torch.Generator().manual_seed(SEED)
    weight, bias = torch.randn(128, 64, generator=g), torch.randn(64, generator=g)
    if zeros:
        weight, bias = torch.zeros_like(weight), torch.zeros_like(bias)
    return {
        "decoder.layers.0.mlp.linear_fc1.weight": ShardedTensor.from_rank_offsets(
            "decoder.layers.0.mlp.linear_fc1.weight", weight.chunk(world)[rank].clone(),
            (0, rank, world)),
        "decoder.layers.0.mlp.linear_fc1.bias": ShardedTensor.from_rank_offsets(
            "decoder.layers.0.mlp.linear_fc1.bias", bias, replica_id=rank),
        "iteration": 100,
    }


def megatron_no_cuda():
    """megatron-core 0.16.1's torch_dist save calls the CUDA runtime twice
    where a CPU-only torch has none: torch.cuda.synchronize() after copying
    the shards to the host (FileSystemWriterAsync.preload_tensors) and
    torch.cuda.current_device() for the one-element failure flag it
    broadcasts (save_state_dict_async_finalize). Both fail with "Torch not
    compiled with CUDA enabled". With every tensor on the CPU there is
    nothing to wait for, and the flag goes on the CPU, which gloo needs."""
    import torch
    if not torch.cuda.is_available():
        torch.cuda.synchronize = lambda *a: None
        torch.cuda.current_device = lambda: "cpu"


def megatron_rank(rank, world, port, async_save):
    """One rank of a Megatron-LM save (megatron/training/checkpointing.py):
    rank 0 makes iter_0000100/, every rank calls dist_checkpointing.save
    (torch_dist: each rank writes its own .distcp files, the coordinator
    .metadata, rank 0 common.pt and metadata.json), then after a barrier
    rank 0 writes the tracker latest_checkpointed_iteration.txt (Megatron-LM's
    training loop, not megatron-core, so written here as it writes it).
    async_save (--async-save): save returns an AsyncRequest whose shards a
    forked process writes (TemporalAsyncCaller) while training would go
    on; the tracker is a finalize function, run once every rank's writer is
    done, after the coordinator's .metadata, as Megatron-LM adds it."""
    import torch.distributed as dist
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.strategies.async_utils import AsyncCallsQueue
    megatron_no_cuda()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    d = os.path.join("ckpts", "iter_%07d" % 100)
    if rank == 0:
        os.makedirs(d, exist_ok=True)
    dist.barrier()
    _ids.seed(SEED + rank)

    def tracker():
        if rank == 0:
            with open(os.path.join("ckpts", "latest_checkpointed_iteration.txt"), "w") as f:
                f.write("100")

    if async_save:
        queue = AsyncCallsQueue()
        request = dist_checkpointing.save(megatron_state(rank, world), d, async_sharded_save=True)
        request.add_finalize_fn(tracker)
        queue.schedule_async_request(request)
        queue.maybe_finalize_async_calls(blocking=True)
        queue.close()
    else:
        dist_checkpointing.save(megatron_state(rank, world), d)
        dist.barrier()
        tracker()
    dist.destroy_process_group()


def megatron_save(async_save=False):
    import torch.multiprocessing as mp
    mp.spawn(megatron_rank, args=(2, free_port(), async_save), nprocs=2, join=True)


def megatron_check():
    """dist_checkpointing.load on one rank: the two ranks' shards put back
    together."""
    import torch
    import torch.distributed as dist
    from megatron.core import dist_checkpointing
    it = open("ckpts/latest_checkpointed_iteration.txt").read()
    d = "ckpts/iter_%07d" % int(it)
    # A committed checkpoint also shows the mount's views of it.
    names = sorted(n for n in os.listdir(d) if not is_view(n))
    # torch_dist writes a rank's tensors in up to thread_count (2) files:
    # rank 0 holds a slice and the bias, rank 1 only its slice.
    want = [".metadata", "__0_0.distcp", "__0_1.distcp", "__1_0.distcp", "common.pt",
            "metadata.json"]
    if names != want:
        raise SystemExit("iter dir holds %s, want %s" % (names, want))
    megatron_no_cuda()
    dist.init_process_group("gloo", rank=0, world_size=1, init_method="tcp://127.0.0.1:%d" % free_port())
    got = dist_checkpointing.load(megatron_state(0, 1, zeros=True), d)
    want = megatron_state(0, 1)
    for k, v in want.items():
        if k != "iteration" and not torch.equal(got[k], v.data):
            raise SystemExit("dist_checkpointing.load: %s differs" % k)
    if got["iteration"] != 100:
        raise SystemExit("dist_checkpointing.load: iteration %s" % got["iteration"])
    dist.destroy_process_group()


# ------------------------------------------------------------------ main

def sums(root):
    out = {}
    for base, dirs, files in os.walk(root):
        rel_base = os.path.relpath(base, root)
        for name in dirs + files:
            path = os.path.join(base, name)
            rel = os.path.normpath(os.path.join(rel_base, name))
            if os.path.islink(path):
                out[rel] = "-> " + os.readlink(path)
            elif name in files:
                out[rel] = hashlib.sha256(open(path, "rb").read()).hexdigest()
    return out


PATTERNS = {
    "hf-trainer-safetensors": (lambda: hf_trainer(True), hf_check),
    "hf-trainer-bin": (lambda: hf_trainer(False), hf_check),
    "dcp": (dcp_save, dcp_check),
    "lightning": (lightning_save, lightning_check),
    "hf-cache": (hf_cache_tree, hf_cache_check),
    "deepspeed": (deepspeed_save, deepspeed_check),
    "megatron": (megatron_save, megatron_check),
    "megatron-async": (lambda: megatron_save(True), megatron_check),
}


def is_view(rel):
    """What the mount adds to each pack (fs/read/pack_tree.h)."""
    parts = rel.split("/")
    return parts[-1] == "manifest.json" or "tensors" in parts[:-1] or parts[-1] == "tensors"


def same_dcp_metadata(x, y):
    """dcp.async_save draws its save_id (a random uuid) on its own thread,
    at a moment that varies: two saves agree on everything else."""
    import dataclasses
    import pickle
    a, b = pickle.load(open(x, "rb")), pickle.load(open(y, "rb"))
    for m in (a, b):
        if getattr(m, "storage_meta", None) is not None:
            m.storage_meta = dataclasses.replace(m.storage_meta, save_id=None)
    return a.__dict__ == b.__dict__


def compare(plain, mounted):
    a, b = sums(plain), sums(mounted)
    b = {k: v for k, v in b.items() if k in a or not is_view(k)}
    diff = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    meta = [k for k in diff if os.path.basename(k) == ".metadata" and k in a and k in b and
            same_dcp_metadata(os.path.join(plain, k), os.path.join(mounted, k))]
    diff = [k for k in diff if k not in meta]
    if diff:
        raise SystemExit("differ: %s" % ["%s: %s vs %s" % (k, a.get(k), b.get(k)) for k in diff[:6]])
    log("ok: %d files and links identical (sha256%s)" % (
        len(a), "; %d DCP .metadata equal but for async_save's random save_id" % len(meta)
        if meta else ""))


def packs(back, ckpt):
    """Every pack below back: compressed, and the ratio of them all."""
    import subprocess
    logical = stored = n = 0
    bad = []
    for base, dirs, files in os.walk(back):
        dirs[:] = [d for d in dirs if d != ".ckptfs"]
        for name in files:
            if not name.endswith((".tpack", ".tfile")):
                continue
            path = os.path.join(base, name)
            info = json.loads(subprocess.run([ckpt, "ls", "--json", path], check=True,
                                             capture_output=True, text=True).stdout)["pack"]
            n += 1
            logical += info["logical_bytes"]
            stored += info["stored_bytes"]
            # Packs of some size must come out smaller; a few KB are mostly
            # header, index and footer.
            if info["logical_bytes"] >= 65536 and info["stored_bytes"] >= info["logical_bytes"]:
                bad.append("%s: %d stored for %d" % (os.path.relpath(path, back),
                                                     info["stored_bytes"], info["logical_bytes"]))
    if bad or not n:
        raise SystemExit("not compressed: %s" % (bad or "no pack at all"))
    log("ok: %d packs, %.1f MB in %.1f MB stored, ratio %.3f" % (n, logical / 1e6, stored / 1e6,
                                                                logical / stored))


def main(argv):
    if len(argv) == 4 and argv[1] == "packs":
        packs(argv[2], argv[3])
        return
    if len(argv) >= 3 and argv[1] == "sums":
        json.dump(sums(argv[2]), sys.stdout, indent=0, sort_keys=True)
        return
    if len(argv) == 4 and argv[1] == "compare":
        compare(argv[2], argv[3])
        return
    if len(argv) >= 3 and argv[1] == "check":
        PATTERNS[argv[2]][1]()
        log("ok: %s loads back" % argv[2])
        return
    if len(argv) != 2 or argv[1] not in PATTERNS:
        raise SystemExit(__doc__)
    PATTERNS[argv[1]][0]()
    log("ok: %s saved" % argv[1])


if __name__ == "__main__":
    import warnings
    warnings.filterwarnings("ignore")
    main(sys.argv)
