"""The model against this project's own measurements: each measured row of a results file
(what ``workbench gpu-report`` records) beside the prediction for the same rung, pass,
shape, dtype and GPU.

Published points validate the model against other people's kernels
(:mod:`.validation`); a GPU that ran the rungs themselves validates it against the kernels
it models, rung by rung, which is the comparison that says whether a predicted speed-up
between two rungs is real. ``error %`` is signed as in the validation table: the model's
TFLOP/s over the measured ones, minus one (positive: the model is optimistic). A row's GPU
is the spec its device name names, as torch gave it ("NVIDIA H100 80GB HBM3", "AMD Instinct
MI300X VF"), on the row's target (:func:`roofline.device_spec`, as the tuners know the GPU
they run on).
"""
from __future__ import annotations

from typing import Callable, Iterable

import roofline

from ..harness.results import ResultRow
from ..harness.table import format_table
from .covered import predict, predict_backward
from .prediction import NotCovered

PREDICTORS = {"forward": predict, "backward": predict_backward}
"""The passes the model predicts alone (a timed ``forward+backward`` is left out)."""


def compare(rows: Iterable[ResultRow], stop: Callable[[], bool] = lambda: False
            ) -> tuple[list[dict], list[str]]:
    """(one row per measured case the model covers, the cases left out with why, one line
    per rung and pass). Reference and error rows are not cases. ``stop()`` is asked before
    each prediction (each compiles its rung for the GPU's target ahead of time, seconds on a
    busy CPU); once it says yes, the cases left say so. A case the model fails on (a defect,
    not a case it declines) is left out with the error, so a GPU session's one run of
    ``workbench gpu-report`` still compares every other case."""
    table: list[dict] = []
    left: dict[str, str] = {}
    for row in rows:
        if row.status != "ok" or row.rung == "ref":
            continue
        case = f"{row.op} {row.rung} {row.pass_name} on {row.gpu}"
        if case in left:
            continue
        predictor = PREDICTORS.get(row.pass_name)
        if predictor is None:
            left[case] = f"the model predicts the {' and '.join(PREDICTORS)} passes alone, not {row.pass_name}"
            continue
        if stop():
            left[case] = "not predicted: the time allowed was spent"
            continue
        try:
            gpu = roofline.device_spec(row.gpu, row.arch).name   # the device's name as torch gave it
            p = predictor(row.op, row.rung, tuple(int(n) for n in row.shape.split("x")), row.dtype, gpu)
        except (NotCovered, KeyError) as why:   # KeyError: a GPU roofline has no spec for
            left[case] = str(why).strip('"')
            continue
        except Exception as error:   # a model defect on this case: named; the other cases go on
            left[case] = f"the model failed: {type(error).__name__}: {error}"
            continue
        model_ms = p.time_s * 1e3
        table.append({"op": row.op, "rung": row.rung, "pass": row.pass_name, "shape": row.shape,
                      "dtype": row.dtype, "gpu": row.gpu, "measured ms": row.ms, "model ms": round(model_ms, 4),
                      "error %": round(100 * (row.ms / model_ms - 1), 1), "bound (model)": p.bound})
    return table, [f"{case}: {why}" for case, why in left.items()]


def report(table: list[dict], left: list[str]) -> str:
    """The comparison as ``workbench predict --against`` and ``workbench gpu-report`` print it."""
    lines = ["model against measured (error % = model TFLOP/s / measured - 1; model: predicted "
             "from this GPU's compiled code):",
             format_table(table) if table else "no measured row is a case the model covers"]
    return "\n".join(lines + [f"left out: {why}" for why in left])
