"""The tuner's memory: one chosen config per (op, key), for the process and in a JSON file.

Timing a key's candidates launches each of them many times; a job that re-timed every
key on every start would pay that again on each one. So a choice, once timed, is kept in
a file that later processes read on their first lookup (:func:`store`).

A choice holds only for the code and compiler it was timed with, so there is one file per
identity (:func:`identity`): the GPU arch (``kernels.backend.current().arch``) and the
versions of torch, triton and this package. The file is
``$KERNELS_TUNING_DIR/<arch>-<12 hex digits of the versions' hash>.json``; without the
variable the folder is ``$XDG_CACHE_HOME`` (or ``~/.cache``)
``/amd-kernel-workbench/tuning``. Inside, the identity is written out again and checked:
a file that is not JSON, or is of another schema or identity, is ignored with a
:class:`TuningCacheWarning` (a cache must never stop a run) and replaced by the next save.

Keys are tuples of str, int, float, bool or None, and ``torch.dtype`` (written as its name,
``"bfloat16"``), so each is one JSON string. Saving merges this process's choices into the
file's under a file lock (``<file>.lock``) and writes the whole file atomically
(:func:`kernels.atomic.write_atomic`): two processes tuning at once both keep theirs, and
a reader never sees half a file. A file that cannot be written (read-only folder, lock
timeout) costs a warning; the choice still holds for the process.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import warnings
from pathlib import Path

import torch
from filelock import FileLock

from . import backend
from .atomic import write_atomic

SCHEMA = "amd-kernel-workbench/tuning"
VERSION = 1
ENV_DIR = "KERNELS_TUNING_DIR"
LOCK_TIMEOUT_S = 30


class TuningCacheWarning(UserWarning):
    """The cache file was ignored or could not be written; the run goes on without it."""


def _package_version() -> str:
    try:
        return importlib.metadata.version("amd-kernel-workbench")
    except importlib.metadata.PackageNotFoundError:   # a source checkout, not installed
        return "source"


def identity() -> dict[str, str]:
    """What a choice was timed with: GPU arch, torch, triton and this package's version."""
    import triton

    return {"arch": backend.current().arch, "torch": torch.__version__,
            "triton": triton.__version__, "kernels": _package_version()}


def path(ident: dict[str, str]) -> Path:
    """The cache file of ``ident`` (see the module docstring for the folder)."""
    folder = os.environ.get(ENV_DIR)
    if not folder:
        folder = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / \
            "amd-kernel-workbench" / "tuning"
    versions = json.dumps({k: v for k, v in ident.items() if k != "arch"}, sort_keys=True)
    return Path(folder) / f"{ident['arch']}-{hashlib.sha256(versions.encode()).hexdigest()[:12]}.json"


def key_text(key: tuple) -> str:
    """``key`` as one JSON string, dtypes by name; anything else not JSON-plain is an error."""
    def plain(part):
        if isinstance(part, torch.dtype):
            return str(part).removeprefix("torch.")
        if part is None or isinstance(part, (str, int, float, bool)):
            return part
        raise TypeError(f"tuning key {key!r}: {type(part).__name__} {part!r} is not a str, int, "
                        f"float, bool, None or torch.dtype")
    return json.dumps([plain(part) for part in key])


class Store:
    """The choices of one identity: ``{op: {key text: config}}``, read from its file once."""

    def __init__(self, ident: dict[str, str]):
        self.identity, self.path = ident, path(ident)
        self._choices: dict[str, dict[str, dict]] | None = None

    def _read(self) -> dict[str, dict[str, dict]]:
        """The file's choices; {} (with a warning unless there is no file) when unusable."""
        try:
            doc = json.loads(self.path.read_text(encoding="utf-8"))
        except (FileNotFoundError, NotADirectoryError):
            return {}
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
            return self._ignored(f"not readable JSON ({type(exc).__name__}: {exc})")
        if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or doc.get("version") != VERSION:
            return self._ignored(f"not a tuning cache ({SCHEMA} version {VERSION})")
        if doc.get("identity") != self.identity:
            return self._ignored(f"made for {doc.get('identity')!r}, not {self.identity!r}")
        choices = doc.get("choices")
        if not (isinstance(choices, dict) and all(
                isinstance(table, dict) and all(isinstance(c, dict) for c in table.values())
                for table in choices.values())):
            return self._ignored("its choices are not {op: {key: config}}")
        return choices

    def _ignored(self, why: str) -> dict:
        warnings.warn(f"tuning cache {self.path} ignored: {why}", TuningCacheWarning, stacklevel=5)
        return {}

    def _loaded(self) -> dict[str, dict[str, dict]]:
        if self._choices is None:
            self._choices = self._read()
        return self._choices

    def get(self, op: str, key: str) -> dict | None:
        """The config chosen for ``op`` at ``key`` (a :func:`key_text`), or None."""
        return self._loaded().get(op, {}).get(key)

    def choices(self) -> dict[str, dict[str, dict]]:
        """A copy of every choice this process knows (the file's and its own)."""
        return {op: dict(table) for op, table in self._loaded().items()}

    def put(self, choices: dict[str, dict[str, dict]]) -> None:
        """Take ``choices`` (``{op: {key text: config}}``) over the ones known, and save them."""
        for op, table in choices.items():
            self._loaded().setdefault(op, {}).update(table)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with FileLock(f"{self.path}.lock", timeout=LOCK_TIMEOUT_S):
                merged = self._read()
                for op, table in choices.items():
                    merged.setdefault(op, {}).update(table)
                write_atomic(self.path, json.dumps({"schema": SCHEMA, "version": VERSION,
                                                    "identity": self.identity, "choices": merged},
                                                   indent=1, sort_keys=True) + "\n")
        except OSError as exc:   # read-only folder or file, full disk, or the lock timed out
            warnings.warn(f"tuning choices not saved to {self.path}: {exc}", TuningCacheWarning,
                          stacklevel=3)


_store: Store | None = None


def store() -> Store:
    """This process's store, made (and its file read) on first use."""
    global _store
    if _store is None:
        _store = Store(identity())
    return _store


def forget() -> None:
    """Drop this process's store: the next :func:`store` reads the file again (tests)."""
    global _store
    _store = None
