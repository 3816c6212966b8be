"""A learner's progress, kept locally as JSON: what was tried, what passed, hints seen.

The file lives in the user's config folder (``$XDG_CONFIG_HOME`` or ``~/.config``), so it
survives a fresh clone; ``$WORKBENCH_PROGRESS`` or a ``path`` argument moves it (tests do).
It is read and written whole: one learner, a few dozen exercises.

Several processes may record at once (a notebook and a terminal, parallel checks), so each
read-modify-write holds a file lock (``<file>.lock``) and writes atomically: no attempt is
lost and the file is never torn. A file that is not JSON at all (a crash of an older
version, a disk error) is moved aside, with a warning naming both files, and a new one is
started: refusing it would stop every command for good. A file that is JSON but not
progress (a wrong path, say) is an error that names it, and is left alone. Where the file
cannot be written (read-only), an attempt still gets its grade and a warning says it was
not saved.

An attempt is a new thing graded: checking the same file (or answer) again, as every Run
All of a notebook does, grades it and shows the verdict but does not count another
attempt. The entry keeps a digest of what it last graded for that (``graded``; files from
before it have none, and their next check counts).
"""
from __future__ import annotations

import json
import os
import warnings
from datetime import datetime, timezone
from pathlib import Path

from filelock import FileLock

from kernels.atomic import write_atomic

LOCK_TIMEOUT_S = 60
ENTRY = {"passed": bool, "attempts": int, "hints": int, "last_message": str, "updated": str}
OPTIONAL = {"graded": str}


class ProgressFileError(ValueError):
    """The progress file is JSON but not a learner's progress."""


class ProgressWarning(UserWarning):
    """The progress file was restarted, or an attempt could not be saved."""


def progress_path(path: str | Path | None = None) -> Path:
    if path:
        return Path(path)
    if os.environ.get("WORKBENCH_PROGRESS"):
        return Path(os.environ["WORKBENCH_PROGRESS"])
    config = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return config / "amd-gpu-workbench" / "progress.json"


def _checked(state, file: Path) -> dict[str, dict]:
    if not isinstance(state, dict):
        kind = {list: "an array", type(None): "null", str: "a string", bool: "a boolean"}.get(
            type(state), "a number")
        raise ProgressFileError(f"{file} holds {kind}, not exercise progress (an object of "
                                f"exercise key -> entry); point WORKBENCH_PROGRESS elsewhere or "
                                f"move the file away")
    kinds = {**ENTRY, **OPTIONAL}
    for key, entry in state.items():
        if not (isinstance(entry, dict) and ENTRY.keys() <= entry.keys() <= kinds.keys() and all(
                isinstance(value, kinds[k]) and (kinds[k] is bool or not isinstance(value, bool))
                for k, value in entry.items())):
            raise ProgressFileError(f"{file}: the entry for {key!r} is not exercise progress "
                                    f"({', '.join(f'{k}: {t.__name__}' for k, t in ENTRY.items())}): "
                                    f"{entry!r}")
    return state


def _read(file: Path) -> dict[str, dict] | None:
    """The progress in ``file`` ({} when there is none), or None when it is not JSON."""
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except UnicodeDecodeError:
        return None
    try:
        return _checked(json.loads(text), file)
    except (json.JSONDecodeError, RecursionError):
        return None


def _read_or_restart(file: Path) -> dict[str, dict]:
    """:func:`_read`, moving a file that is not JSON aside; only under the file's lock, so two
    processes never both move it (the second would move the first's new file)."""
    state = _read(file)
    if state is None:
        aside = file.with_name(f"{file.name}.corrupt-{datetime.now(timezone.utc):%Y%m%dT%H%M%S%f}")
        os.replace(file, aside)
        warnings.warn(f"{file} was not valid JSON; moved it to {aside} and started a new progress "
                      f"file", ProgressWarning, stacklevel=4)
        state = {}
    return state


def _lock(file: Path) -> FileLock:
    return FileLock(f"{file}.lock", timeout=LOCK_TIMEOUT_S)


def load(path: str | Path | None = None) -> dict[str, dict]:
    """Exercise key -> {"passed", "attempts", "hints", "last_message", "updated"}."""
    file = progress_path(path)
    state = _read(file)   # no lock to read: writes are atomic, a reader sees a whole file
    if state is None:
        with _lock(file):
            state = _read_or_restart(file)
    return state


def _changed(state: dict, key: str, change) -> dict:
    entry = state.setdefault(key, {"passed": False, "attempts": 0, "hints": 0, "last_message": ""})
    change(entry)
    entry["updated"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    return entry


def _update(key: str, change, path) -> dict:
    file = progress_path(path)
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        with _lock(file):
            state = _read_or_restart(file)
            entry = _changed(state, key, change)
            write_atomic(file, json.dumps(state, indent=1, sort_keys=True))
        return entry
    except OSError as error:   # read-only file, folder or disk, or the lock timed out
        warnings.warn(f"progress not saved to {file}: {error}", ProgressWarning, stacklevel=3)
        return _changed(_read(file) or {}, key, change)


def record_attempt(key: str, passed: bool, message: str, path=None, graded: str | None = None) -> dict:
    """Record a grade; ``graded`` is a digest of what was graded: the same digest as last
    time is the same attempt again, not a new one."""
    def change(entry):
        if graded is None or entry.get("graded") != graded:
            entry["attempts"] += 1
        if graded is not None:
            entry["graded"] = graded
        entry["passed"] = entry["passed"] or passed   # a pass is kept once earned
        entry["last_message"] = message
    return _update(key, change, path)


def record_hints(key: str, shown: int, path=None) -> dict:
    def change(entry):
        entry["hints"] = max(entry["hints"], shown)
    return _update(key, change, path)
