"""The exceptions of the ckptfs package. All derive from :class:`CkptfsError`."""


class CkptfsError(Exception):
    """Base class of every error this package raises on purpose.

    ``path`` is the file or directory concerned (or None), ``errno`` the
    operating system's error number when one caused it (or None).
    """

    def __init__(self, message, path=None, errno=None):
        super().__init__(message)
        self.path = path
        self.errno = errno


class NotACheckpointError(CkptfsError):
    """The path is not a checkpoint directory of a ckptfs mount (or not
    one that can do what was asked, such as committing on a read-only
    mount), or it does not exist."""


class CommitError(CkptfsError):
    """Packing a checkpoint failed, or it could not be committed.

    ``state`` is the checkpoint's state afterwards (``"failed"``, or
    ``"writing"`` when someone wrote into it again) and ``error`` the
    daemon's reason (``user.ckptfs.error``), or "" when it gave none.
    The staged data is kept: fix the cause and commit again.
    """

    def __init__(self, message, path=None, state=None, error="", errno=None):
        super().__init__(message, path=path, errno=errno)
        self.state = state
        self.error = error


class CommitTimeout(CkptfsError, TimeoutError):
    """``commit(wait=True, timeout=...)`` gave up before packing ended; the
    checkpoint keeps packing in the daemon. ``status`` is the last state seen."""

    def __init__(self, message, path=None, status=None):
        super().__init__(message, path=path)
        self.status = status


class UnsupportedDtypeError(CkptfsError, TypeError):
    """A dtype this package does not know, or one the installed torch lacks
    (float8 before torch 2.1, uint16/32/64 before torch 2.3)."""
