"""The dtypes a ckptfs manifest can hold, and their numpy and torch names.

A manifest names each tensor's dtype as safetensors does ("F32", "BF16",
...). numpy has no bfloat16 or float8 types: those come back as their raw
bits, an unsigned integer of the same width ("raw bits"), and the manifest's
dtype (or :func:`torch_dtype`) says how to read them.
"""

import numpy as np

from ._errors import UnsupportedDtypeError

# name: (itemsize, numpy dtype, torch dtype, raw bits in numpy)
# The same table as core's (ckpt_dtype_numpy/ckpt_dtype_torch); a manifest
# that carries numpy_dtype/torch_dtype fields takes precedence over it.
DTYPES = {
    "BOOL": (1, "|b1", "torch.bool", False),
    "U8": (1, "|u1", "torch.uint8", False),
    "I8": (1, "|i1", "torch.int8", False),
    "F8_E5M2": (1, "|u1", "torch.float8_e5m2", True),
    "F8_E4M3": (1, "|u1", "torch.float8_e4m3fn", True),
    "I16": (2, "<i2", "torch.int16", False),
    "U16": (2, "<u2", "torch.uint16", False),
    "F16": (2, "<f2", "torch.float16", False),
    "BF16": (2, "<u2", "torch.bfloat16", True),
    "I32": (4, "<i4", "torch.int32", False),
    "U32": (4, "<u4", "torch.uint32", False),
    "F32": (4, "<f4", "torch.float32", False),
    "F64": (8, "<f8", "torch.float64", False),
    "I64": (8, "<i8", "torch.int64", False),
    "U64": (8, "<u8", "torch.uint64", False),
}


def _entry(dtype):
    try:
        return DTYPES[dtype]
    except KeyError:
        raise UnsupportedDtypeError(
            "unknown ckptfs dtype %r (known: %s)" % (dtype, ", ".join(sorted(DTYPES)))
        ) from None


def itemsize(dtype):
    """Bytes per element of a manifest dtype name such as ``"BF16"`` (2)."""
    return _entry(dtype)[0]


def numpy_dtype(dtype):
    """The ``numpy.dtype`` that ``tensors/NAME`` files of this manifest dtype
    are read as: little-endian, and for BF16 and the F8 types the raw bits
    (``uint16``, ``uint8``), since numpy has no such types.

    >>> numpy_dtype("F16")
    dtype('float16')
    >>> numpy_dtype("BF16")
    dtype('uint16')
    """
    return np.dtype(_entry(dtype)[1])


def is_raw_bits(dtype):
    """True when :func:`numpy_dtype` gives the raw bits rather than the
    values (BF16, F8_E4M3, F8_E5M2)."""
    return _entry(dtype)[3]


def torch_dtype_name(dtype):
    """The torch dtype's name for a manifest dtype, e.g. ``"torch.bfloat16"``
    for ``"BF16"``; torch need not be installed."""
    return _entry(dtype)[2]


def _torch_dtype_from_name(name, dtype):
    import torch

    attr = name[len("torch."):] if name.startswith("torch.") else name
    td = getattr(torch, attr, None)
    if not isinstance(td, torch.dtype):
        raise UnsupportedDtypeError(
            "dtype %s needs %s, which torch %s does not have (read it with .numpy() instead)"
            % (dtype, name, torch.__version__)
        )
    return td


def torch_dtype(dtype):
    """The ``torch.dtype`` for a manifest dtype: ``torch.bfloat16`` for
    ``"BF16"``, ``torch.float8_e4m3fn`` for ``"F8_E4M3"``, and so on.

    Raises :class:`UnsupportedDtypeError` when the installed torch lacks it
    (float8 before torch 2.1, uint16/32/64 before torch 2.3). Imports torch.
    """
    return _torch_dtype_from_name(torch_dtype_name(dtype), dtype)


def bfloat16_to_float32(bits):
    """Widens bfloat16 raw bits (a ``uint16`` array, as :meth:`Checkpoint.numpy`
    returns for BF16) to ``float32`` values, exactly."""
    bits = np.asarray(bits)
    if bits.dtype != np.uint16:
        raise TypeError("bfloat16_to_float32 wants uint16 raw bits, not %s" % bits.dtype)
    return (bits.astype("<u4") << 16).view("<f4")
