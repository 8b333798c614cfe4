"""Checkpoint states on a ckptfs mount: ``status`` and ``commit``.

Like ``ckpt status`` and ``ckpt commit``, these talk to the daemon through
nothing but the extended attributes of each checkpoint directory (see
core/include/ckpt_mount.h and ckptfs(8)):

  user.ckptfs.state     writing | packing | committed | failed, or for a
                        pack that cannot be read key mismatch | damaged
  user.ckptfs.size      staged bytes (the pack's size once committed)
  user.ckptfs.progress  "DONE TOTAL SECONDS" while packing
  user.ckptfs.error     the last error: why packing failed, why the pack
                        cannot be read, or its last read fault
  user.ckptfs.pack      the path of the pack, once committed
  user.ckptfs.commit    written (any value) to commit the checkpoint
"""

import errno as _errno
import os
import time

from ._errors import CkptfsError, CommitError, CommitTimeout, NotACheckpointError

XATTR_STATE = "user.ckptfs.state"
XATTR_SIZE = "user.ckptfs.size"
XATTR_PROGRESS = "user.ckptfs.progress"
XATTR_ERROR = "user.ckptfs.error"
XATTR_COMMIT = "user.ckptfs.commit"

WRITING = "writing"
PACKING = "packing"
COMMITTED = "committed"
FAILED = "failed"
KEY_MISMATCH = "key mismatch"
DAMAGED = "damaged"

POLL_SECONDS = 0.1


class Status:
    """One checkpoint's state, as ``ckpt status`` shows it.

    Attributes: ``name`` (the directory's name), ``path``, ``state``
    (``"writing"``, ``"packing"``, ``"committed"``, ``"failed"``, or any
    state a newer daemon reports), ``size`` (bytes staged, or the pack's size
    once committed), ``done`` and ``total`` (packing progress in bytes, 0
    when not packing), ``seconds`` (packing so far) and ``error`` (why it
    failed, or "").
    """

    __slots__ = ("name", "path", "state", "size", "done", "total", "seconds", "error")

    def __init__(self, name, path, state, size=0, done=0, total=0, seconds=0.0, error=""):
        self.name = name
        self.path = path
        self.state = state
        self.size = size
        self.done = done
        self.total = total
        self.seconds = seconds
        self.error = error

    @property
    def queued(self):
        """True while a committed checkpoint waits for another one to be packed."""
        return self.state == PACKING and self.done == 0 and self.seconds == 0

    @property
    def progress(self):
        """Fraction packed (0.0 to 1.0) while packing with a known total, else None."""
        if self.state != PACKING or not self.total:
            return None
        return min(1.0, self.done / self.total)

    @property
    def eta(self):
        """Estimated seconds of packing left, or None while unknown."""
        if self.state != PACKING or self.done == 0 or self.total <= self.done or self.seconds < 0.5:
            return None
        return self.seconds * (self.total - self.done) / self.done

    def __eq__(self, other):
        if not isinstance(other, Status):
            return NotImplemented
        return all(getattr(self, a) == getattr(other, a) for a in self.__slots__)

    def __repr__(self):
        extra = ""
        if self.state == PACKING:
            extra = ", done=%d, total=%d" % (self.done, self.total)
        if self.error:
            extra += ", error=%r" % self.error
        return "Status(%r, state=%r, size=%d%s)" % (self.name, self.state, self.size, extra)


def _why(e, path):
    """An OSError from getxattr, in the words of ``ckpt status``."""
    if e.errno in (_errno.ENODATA, _errno.ENOTSUP):
        return NotACheckpointError(
            "%s: not a checkpoint directory of a ckptfs mount" % path, path=path, errno=e.errno
        )
    if e.errno == _errno.ENOENT:
        return NotACheckpointError("%s: no such checkpoint" % path, path=path, errno=e.errno)
    if e.errno == _errno.ENOTCONN:
        return CkptfsError(
            "%s: the ckptfs daemon is not running (mount is disconnected)" % path,
            path=path,
            errno=e.errno,
        )
    return CkptfsError("%s: %s" % (path, e.strerror or e), path=path, errno=e.errno)


def _attr(path, name):
    try:
        return os.getxattr(path, name).decode("utf-8", "replace")
    except OSError:
        return None


def _read_state(path):
    """The Status of one checkpoint directory; raises as ``ckpt status`` fails."""
    path = os.fspath(path)
    try:
        state = os.getxattr(path, XATTR_STATE).decode("utf-8", "replace")
    except OSError as e:
        raise _why(e, path) from None
    st = Status(os.path.basename(os.path.normpath(path)), path, state)
    size = _attr(path, XATTR_SIZE)
    if size is not None:
        try:
            st.size = int(size.strip())
        except ValueError:
            pass
    progress = _attr(path, XATTR_PROGRESS)
    if progress is not None:
        parts = progress.split()
        try:
            if len(parts) == 3:
                st.done, st.total, st.seconds = int(parts[0]), int(parts[1]), float(parts[2])
        except ValueError:
            st.done = st.total = 0
            st.seconds = 0.0
    st.error = _attr(path, XATTR_ERROR) or ""
    return st


def status(path):
    """The state of a checkpoint directory, or of every checkpoint of a mount.

    ``path`` is a checkpoint directory (``/mnt/ckpt/step2000``): returns its
    :class:`Status`. Or it is the mount's root (``/mnt/ckpt``): returns a
    dict name -> :class:`Status`, sorted by name, of every checkpoint in it
    (names starting with "." are skipped), as ``ckpt status MOUNT`` lists them.

    Raises :class:`NotACheckpointError` when the path does not exist or is
    neither (a directory with entries none of which is a checkpoint), and
    :class:`CkptfsError` when the daemon is gone.
    """
    path = os.fspath(path)
    try:
        return _read_state(path)
    except NotACheckpointError as e:
        if e.errno == _errno.ENOENT or not os.path.isdir(path):
            raise
    try:
        names = sorted(n for n in os.listdir(path) if not n.startswith("."))
    except OSError as e:
        raise _why(e, path) from None
    found = {}
    for n in names:
        try:
            found[n] = _read_state(os.path.join(path, n))
        except NotACheckpointError:
            continue
    if names and not found:
        raise NotACheckpointError(
            "%s: not a ckptfs mount or checkpoint" % path, path=path, errno=_errno.ENODATA
        )
    return found


def commit(path, wait=True, timeout=None):
    """Commits a checkpoint written into a writable ckptfs mount, like
    ``ckpt commit PATH [--wait]``: the daemon packs it in the background into
    ``BACKING/NAME.tpack`` (writing into it later reopens it).

    With ``wait`` (the default), follows it until packing ends and returns
    the final :class:`Status` (state ``"committed"``); raises
    :class:`CommitError` with the daemon's reason when packing fails (the
    staged data is kept; committing again retries), and
    :class:`CommitTimeout` when ``timeout`` seconds pass first (it keeps
    packing). Without ``wait``, returns the Status right after asking.

    Committing a committed checkpoint does nothing. Raises
    :class:`NotACheckpointError` for a path that is not a checkpoint of a
    writable ckptfs mount.
    """
    path = os.fspath(path)
    _read_state(path)  # only on a ckptfs checkpoint: elsewhere setxattr would just store it
    try:
        os.setxattr(path, XATTR_COMMIT, b"1")
    except OSError as e:
        if e.errno == _errno.EACCES:
            st = _read_state(path)
            reason = st.error or (
                "its staged data cannot be read with the mount's key "
                "(remount with the key it was written with)"
            )
            raise CommitError(
                "%s: cannot commit: %s" % (path, reason),
                path=path,
                state=st.state,
                error=st.error,
                errno=e.errno,
            ) from None
        if e.errno == _errno.EBUSY:
            raise CommitError(
                "%s: cannot commit: it was written to while committing, so it is writing "
                "again (it commits on its own once quiet; or commit again once its writer "
                "is done)" % path,
                path=path,
                state=WRITING,
                error="",
                errno=e.errno,
            ) from None
        if e.errno in (_errno.ENOTSUP, _errno.EROFS, _errno.EPERM):
            raise NotACheckpointError(
                "%s: not a checkpoint directory of a writable ckptfs mount" % path,
                path=path,
                errno=e.errno,
            ) from None
        raise _why(e, path) from None
    if not wait:
        return _read_state(path)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        st = _read_state(path)
        if st.state != PACKING:
            break
        if deadline is not None and time.monotonic() >= deadline:
            raise CommitTimeout(
                "%s: still packing after %gs (%d of %d bytes)" % (path, timeout, st.done, st.total),
                path=path,
                status=st,
            )
        time.sleep(POLL_SECONDS)
    if st.state == COMMITTED:
        return st
    if st.state == FAILED:
        raise CommitError(
            "%s: packing failed: %s (staged data is kept; fix the cause and commit again)"
            % (path, st.error or "no reason recorded"),
            path=path,
            state=st.state,
            error=st.error,
        )
    if st.state in (KEY_MISMATCH, DAMAGED):
        raise CommitError(
            "%s: packed, but the pack cannot be read (%s): %s"
            % (path, st.state, st.error or "no reason recorded"),
            path=path,
            state=st.state,
            error=st.error,
        )
    raise CommitError(
        "%s: not committed: it is %s again" % (path, st.state), path=path, state=st.state, error=st.error
    )
