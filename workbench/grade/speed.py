"""Speed: the performance model beside the op's ladder (labelled model), and on a GPU the
file's callable timed with ``ref`` and the ladder's top rung in the same run.

The model is asked about every rung of the ladder on each GPU; what it does not cover it
says by raising ``NotImplementedError``, and that sentence is reported once for all the
rungs it names (no list of covered ops here: the model grows). The file's own kernels
are modelled by :mod:`.file_model`.
"""
from __future__ import annotations

import re

import torch

import kernels

GPUS = ("MI300X", "MI355X")


def machine_code_dtype(dtypes) -> torch.dtype:
    """The dtype the machine code and the model are shown for: bf16 where claimed."""
    return torch.bfloat16 if torch.bfloat16 in dtypes else list(dtypes)[0]


def model_shape(spec) -> tuple:
    """The op's first quick-suite benchmark shape: what a GPU run times, at a GPU size."""
    name = spec.quick_shapes[0] if spec.quick_shapes else next(iter(spec.bench_shapes))
    return tuple(spec.bench_shapes[name])


def top_rung(op: str, dtype: torch.dtype, *, compiles: bool = False):
    """The ladder's highest rung for ``dtype``: one with an ahead-of-time compile
    (``compiles``), else one that runs here; None when there is none."""
    fitting = [r for r in kernels.variants(op, include_ref=False) if dtype in r.dtypes
               and (r.aot is not None if compiles else r.runs_here() and r.supports(dtype))]
    return fitting[-1] if fitting else None


def predictions(op: str, shape: tuple, dtype: torch.dtype, gpus=GPUS) -> tuple[list[dict], list[str]]:
    """(rows of the model's predictions, notes on what it did not predict): the rungs it
    does not cover in one line per reason, not one per rung and GPU."""
    from ..model import predict

    rows, uncovered, notes = [], {}, []
    for gpu in gpus:
        for rung in kernels.variants(op):
            try:
                rows.append(predict(op, rung.label, shape, dtype, gpu).row())
            except NotImplementedError as error:
                # the model names the rung it was asked about last ("..., not v0"): one reason for all
                reason = re.sub(rf",? not {re.escape(rung.label)}$", "", str(error))
                uncovered.setdefault(reason, {}).setdefault(rung.label, []).append(gpu)
            except (ValueError, RuntimeError) as error:
                notes.append(f"{rung.label} on {gpu}: the model failed: {error}")
    if not rows:
        return [], [f"no model for this op yet ({next(iter(uncovered), op)})", *notes]
    for reason, where in uncovered.items():
        on = {tuple(g) for g in where.values()}
        labels = ", ".join(f"{label}{'' if len(on) == 1 else ' on ' + ', '.join(g)}" for label, g in where.items())
        notes.insert(0, f"not covered: {labels}{' on ' + ', '.join(on.pop()) if len(on) == 1 else ''} ({reason})")
    return rows, notes


def measure(entry, problem, shape: tuple, dtype: torch.dtype) -> dict:
    """On a GPU: the callable, ``ref`` and the top rung timed in one run at ``shape``."""
    from ..harness.environment import describe
    from ..harness.timing import time_ms

    spec = problem.spec
    inputs = spec.make_inputs(shape, dtype, device=kernels.backend.current().device, seed=0)
    flops = spec.flops(shape)
    timed = [("yours", lambda: entry(*inputs)), ("ref", problem.baseline.bind(*inputs))]
    top = top_rung(problem.op, dtype) if problem.registered else None
    if top is not None:
        timed.append((top.title, top.bind(*inputs)))
    rows = []
    for name, call in timed:
        try:
            ms = time_ms(call).median_ms
            rows.append({"kernel": name, "ms": ms, "TFLOP/s": flops / ms / 1e9})
        except Exception as error:   # one failing timing leaves the others standing
            rows.append({"kernel": name, "ms": None, "error": f"{type(error).__name__}: {error}"})
    mine = rows[0]["ms"]
    for row in rows:
        row["speedup (its ms / yours)"] = (row["ms"] / mine) if mine and row.get("ms") else None
    return {"gpu": describe()["device"], "shape": list(shape), "dtype": str(dtype),
            "rows": rows, "label": "measured"}
