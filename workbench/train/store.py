"""Training-step rows on disk: their own small JSON beside ``workbench.results``.

A training row (loss, grad norm, step time, MFU, ...) is not a kernel benchmark row
(op, rung, shape, ...), so it gets its own schema name rather than bending that one.
Saved like :func:`workbench.results.save`: to a temporary file that replaces the
target, after every step, so an interrupted run keeps every step done.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

SCHEMA = "amd-kernel-workbench/train"
VERSION = 1
FIELDS = (
    "step", "loss", "grad_norm",
    "step_ms", "tokens_per_s",     # synchronized wall time; performance only on a GPU backend
    "tflops", "mfu",               # model FLOP/s per GPU and its fraction of peak; None off a GPU
    "peak_mem_gib", "op_ms",       # GPU memory high-water mark; profiler's top ops (profile=True)
    "preset", "kernels", "compile", "dtype", "world_size", "seed",
    "backend", "gpu", "commit", "timestamp",
)


def save(rows: list[dict], path) -> Path:
    path = Path(path)
    if path.suffix != ".json":
        raise ValueError(f"{path}: training rows are saved as .json")
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"schema": SCHEMA, "version": VERSION, "rows": rows}, indent=1) + "\n")
    os.replace(tmp, path)
    return path


def load(path) -> list[dict]:
    doc = json.loads(Path(path).read_text())
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or doc.get("version") != VERSION:
        raise ValueError(f"{path}: not a training-rows file ({SCHEMA} version {VERSION})")
    for i, row in enumerate(doc["rows"]):
        if set(row) != set(FIELDS):
            raise ValueError(f"{path} row {i}: fields {sorted(row)}, expected {sorted(FIELDS)}")
    return doc["rows"]
