"""Ladder rows from the performance model (``workbench.predict``): numbers labelled "model".

A prediction compiles its rung ahead of time for the GPU's target (seconds per rung when
no compile is cached) and the profiler asks for it at every run, so predictions are kept
for the process per (op, rung, shape, dtype, GPU), in the cache the rung pages share
(:func:`workbench.model.rung.predicted`). What the model does not cover it refuses with
``NotImplementedError`` (op, rung, GPU) or ``ValueError`` (dtype); those rungs keep no
numbers, and one note, not one per rung, says why.
"""
from __future__ import annotations

import re

import roofline

from ..model.rung import NO_MODEL, predicted


def predictions(op: str, labels: list[str], shape: tuple, dtype: str, gpu: str,
                step) -> tuple[dict, dict[str, str]]:
    """(label -> Prediction, label -> why the model has none); ``step()`` after each rung."""
    found, missing = {}, {}
    for label in labels:
        try:
            found[label] = predicted(op, label, shape, dtype, gpu)
        except NO_MODEL as error:
            missing[label] = str(error)
        step()
    return found, missing


def model_numbers(found: dict, bytes_moved: float) -> dict[str, dict]:
    """What ``ladder_cells`` reads, per predicted rung; GB/s is the minimum traffic over the
    predicted time, as for a measured row. A model has no date."""
    return {label: dict(ms=p.time_s * 1e3, tflops=p.tflops, gbps=bytes_moved / p.time_s / 1e9,
                        dtype=p.dtype, gpu=p.gpu, date=None) for label, p in found.items()}


def model_columns(found: dict) -> dict[str, dict]:
    """The model's time and binding resource, shown beside whatever the row's numbers are."""
    return {label: dict(model_ms=p.time_s * 1e3, bound=p.bound) for label, p in found.items()}


def model_points(found: dict, labels: list[str], flops: float, bytes_moved: float, op: str,
                 shape: str) -> list[roofline.Point]:
    """Each predicted rung at its predicted height on the roofline."""
    return [roofline.point(p.gpu, label, flops, bytes_moved, p.time_s * 1e3, p.dtype, "model",
                           op=op, shape=shape) for label in labels if (p := found.get(label))]


def model_notes(found: dict, missing: dict[str, str]) -> list[str]:
    """Where the model's numbers come from, which rungs have none and why, and what ref lacks.

    Reasons that differ only in the rung they name ("..., not v0", "..., not v1") are
    given once, naming those rungs together.
    """
    notes = []
    if found:
        gpu = next(iter(found.values())).gpu
        notes.append(f"model_ms, bound: the performance model's time and binding resource on {gpu} "
                     "(workbench.predict, from each rung compiled for that GPU), not measured.")
    uncovered = [label for label in missing if label != "ref"]
    if uncovered:
        reasons: dict[str, list[str]] = {}
        for label in uncovered:
            reasons.setdefault(re.sub(rf"\b{re.escape(label)}\b", "{rungs}", missing[label]), []).append(label)
        why = "; ".join(reason.replace("{rungs}", ", ".join(labels)) for reason, labels in reasons.items())
        notes.append(f"No model numbers for {', '.join(uncovered)}: {why}.")
    if found and "ref" in missing:
        notes.append("ref is a library call: the model does not cover it, so model rows have no vs_ref.")
    return notes
