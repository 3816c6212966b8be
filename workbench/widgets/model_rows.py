"""Ladder rows from the performance model (``workbench.predict``): numbers labelled "model".

A prediction compiles its rung ahead of time for the GPU's target (seconds per rung when
no compile is cached) and the profiler asks for it at every run, so predictions are kept
for the process per (op, rung, shape, dtype, GPU), in the cache the rung pages share
(:func:`workbench.model.rung.predicted`). What the model does not cover it refuses with
``NotImplementedError`` (op, rung, GPU) or ``ValueError`` (dtype); those rungs keep no
numbers, and one note, not one per rung, says why.

The notebooks' roofline charts place rungs through :func:`rung_points`: a rung the model
covers at its predicted height, any other at its roofline ceiling, named as one.
"""
from __future__ import annotations

import re
from typing import Mapping

import roofline

import kernels

from ..model.rung import NO_MODEL, predicted


def predictions(op: str, labels: list[str], shape: tuple, dtype: str, gpu: str,
                step, backward: bool = False) -> tuple[dict, dict[str, str]]:
    """(label -> Prediction, label -> why the model has none); ``step()`` after each rung;
    ``backward``: the backward pass's predictions (``workbench.model.predict_backward``)."""
    found, missing = {}, {}
    for label in labels:
        try:
            found[label] = predicted(op, label, shape, dtype, gpu, backward)
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
    return [_predicted_point(p, label, flops, bytes_moved, op, shape) for label in labels if (p := found.get(label))]


def rung_points(op: str, labels: list[str], shape: tuple, dtype, gpu: str, backward: bool = False,
                traffic: Mapping[str, float] | None = None) -> tuple[list[roofline.Point], dict[str, str]]:
    """(roofline points of ``op``'s rungs ``labels`` at ``shape`` in ``dtype`` (a torch dtype)
    on ``gpu``, in the order of ``labels``; label -> why the model has no prediction for it).

    A rung the model covers sits at its predicted height, source ``model``, named
    "<op> <label>" (" backward" added for that pass); any other at the roofline's ceiling
    over its intensity, with " (ceiling)" added to its name (:func:`roofline.ceiling_point`),
    so that no chart draws a rung the model does not cover as if it had a speed. A point's
    intensity is the op's FLOPs (``backward_flops`` for ``backward``) over ``traffic[label]``
    where given (a rung's own traffic model), else over the op's minimum forward bytes; the
    spec has no minimum for a backward, so its traffic must be given.
    """
    spec, traffic = kernels.spec(op), dict(traffic or {})
    if backward and not set(labels) <= set(traffic):
        raise ValueError(f"a backward point needs its traffic: give traffic for {', '.join(labels)}")
    flops = spec.backward_flops(shape) if backward else spec.flops(shape)
    found, missing = predictions(op, labels, shape, roofline.dtype_name(dtype), gpu, lambda: None, backward)
    where = "x".join(map(str, shape))
    points = []
    for label in labels:
        name = f"{op} {label}{' backward' if backward else ''}"
        nbytes = traffic.get(label) or spec.bytes_moved(shape, dtype)
        points.append(_predicted_point(found[label], name, flops, nbytes, op, where) if label in found
                      else roofline.ceiling_point(gpu, name, flops, nbytes, dtype, op, where))
    return points, missing


def _predicted_point(p, name: str, flops: float, bytes_moved: float, op: str, shape: str) -> roofline.Point:
    return roofline.point(p.gpu, name, flops, bytes_moved, p.time_s * 1e3, p.dtype, "model", op=op, shape=shape)


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
