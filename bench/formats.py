"""The formats bench's Python side (bench/bench-formats.sh runs it with the
pinned venv of scripts/venv.sh).

  make SAFETENSORS OUTDIR   the tensors of SAFETENSORS (written by ckpt-gen)
                            saved seven ways, each a checkpoint directory
                            under OUTDIR: safetensors, torch_sd (one
                            torch.save state_dict), torch_per (one torch.save
                            per tensor), dcp (torch.distributed.checkpoint
                            .save), tensorizer, gguf (BF16 or F32) and raw
                            (the tensor bytes back to back, no header)
  zipnn FILE DTYPE          ZipNN (Python API, one thread, dtype-aware:
                            bfloat16 or float32) on FILE's bytes: prints
                            "ratio compress_MBps decompress_MBps" after
                            checking the round trip
"""
import os
import shutil
import sys
import time
import warnings

warnings.filterwarnings("ignore")


def load(path):
    from safetensors import safe_open
    with safe_open(path, "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def make(st, out):
    import numpy as np
    import torch
    sd = load(st)
    dirs = {k: os.path.join(out, k) for k in ("safetensors", "torch_sd", "torch_per", "dcp", "tensorizer", "gguf", "raw")}
    for d in dirs.values():
        os.makedirs(d, exist_ok=True)
    shutil.copyfile(st, os.path.join(dirs["safetensors"], "model.safetensors"))
    torch.save(sd, os.path.join(dirs["torch_sd"], "model.pt"))
    for k, v in sd.items():
        torch.save(v, os.path.join(dirs["torch_per"], k + ".pt"))
    import torch.distributed.checkpoint as dcp
    dcp.save(sd, checkpoint_id=dirs["dcp"])
    from tensorizer import TensorSerializer
    s = TensorSerializer(os.path.join(dirs["tensorizer"], "model.tensors"))
    s.write_state_dict(sd)
    s.close()
    import gguf
    w = gguf.GGUFWriter(os.path.join(dirs["gguf"], "model.gguf"), "gpt2")
    for k, v in sd.items():
        if v.dtype == torch.bfloat16:
            w.add_tensor(k, v.view(torch.int16).numpy().view(np.uint16), raw_dtype=gguf.GGMLQuantizationType.BF16)
        else:
            w.add_tensor(k, v.numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with open(os.path.join(dirs["raw"], "weights.bin"), "wb") as f:
        for v in sd.values():
            f.write(v.contiguous().view(-1).view(torch.uint8).numpy().tobytes())


def zipnn_bench(path, dtype):
    import zipnn
    with open(path, "rb") as f:
        data = f.read()
    keep = bytes(data)
    z = zipnn.ZipNN(input_format="byte", bytearray_dtype=dtype, threads=1)
    # zipnn 0.5.4's compress reorders the bits of its input in place, even
    # of an immutable bytes object: hand it a copy.
    buf = bytearray(data)
    t0 = time.perf_counter()
    c = z.compress(buf)
    t1 = time.perf_counter()
    d = z.decompress(c)
    t2 = time.perf_counter()
    if bytes(d) != keep:
        sys.exit("zipnn: the round trip differs")
    n = len(keep)
    print("%.3f %.1f %.1f" % (n / len(c), n / 1e6 / (t1 - t0), n / 1e6 / (t2 - t1)))


def main(argv):
    if len(argv) == 4 and argv[1] == "make":
        make(argv[2], argv[3])
    elif len(argv) == 4 and argv[1] == "zipnn":
        zipnn_bench(argv[2], argv[3])
    else:
        print(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
