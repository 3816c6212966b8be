"""A learner's progress, kept locally as JSON: what was tried, what passed, hints seen.

The file lives in the user's config folder (``$XDG_CONFIG_HOME`` or ``~/.config``), so it
survives a fresh clone; ``$WORKBENCH_PROGRESS`` or a ``path`` argument moves it (tests do).
It is read and written whole: one learner, a few dozen exercises.
"""
from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path


def progress_path(path: str | Path | None = None) -> Path:
    if path:
        return Path(path)
    if os.environ.get("WORKBENCH_PROGRESS"):
        return Path(os.environ["WORKBENCH_PROGRESS"])
    config = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return config / "amd-gpu-workbench" / "progress.json"


def load(path: str | Path | None = None) -> dict[str, dict]:
    """Exercise key -> {"passed", "attempts", "hints", "last_message", "updated"}."""
    file = progress_path(path)
    if not file.exists():
        return {}
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(f"{file} is not valid JSON ({error}); move it away to start over") from error


def _update(key: str, change, path) -> dict:
    state = load(path)
    entry = state.setdefault(key, {"passed": False, "attempts": 0, "hints": 0, "last_message": ""})
    change(entry)
    entry["updated"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    file = progress_path(path)
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(json.dumps(state, indent=1, sort_keys=True), encoding="utf-8")
    return entry


def record_attempt(key: str, passed: bool, message: str, path=None) -> dict:
    def change(entry):
        entry["attempts"] += 1
        entry["passed"] = entry["passed"] or passed   # a pass is kept once earned
        entry["last_message"] = message
    return _update(key, change, path)


def record_hints(key: str, shown: int, path=None) -> dict:
    def change(entry):
        entry["hints"] = max(entry["hints"], shown)
    return _update(key, change, path)
