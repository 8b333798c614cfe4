"""What the Python clients of the integration tests share (imported by
mount_clients.py and python_module.py, from their own directory, which
Python puts first on sys.path when it runs a script).

The shell tests read a client's stdout: one "ok ..." line per check that
held, and a "FAIL ..." line before it exits 1 on the first that did not.
Sources are written by hand here, so that what the mount shows is compared
with bytes made independently of libckpt."""
import json
import struct
import sys


def fail(msg):
    print("FAIL " + msg)
    sys.exit(1)


def ok(msg):
    print("ok " + msg)


def write_safetensors(path, tensors, metadata=None):
    """tensors: list of (name, dtype name, shape, raw bytes); metadata, when
    given, is the header's __metadata__ (it comes first, as torch writes it)."""
    header, offset = ({"__metadata__": metadata} if metadata else {}), 0
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": list(shape),
                        "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for _, _, _, raw in tensors:
            f.write(raw)
