"""A training run's file arguments (``resume``, ``checkpoint``, ``out``), checked up front.

A file found unusable after the last step costs the whole training, so :func:`.loop.run`
checks each one before the first step, and the error names the argument (the CLI's
``--resume``, ``--checkpoint``, ``--out``) as well as the file.
"""
from __future__ import annotations

from pathlib import Path


class FileArgumentError(ValueError):
    """A file argument of a run that cannot be used; ``argument`` is its name."""

    def __init__(self, argument: str, path, reason: str):
        self.argument, self.path, self.reason = argument, Path(path), reason
        super().__init__(f"{argument}={str(path)!r}: {reason}")


def writable(argument: str, path) -> Path:
    """``path`` as a file a run can save to: its folder exists and it is not a folder itself."""
    path = Path(path)
    if path.is_dir():
        raise FileArgumentError(argument, path, "is a folder; name a file in it")
    if not path.parent.is_dir():
        raise FileArgumentError(argument, path, f"folder {path.parent} does not exist")
    return path
