"""A mounted checkpoint directory: its manifest, tensors and files."""

import errno as _errno
import io
import json
import os
import warnings
from collections.abc import Mapping

import numpy as np

from . import _dtypes
from ._errors import CkptfsError, NotACheckpointError, UnsupportedDtypeError
from ._mount import XATTR_STATE, _read_state

MANIFEST = "manifest.json"

# The fields every manifest's tensor entry has; the rest land in ``extra``.
_TENSOR_FIELDS = ("name", "dtype", "shape", "nbytes", "path", "file", "offset", "sha256")
_FILE_FIELDS = ("path", "size", "sha256")


def _u64(v):
    # The manifest writes integers above 2^63-1 as decimal strings.
    return int(v)


def _check_entry(entry, fields, what, key, root):
    """CkptfsError naming the manifest and what is missing unless entry
    is an object with every one of fields (a bare KeyError or TypeError
    would say neither)."""
    mpath = os.path.join(root, MANIFEST)
    if not isinstance(entry, dict):
        raise CkptfsError("%s: a %s entry is not an object: %r" % (mpath, what, entry), path=mpath)
    missing = [f for f in fields if f not in entry]
    if missing:
        label = " (%s %r)" % (key, entry[key]) if key in entry else ""
        raise CkptfsError("%s: a %s entry%s lacks %s" % (mpath, what, label, ", ".join(missing)), path=mpath)


class TensorInfo:
    """One tensor of a checkpoint, as its manifest.json entry describes it.

    Attributes:
      name      the tensor's name ("h.0.attn.c_attn.weight")
      dtype     the manifest's dtype string ("F32", "BF16", "F8_E4M3", ...)
      shape     tuple of ints (``()`` for a scalar)
      nbytes    size of its ``tensors/`` file in bytes
      path      its file relative to the checkpoint, exactly as the manifest
                gives it ("tensors/h.0.attn.c_attn.weight"; unsafe bytes of a
                name are %-escaped there), or None if the mount shows none
                (its name clashes under tensors/: "a" and "a/b", a name
                that is not a usable path); :meth:`Checkpoint.numpy` and
                :meth:`Checkpoint.torch` then read ``file`` at ``offset``
      filename  ``path`` joined to the checkpoint directory (or None)
      sha256    SHA-256 of its bytes, 64 hex digits
      file      the packed file it came from ("model.safetensors"), or
                None for a tensor assembled from chunks (a DCP tensor saved
                in dim-0 shards), whose ``extra["parts"]`` say where each
                chunk is (name, row, shape, nbytes, file, offset, sha256)
      offset    its byte offset in that file (None when file is None)
      extra     every other field of the manifest entry, as a dict
                (newer manifests add "container", "numpy_dtype",
                "torch_dtype", ...); also readable as attributes

    And derived ones, from the manifest's own fields when it has them, else
    from the built-in table (:data:`ckptfs.DTYPES`):

      numpy_dtype  the ``numpy.dtype`` :meth:`Checkpoint.numpy` uses
      raw_bits     True when numpy_dtype holds raw bits, not values (BF16, F8)
      torch_dtype_name  "torch.bfloat16", ...
      container    the container format of ``file``, or None if unrecorded
    """

    def __init__(self, entry, root):
        _check_entry(entry, _TENSOR_FIELDS, "tensor", "name", root)
        self.name = entry["name"]
        self.dtype = entry["dtype"]
        self.shape = tuple(_u64(d) for d in entry["shape"])
        self.nbytes = _u64(entry["nbytes"])
        self.path = entry["path"]
        self.filename = None if self.path is None else os.path.join(root, self.path)
        self.file = entry["file"]
        self.offset = None if entry["offset"] is None else _u64(entry["offset"])
        self.sha256 = entry["sha256"]
        self.extra = {k: v for k, v in entry.items() if k not in _TENSOR_FIELDS}

    def __getattr__(self, name):
        # Only reached for names that are not regular attributes.
        extra = self.__dict__.get("extra", {})
        if name in extra:
            return extra[name]
        raise AttributeError("%s has no field %r" % (type(self).__name__, name))

    @property
    def container(self):
        """The container format of the file it came from, when the manifest records it."""
        return self.extra.get("container")

    @property
    def numpy_dtype(self):
        """The ``numpy.dtype`` of its ``tensors/`` file: the manifest's
        "numpy_dtype" when given, else the built-in table's."""
        given = self.extra.get("numpy_dtype")
        if isinstance(given, str):
            try:
                return np.dtype(given)
            except TypeError:
                pass
        return _dtypes.numpy_dtype(self.dtype)

    @property
    def raw_bits(self):
        """True when :attr:`numpy_dtype` holds the raw bits of a type numpy
        lacks (bfloat16, float8) rather than the values."""
        given = self.extra.get("numpy_raw_bits")
        if isinstance(given, bool):
            return given
        return self.dtype in _dtypes.DTYPES and _dtypes.is_raw_bits(self.dtype)

    @property
    def torch_dtype_name(self):
        """"torch.bfloat16" and the like: the manifest's "torch_dtype" when
        given, else the built-in table's."""
        given = self.extra.get("torch_dtype")
        if isinstance(given, str) and given:
            return given
        return _dtypes.torch_dtype_name(self.dtype)

    def torch_dtype(self):
        """The ``torch.dtype`` (imports torch); raises
        :class:`UnsupportedDtypeError` when the installed torch lacks it."""
        return _dtypes._torch_dtype_from_name(self.torch_dtype_name, self.dtype)

    @property
    def numel(self):
        """Number of elements (1 for a scalar)."""
        n = 1
        for d in self.shape:
            n *= d
        return n

    def __repr__(self):
        return "TensorInfo(%r, dtype=%r, shape=%r, nbytes=%d)" % (
            self.name,
            self.dtype,
            self.shape,
            self.nbytes,
        )


class FileInfo:
    """One packed file of a checkpoint, from manifest.json.

    Attributes: ``path`` (as packed), ``size``, ``sha256``, ``filename``
    (where the mount shows it: the checkpoint directory joined with the
    manifest's "mount_path" when it moved the file, e.g. under ``.packed/``,
    else with ``path``; None if the mount does not show it) and ``extra``
    (every other field, also readable as attributes).

    Raises :class:`CkptfsError` naming the manifest and the field when the
    entry lacks one of path, size and sha256 (as :class:`TensorInfo` does
    for its fields).
    """

    def __init__(self, entry, root):
        _check_entry(entry, _FILE_FIELDS, "file", "path", root)
        self.path = entry["path"]
        self.size = _u64(entry["size"])
        self.sha256 = entry["sha256"]
        self.extra = {k: v for k, v in entry.items() if k not in _FILE_FIELDS}
        shown = entry.get("mount_path", self.path)
        self.filename = None if shown is None else os.path.join(root, shown)

    def __getattr__(self, name):
        extra = self.__dict__.get("extra", {})
        if name in extra:
            return extra[name]
        raise AttributeError("%s has no field %r" % (type(self).__name__, name))

    def __repr__(self):
        return "FileInfo(%r, size=%d)" % (self.path, self.size)


class Checkpoint(Mapping):
    """A checkpoint directory of a ckptfs mount (``/mnt/ckpt/step1000``).

    A read-only mapping of tensor name -> :class:`TensorInfo`, in manifest
    order: ``len(ck)``, ``ck["wte.weight"].shape``, ``for name in ck``.

    Attributes: ``path`` (the directory), ``manifest`` (manifest.json as a
    dict) and ``files`` (a dict packed path -> :class:`FileInfo`).

    Made by :func:`ckptfs.open`; reads happen only when a tensor is used:
    :meth:`numpy` and :meth:`torch` map its ``tensors/`` file.
    """

    def __init__(self, path):
        path = os.fspath(path)
        self.path = path
        manifest_path = os.path.join(path, MANIFEST)
        try:
            with io.open(manifest_path, "rb") as f:
                text = f.read()
        except OSError as e:
            raise _open_error(path, e) from None
        try:
            self.manifest = json.loads(text)
        except ValueError as e:
            raise CkptfsError("%s: not valid JSON: %s" % (manifest_path, e), path=manifest_path) from None
        if not isinstance(self.manifest, dict) or not isinstance(self.manifest.get("tensors"), list):
            raise CkptfsError("%s: not a ckptfs manifest (no tensor list)" % manifest_path, path=manifest_path)
        self._tensors = {}
        for entry in self.manifest["tensors"]:
            info = TensorInfo(entry, path)
            self._tensors[info.name] = info
        self.files = {}
        for entry in self.manifest.get("files", []):
            fi = FileInfo(entry, path)
            self.files[fi.path] = fi

    @property
    def name(self):
        """The checkpoint's name, as the manifest gives it."""
        return self.manifest.get("name", os.path.basename(os.path.normpath(self.path)))

    def __getitem__(self, name):
        try:
            return self._tensors[name]
        except KeyError:
            raise KeyError("%s: no tensor named %r" % (self.path, name)) from None

    def __iter__(self):
        return iter(self._tensors)

    def __len__(self):
        return len(self._tensors)

    def __repr__(self):
        return "<ckptfs.Checkpoint %r: %d tensors, %d files>" % (self.path, len(self), len(self.files))

    def _where(self, name):
        """(info, filename, offset): where the tensor's bytes are. Its
        ``tensors/`` file, at 0; for a tensor the mount shows none of
        ("path": null), the packed file it came from, where the mount shows
        that file (its "mount_path" when moved under .packed/), at the
        manifest's "offset": the mount shows every packed file
        byte-identical, so these are the bytes its tensors/ file would
        hold (ckpt-cuda reads them so too). CkptfsError when there is no
        such place: a tensor assembled from parts (file null) or a file
        the mount does not show."""
        info = self[name]
        if info.filename is not None:
            return info, info.filename, 0
        if info.file is None or info.offset is None:
            raise CkptfsError(
                "%s: tensor %r has no file under tensors/ (its name clashes there) and, assembled from %d part(s), "
                "has no one place in a packed file" % (self.path, name, len(info.extra.get("parts") or ())),
                path=self.path,
            )
        fi = self.files.get(info.file)
        if fi is None or fi.filename is None:
            raise CkptfsError(
                "%s: tensor %r has no file under tensors/ (its name clashes there), and the mount does not "
                "show its file %r" % (self.path, name, info.file),
                path=self.path,
            )
        return info, fi.filename, info.offset

    def numpy(self, name, mode="r"):
        """The tensor as a ``numpy.memmap`` of its ``tensors/`` file: no copy,
        pages are read from the mount when touched. A tensor with no
        ``tensors/`` file (``path`` None) is mapped from its packed ``file``
        at ``offset`` instead; :class:`CkptfsError` when it has none either
        (assembled from parts, or a file the mount does not show).

        The dtype is :attr:`TensorInfo.numpy_dtype`: the values for every
        dtype numpy has, and the raw bits for the ones it lacks (BF16 as
        ``uint16``, F8_E4M3 and F8_E5M2 as ``uint8``; widen BF16 with
        :func:`ckptfs.bfloat16_to_float32`). The returned array carries the
        manifest's dtype string as ``a.ckptfs_dtype`` ("BF16"); slices of it
        do not, ``ck[name].dtype`` always does.

        ``mode`` is numpy.memmap's: "r" (read-only, the default) or "c"
        (copy-on-write in memory). A zero-byte tensor gives an empty array
        that no mapping backs (mmap cannot map 0 bytes), still a
        ``numpy.memmap`` with ``ckptfs_dtype``.
        """
        if mode not in ("r", "c"):
            raise ValueError("mode must be 'r' or 'c' (the mount's tensors are read-only), not %r" % mode)
        info, filename, offset = self._where(name)
        dt = info.numpy_dtype
        if dt.itemsize * info.numel != info.nbytes:
            raise CkptfsError(
                "%s: tensor %r: %d bytes, but %s x %s needs %d"
                % (self.path, name, info.nbytes, dt, info.shape, dt.itemsize * info.numel),
                path=filename,
            )
        if info.nbytes == 0:
            if not os.path.exists(filename):
                enoent = _errno.ENOENT
                raise CkptfsError("%s: %s" % (filename, os.strerror(enoent)), path=filename, errno=enoent)
            # A memmap view (which has a __dict__) so that it carries
            # ckptfs_dtype like every other array returned here.
            a = np.empty(info.shape, dtype=dt).view(np.memmap)
            a.flags.writeable = mode == "c"
        else:
            a = self._memmap(name, filename, dt, mode, offset, info.shape, info.nbytes)
        a.ckptfs_dtype = info.dtype
        return a

    def torch(self, name):
        """The tensor as a CPU ``torch.Tensor`` mapped from its ``tensors/``
        file with ``torch.from_file(..., shared=False)``: pages are read when
        touched, and writes to the tensor stay private to this process.

        The dtype is the real one (``torch.bfloat16`` for BF16,
        ``torch.float8_e4m3fn``/``torch.float8_e5m2`` for F8_E4M3/F8_E5M2);
        :class:`UnsupportedDtypeError` when the installed torch lacks it.

        A tensor with no ``tensors/`` file (``path`` None) comes from a
        copy-on-write ``numpy.memmap`` of its packed ``file`` at ``offset``
        (``torch.frombuffer``; ``torch.from_file`` takes no offset), just as
        lazy and private; :class:`CkptfsError` when it has none either, as
        from :meth:`numpy`.

        :class:`CkptfsError` when ``nbytes`` is not the shape's elements
        times the dtype's size, as from :meth:`numpy`; a tensor with no
        elements gives an empty tensor (nothing to map).
        """
        import torch

        info, filename, offset = self._where(name)
        td = info.torch_dtype()
        # Checked before the zero-byte case, as numpy() does: nbytes 0 is
        # right only for a shape with no elements.
        itemsize = torch.empty((), dtype=td).element_size()
        if itemsize * info.numel != info.nbytes:
            raise CkptfsError(
                "%s: tensor %r: %d bytes, but %s x %s needs %d"
                % (self.path, name, info.nbytes, td, info.shape, itemsize * info.numel),
                path=filename,
            )
        if info.nbytes == 0:
            if not os.path.exists(filename):
                raise CkptfsError("%s: no such tensor file" % filename, path=filename, errno=_errno.ENOENT)
            return torch.empty(info.shape, dtype=td)
        if info.filename is None:
            # Its packed file at its offset, privately mapped.
            raw = self._memmap(name, filename, np.uint8, "c", offset, (info.nbytes,), info.nbytes)
            return torch.frombuffer(raw, dtype=td).view(info.shape)
        try:
            t = torch.from_file(filename, shared=False, size=info.numel, dtype=td)
        except RuntimeError as e:
            # torch reports open and mmap failures as RuntimeError.
            raise CkptfsError("%s: %s" % (filename, e), path=filename) from None
        return t.view(info.shape)

    def _memmap(self, name, filename, dtype, mode, offset, shape, nbytes):
        """``numpy.memmap`` of filename, with its errors as CkptfsError
        naming the file (a file too short: mmap's ValueError)."""
        try:
            return np.memmap(filename, dtype=dtype, mode=mode, offset=offset, shape=shape)
        except OSError as e:
            raise CkptfsError("%s: %s" % (filename, e.strerror or e), path=filename, errno=e.errno) from None
        except ValueError as e:
            raise CkptfsError(
                "%s: tensor %r: %d bytes at offset %d: %s" % (filename, name, nbytes, offset, e), path=filename
            ) from None

    def state_dict(self, device="cpu"):
        """Every tensor, name -> ``torch.Tensor``, in manifest order (see
        :func:`ckptfs.load_state_dict`).

        A tensor with no ``tensors/`` file is read from its packed file at
        its offset (see :meth:`torch`); one with no place to read from at
        all (assembled from parts, or in a file the mount does not show) is
        left out with a warning naming it, and the rest are returned. Any
        other error raises."""
        sd = {}
        for name in self._tensors:
            try:
                self._where(name)
            except CkptfsError as e:
                warnings.warn("%s: left out of the state dict" % e, stacklevel=2)
                continue
            t = self.torch(name)
            if device is not None and str(device) != "cpu":
                t = t.to(device)
            sd[name] = t
        return sd


def _is_namespace(path):
    """Whether path is a namespace of a mount (run1/ holding run1/step-500/):
    its state sums up the checkpoints below it, which have states of their
    own, where the files inside a checkpoint have none."""
    try:
        names = os.listdir(path)
    except OSError:
        return False
    for name in names:
        if name.startswith("."):
            continue
        try:
            os.getxattr(os.path.join(path, name), XATTR_STATE, follow_symlinks=False)
            return True
        except OSError:
            pass
    return False


def _open_error(path, e):
    """Why ``open(path)`` failed, in words a user can act on."""
    if e.errno == _errno.ENOENT:
        if not os.path.exists(path):
            return NotACheckpointError("%s: no such checkpoint directory" % path, path=path, errno=e.errno)
        try:
            st = _read_state(path)
        except CkptfsError:
            return NotACheckpointError(
                "%s: not a checkpoint directory of a ckptfs mount (no manifest.json)" % path,
                path=path,
                errno=e.errno,
            )
        if _is_namespace(path):
            return NotACheckpointError(
                "%s: a namespace of a ckptfs mount (a directory of checkpoints), not a checkpoint: "
                "open one of them (ckptfs.status(path) lists them)" % path,
                path=path,
                errno=e.errno,
            )
        if st.state != "committed":
            return NotACheckpointError(
                "%s: the checkpoint is %s; it has a manifest once committed (ckptfs.commit)"
                % (path, st.state + (": " + st.error if st.error else "")),
                path=path,
                errno=e.errno,
            )
    if e.errno == _errno.ENOTDIR:
        return NotACheckpointError("%s: not a directory" % path, path=path, errno=e.errno)
    if e.errno == _errno.EACCES:
        return CkptfsError(
            "%s: permission denied reading manifest.json (a wrong or missing key? the daemon's log says)" % path,
            path=path,
            errno=e.errno,
        )
    if e.errno == _errno.ENOTCONN:
        return CkptfsError(
            "%s: the ckptfs daemon is not running (mount is disconnected)" % path, path=path, errno=e.errno
        )
    return CkptfsError("%s: %s" % (os.path.join(path, MANIFEST), e.strerror or e), path=path, errno=e.errno)


def open(path):  # noqa: A001 - ckptfs.open is the package's entry point
    """Opens a mounted checkpoint directory (``/mnt/ckpt/step1000``) and
    returns a :class:`Checkpoint`: a mapping tensor name -> :class:`TensorInfo`
    read from its manifest.json, with :meth:`Checkpoint.numpy`,
    :meth:`Checkpoint.torch`, ``.files`` and ``.manifest``.

    Raises :class:`NotACheckpointError` when the path is missing or is no
    committed checkpoint of a ckptfs mount, and :class:`CkptfsError` when the
    manifest cannot be read (EACCES: a wrong or missing key).
    """
    return Checkpoint(path)


def load_state_dict(path, device="cpu"):
    """A full state dict (tensor name -> ``torch.Tensor``) of a mounted
    checkpoint, built lazily: each tensor maps its ``tensors/`` file with
    ``torch.from_file`` (shared=False), so nothing is read until used. A
    tensor whose name clashes under ``tensors/`` ("path": null) maps its
    packed file at its offset; one with no place at all is left out with a
    warning (see :meth:`Checkpoint.state_dict`).

    With ``device`` other than "cpu" each tensor is copied there with
    ``.to(device)`` (which reads it). Needs torch; raises as :func:`open`,
    and :class:`UnsupportedDtypeError` for a dtype the installed torch lacks.
    """
    return Checkpoint(path).state_dict(device=device)
