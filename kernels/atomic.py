"""Whole-or-nothing file writes: the one way the workbench (and the tuner's cache) saves a file it reads again.

A file written in place is torn while the write runs: a crash, a Ctrl-C or a second
process reading at that moment sees half of it. Here the data goes to a temporary file
beside the target, is fsynced, and is then renamed over the target (``os.replace`` is
atomic within one folder), so a reader finds the old file or the new one, never a mix.
The temporary name is unique to the call, so two writers of one path never share (and
steal) a temporary file: the last rename wins and the file is whole either way.

A rename ignores the target's mode, so a target the user made read-only is refused with
the ``PermissionError`` that ``write_text`` would raise rather than silently replaced.
Serializing read-modify-write cycles is the caller's job (a lock), not this module's.
"""
from __future__ import annotations

import errno
import os
import secrets
from pathlib import Path
from typing import BinaryIO, Callable


def write_atomic(path, data: str | bytes | Callable[[BinaryIO], object]) -> Path:
    """Replace ``path`` with ``data``: text (UTF-8), bytes, or a function that writes to a
    binary file (e.g. ``lambda fh: torch.save(state, fh)``)."""
    path = Path(path)
    if path.exists() and not os.access(path, os.W_OK):
        raise PermissionError(errno.EACCES, "read-only file, left as it is", str(path))
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(6)}.tmp")
    # O_EXCL: never write into a file someone else created; mode 0o666 minus the umask, as
    # for any new file (tempfile.mkstemp's 0o600 would make results private to their owner).
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as fh:
            if callable(data):
                data(fh)
            else:
                fh.write(data.encode("utf-8") if isinstance(data, str) else data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path
