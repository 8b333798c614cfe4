"""Loads every tensor of one safetensors file into CPU memory with Run:ai's
model streamer (runai-model-streamer, build/venv-streamer) and prints the
seconds it took and the bytes loaded, tab-separated. The source is an
s3://BUCKET/KEY URL (the streamer's own S3 client, from AWS_ENDPOINT_URL
and the AWS_* keys) or a path (here: the file inside a ckptfs mount), so
the same loader measures both. Each tensor is copied out, as a loader
keeping the weights must: the streamer reuses its buffers.

Usage: streamer_load.py SOURCE"""
import os
import sys
import time

# A gateway on loopback: path-style URLs, no instance metadata lookups.
os.environ.setdefault("RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING", "0")
os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
os.environ.setdefault("RUNAI_STREAMER_LOG_LEVEL", "WARNING")

from runai_model_streamer import SafetensorsStreamer  # noqa: E402


def main(src):
    t0 = time.perf_counter()
    loaded, total = {}, 0
    with SafetensorsStreamer() as streamer:
        streamer.stream_file(src)
        for name, tensor in streamer.get_tensors():
            loaded[name] = tensor.clone()
            total += tensor.numel() * tensor.element_size()
    t1 = time.perf_counter()
    if not loaded:
        sys.exit("no tensors in " + src)
    print("%.3f\t%d\t%d" % (t1 - t0, total, len(loaded)))


if __name__ == "__main__":
    main(sys.argv[1])
