"""Python access to ckptfs mounts: packed model checkpoints as directories.

A ckptfs mount shows each packed checkpoint as a directory with its original
files, a ``manifest.json`` and one raw little-endian C-order file per tensor
under ``tensors/``. This package reads those with nothing but the
filesystem, numpy and (optionally) torch:

>>> import ckptfs
>>> ck = ckptfs.open("/mnt/ckpt/step1000")          # name -> TensorInfo
>>> ck["wte.weight"].dtype, ck["wte.weight"].shape
('BF16', (50257, 1024))
>>> a = ck.numpy("wte.weight")                      # np.memmap, uint16 raw bits for BF16
>>> w = ck.torch("wte.weight")                      # torch.bfloat16, via torch.from_file
>>> sd = ckptfs.load_state_dict("/mnt/ckpt/step1000")

and follows checkpoints written into a writable mount as ``ckpt status``
and ``ckpt commit`` do, through the directories' extended attributes:

>>> ckptfs.commit("/mnt/ckpt/step2000")             # waits until packed
Status('step2000', state='committed', size=...)
>>> ckptfs.status("/mnt/ckpt")                      # every checkpoint
{'step1000': Status(...), 'step2000': Status(...)}

Every error raised on purpose derives from :class:`CkptfsError`.
"""

from ._checkpoint import Checkpoint, FileInfo, TensorInfo, load_state_dict, open
from ._dtypes import (
    DTYPES,
    bfloat16_to_float32,
    is_raw_bits,
    itemsize,
    numpy_dtype,
    torch_dtype,
    torch_dtype_name,
)
from ._errors import (
    CkptfsError,
    CommitError,
    CommitTimeout,
    NotACheckpointError,
    UnsupportedDtypeError,
)
from ._mount import COMMITTED, DAMAGED, FAILED, KEY_MISMATCH, PACKING, WRITING, Status, commit, status

__version__ = "0.1.0"

__all__ = [
    "open",
    "load_state_dict",
    "status",
    "commit",
    "Checkpoint",
    "TensorInfo",
    "FileInfo",
    "Status",
    "DTYPES",
    "itemsize",
    "numpy_dtype",
    "torch_dtype",
    "torch_dtype_name",
    "is_raw_bits",
    "bfloat16_to_float32",
    "CkptfsError",
    "NotACheckpointError",
    "CommitError",
    "CommitTimeout",
    "UnsupportedDtypeError",
    "WRITING",
    "PACKING",
    "COMMITTED",
    "FAILED",
]
