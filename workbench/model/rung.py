"""The performance model's word on one rung beside the rung below it (labelled "model").

A rung page (:mod:`.rung_view`) and a graded exercise (:mod:`.exercises`) state what the
model predicts for the rung and for the rung below at one representative shape of the
op, the speed-up between them and the resource that binds each ("matrix cores ->
LDS"): why the idea should pay, before any GPU has said whether it does. The shape is
the op's first quick-suite preset (the one ``workbench bench --suite quick`` times first
on a GPU), named as the op's spec names it.

Predictions compile rungs ahead of time (seconds each when cold), so they are kept for
the process per (op, rung, shape, dtype, GPU) (:func:`predicted`; the ladder profiler
shares them). What the model does not cover it refuses with ``NotImplementedError``
(op, rung, GPU) or ``ValueError`` (dtype): that rung then has "no model" and the reason.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import roofline

import kernels
from kernels.registry import Rung

from .. import model
from ..isa import normalize_target

NO_MODEL = (NotImplementedError, ValueError)   # what the model raises for what it does not cover


@functools.lru_cache(maxsize=None)
def predicted(op: str, rung: str, shape: tuple, dtype: str, gpu: str, backward: bool = False) -> model.Prediction:
    """``workbench.predict`` (``predict_backward`` for ``backward``), made once per key in this process."""
    return (model.predict_backward if backward else model.predict)(op, rung, shape, dtype, gpu)


def representative(op: str) -> tuple[str, tuple]:
    """(preset name, shape) the op is judged at: its first quick-suite shape."""
    spec = kernels.spec(op)
    name = spec.quick_shapes[0] if spec.quick_shapes else next(iter(spec.bench_shapes))
    return name, spec.bench_shapes[name]


def gpu_for(target: str) -> str:
    """The first known GPU (by name) whose ISA target is ``target`` ("gfx942" -> MI300X)."""
    wanted = normalize_target(target).replace("sm90", "sm_90")
    found = [name for name in roofline.gpus() if roofline.spec(name).target == wanted]
    if not found:
        raise ValueError(f"no GPU spec has target {target!r}")
    return roofline.spec(found[0]).name


def below(rung: Rung) -> Rung | None:
    """The nearest lower rung of the ladder that computes what ``rung`` does (a backward
    rung is not compared with a forward-only one); None for the first and for ``ref``."""
    if rung.rung is None:
        return None
    lower = [r for r in kernels.variants(rung.op, include_ref=False)
             if r.rung < rung.rung and r.backward == rung.backward]
    return lower[-1] if lower else None


def _ms(p: model.Prediction) -> str:
    return f"{p.time_s * 1e3:.4g} ms"


@dataclass(frozen=True)
class ModelStep:
    """A rung's prediction beside the rung below's, or why either has none."""

    op: str
    rung: str                          # its label, e.g. "v4"
    name: str                          # how the text calls it: "v4", or "your v4"
    below: str | None                  # the rung below's label, None for a ladder's first
    shape_name: str
    shape: tuple
    dtype: str
    gpu: str
    this: model.Prediction | None
    previous: model.Prediction | None
    why: str | None = None             # why ``this`` is None
    why_below: str | None = None       # why ``previous`` is None (with a rung below)

    @property
    def speedup(self) -> float | None:
        """The rung below's predicted time over this one's (above 1: predicted faster)."""
        if self.this is None or self.previous is None:
            return None
        return self.previous.time_s / self.this.time_s

    def where(self) -> str:
        return (f"{self.op} '{self.shape_name}' ({'x'.join(map(str, self.shape))}), "
                f"{self.dtype}, on {self.gpu}")

    def text(self) -> str:
        head = f"Model (predicted from the compiled code, not measured) at {self.where()}: "
        if self.this is None:
            return f"{head}no model for {self.name}: {self.why}"
        mine = f"{self.name} {_ms(self.this)}, {self.this.bound} bound"
        if self.below is None:
            return f"{head}{mine}; no rung below it computes the same, so no speed-up."
        if self.previous is None:
            return f"{head}{mine}; no model for {self.below} ({self.why_below}), so no speed-up."
        moved = (f"{self.previous.bound} bound in both" if self.previous.bound == self.this.bound
                 else f"{self.previous.bound} bound -> {self.this.bound} bound")
        return (f"{head}predicted speed-up of {self.name} over {self.below}: {self.speedup:.2f}x "
                f"({self.below} {_ms(self.previous)} -> {self.name} {_ms(self.this)}); {moved}.")

    def __str__(self) -> str:
        return self.text()


def step(op: str, which: int | str, dtype, gpu: str, source: str | Path | None = None) -> ModelStep:
    """The model's step from the rung below to ``which`` at the op's representative shape
    in ``dtype`` on ``gpu``; ``source`` predicts a learner's copy of ``which`` (that file
    compiled in its place, :func:`workbench.model.learner.predict_file`)."""
    rung = kernels.get(op, which)
    lower = below(rung)
    shape_name, shape = representative(op)
    name, gpu_name = roofline.dtype_name(dtype), roofline.spec(gpu).name
    this = previous = why = why_below = None
    try:
        if source is None:
            this = predicted(op, rung.label, shape, name, gpu_name)
        else:
            from .learner import predict_file
            this = predict_file(op, rung.label, source, shape, name, gpu_name)
    except NO_MODEL as error:
        why = str(error)
    if this is not None and lower is not None:
        try:
            previous = predicted(op, lower.label, shape, name, gpu_name)
        except NO_MODEL as error:
            why_below = str(error)
    return ModelStep(op, rung.label, rung.label if source is None else f"your {rung.label}",
                     lower.label if lower else None, shape_name, shape, name, gpu_name,
                     this, previous, why, why_below)
