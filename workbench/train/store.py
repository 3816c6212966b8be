"""Training-step rows on disk: their own small JSON beside ``workbench.results``.

A training row (loss, grad norm, step time, MFU, ...) is not a kernel benchmark row
(op, rung, shape, ...), so it gets its own schema name rather than bending that one.
Saved like :func:`workbench.results.save`, whole or not at all, each time the loop reads
its steps' numbers (every ``loop.READ_EVERY`` steps and after the last), so an interrupted
run keeps the steps read before it; a resumed run appends to the rows of the run it
continues (:func:`rows_before`). Version 2 added ``tuning_s`` and ``untuned``,
version 3 ``fp8`` (the run's FP8 recipe, or None), version 4 ``fp8_keep`` (the layers that
recipe left in high precision, :mod:`.fp8_layers`, or None).
"""
from __future__ import annotations

import json
from pathlib import Path

from kernels.atomic import write_atomic

SCHEMA = "amd-kernel-workbench/train"
VERSION = 4
FIELDS = (
    "step", "loss", "grad_norm",
    "step_ms", "tokens_per_s",     # device time between events around the step (host clock on the
                                   # CPU); performance only on a GPU backend
    "tflops", "mfu",               # model FLOP/s per GPU and its fraction of peak; None off a GPU
    "peak_mem_gib", "op_ms",       # GPU memory high-water mark; profiler's top ops (profile=True)
    "tuning_s", "untuned",         # the tuning pass's seconds (per run); keys this step ran untuned
    "preset", "kernels", "fp8", "fp8_keep", "compile", "dtype", "world_size", "seed",
    "backend", "gpu", "commit", "timestamp",
)


def save(rows: list[dict], path) -> Path:
    path = Path(path)
    if path.suffix != ".json":
        raise ValueError(f"{path}: training rows are saved as .json")
    return write_atomic(path, json.dumps({"schema": SCHEMA, "version": VERSION, "rows": rows},
                                         indent=1) + "\n")


def load(path) -> list[dict]:
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise ValueError(f"{path}: not valid JSON ({type(exc).__name__}: {exc})") from exc
    if (not isinstance(doc, dict) or doc.get("schema") != SCHEMA or doc.get("version") != VERSION
            or not isinstance(doc.get("rows"), list)):
        raise ValueError(f"{path}: not a training-rows file ({SCHEMA} version {VERSION})")
    for i, row in enumerate(doc["rows"]):
        if not isinstance(row, dict) or set(row) != set(FIELDS):
            raise ValueError(f"{path} row {i}: fields {sorted(row) if isinstance(row, dict) else row!r}, "
                             f"expected {sorted(FIELDS)}")
    return doc["rows"]


def rows_before(path, step: int) -> list[dict]:
    """The rows in ``path`` of steps up to ``step`` ([] without a file): what a run resumed
    from step ``step`` appends to. Rows of later steps (a run that went on past that
    checkpoint) are dropped, so each step is in the file once."""
    path = Path(path)
    return [r for r in load(path) if r["step"] <= step] if path.exists() else []
