"""The top rungs' goals (issue 18), judged from one ``workbench gpu-report`` run.

The optimized rungs are built to win on a GPU; these ratios say whether they do, each from
numbers measured in the same run: the quick suite's rows (a rung against ``ref`` at the same
shape, dtype and pass) and the short training comparison.

* Attention: the forward the public op runs (v4) at >= 1.0x SDPA, v5's backward at >= 0.9x
  SDPA's backward. The goal names SDPA's flash backend, and torch picks SDPA's backend per
  call (flash, memory-efficient or cuDNN on a GPU; the math one where none of them takes
  the inputs, slower by far), so each attention line names the backend SDPA chose at that
  shape and dtype (:func:`sdpa_backend`).
* The MoE layer's forward+backward (v3) at >= 1.5x the eager layer (``ref``).
* The training step (:data:`workbench.train.quick.PRESET`, ``gpu-moe-small``) at >= 1.1x eager
  PyTorch's. Its other goal, >= 1.0x ``torch.compile``'s step, is not run here (compiling
  alone takes most of a lent session): ``workbench train --compile`` measures it.

A goal not met is a verdict, not a failure of the report.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import torch
from torch.nn.attention import SDPBackend

import kernels

from .harness.results import ResultRow
from .harness.table import format_table
from .train import quick as train_quick


@dataclass(frozen=True)
class Goal:
    what: str
    op: str
    rung: str
    pass_name: str
    at_least: float   # the rung's speed over ref's, same shape, dtype, pass and run


GOALS = (Goal("attention forward vs SDPA", "attention", "v4", "forward", 1.0),
         Goal("attention backward vs SDPA", "attention", "v5", "backward", 0.9),
         Goal("MoE layer forward+backward vs eager", "moe", "v3", "forward+backward", 1.5))
STEP_GOAL = 1.1   # the workbench kernels' training step over eager PyTorch's
COMPILE_NOTE = "not run here: workbench train --compile (the step against torch.compile's, goal >= 1.0x)"


def met(ok: bool) -> str:
    return "met" if ok else "not met"


def sdpa_backend(shape: str, dtype: str, device=None) -> str:
    """The backend SDPA picks for attention's ``ref`` at ``shape`` (the spec's
    B x Hq x Hkv x S x Sk x D x causal) in ``dtype``, on ``device`` (default: the current
    backend's): torch's own choice (``torch._fused_sdp_choice``, the function SDPA asks,
    given empty tensors of the inputs' shapes), or "unknown" with the reason where torch
    cannot say (it is not public API)."""
    b, hq, hkv, s, sk, d, causal = map(int, shape.split("x"))
    like = dict(dtype=getattr(torch, dtype), device=device or kernels.backend.current().device)
    try:
        q, kv = torch.empty(b, hq, s, d, **like), torch.empty(b, hkv, sk, d, **like)
        choice = torch._fused_sdp_choice(q, kv, kv, None, 0.0, bool(causal), scale=None, enable_gqa=hq != hkv)
        return SDPBackend(choice).name
    except Exception as exc:   # a torch without it, or a choice it refuses to make
        return f"unknown ({type(exc).__name__}: {exc})"


def kernel_goals(rows: Iterable[ResultRow]) -> list[dict]:
    """One line per goal and case measured (shape, dtype): the rung's ratio to ``ref`` and
    the verdict; a goal whose rung this run did not measure, one line saying so."""
    rows = list(rows)
    table = []
    for goal in GOALS:
        found = [r for r in rows if (r.op, r.rung, r.pass_name) == (goal.op, goal.rung, goal.pass_name)]
        if not found:
            table.append(dict(goal=goal.what, rung=f"{goal.op} {goal.rung}", shape="-", dtype="-", ratio=None,
                              target=f">= {goal.at_least}x", verdict="not measured in this run", against="-"))
        for row in found:
            verdict = (f"error: {row.error}" if not row.ok else "no ref time in this run"
                       if row.ratio_to_ref is None else met(row.ratio_to_ref >= goal.at_least))
            against = f"SDPA {sdpa_backend(row.shape, row.dtype)}" if goal.op == "attention" else "eager layer"
            table.append(dict(goal=goal.what, rung=f"{goal.op} {goal.rung}", shape=row.shape, dtype=row.dtype,
                              ratio=row.ratio_to_ref, target=f">= {goal.at_least}x", verdict=verdict,
                              against=against))
    return table


def step_goal(summary: list[dict] | None) -> dict:
    """The training step's line: the workbench run's speedup over the eager torch run."""
    ours, theirs = train_quick.KERNEL_SETS[-1], train_quick.KERNEL_SETS[0]
    line = dict(goal="training step vs eager PyTorch", rung=train_quick.PRESET, shape="-", dtype="bf16",
                target=f">= {STEP_GOAL}x", against=f"{theirs} (eager)")
    mine = next((s for s in summary or () if s["run"] == ours), None)
    if mine is None:
        return {**line, "ratio": None, "verdict": "not run in this report"}
    return {**line, "ratio": mine["speedup"], "verdict": met(mine["speedup"] >= STEP_GOAL)}


def report(rows: Iterable[ResultRow], train_summary: list[dict] | None) -> str:
    """The goals as ``workbench gpu-report`` prints them."""
    table = kernel_goals(rows) + [step_goal(train_summary)]
    return "\n".join(["goals of the top rungs (ratio: ref's time / the rung's, in this run):",
                      format_table(table, ["goal", "rung", "shape", "dtype", "ratio", "target", "verdict", "against"]),
                      f"training step vs torch.compile: {COMPILE_NOTE}"])
