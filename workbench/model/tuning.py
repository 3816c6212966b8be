"""The tuners' ranker: the performance model orders a tuned rung's candidates (labelled model).

A tuned rung (:func:`kernels.tuning.choice`) times the candidates its pruned space keeps
for a new key: seconds per key on a GPU, and impossible where nothing may be timed
(a training step in frozen mode, CUDA-graph capture), where it used to take the first
candidate, a fixed prior. :class:`ModelRanker` predicts every candidate with the
performance model (:func:`workbench.model.candidates.predict_config`) and gives the
tuner a shortlist: the candidates predicted within :data:`SPREAD` of the best, at most
:data:`MOST`, the best of each tile shape first (:func:`tile`), best first. The tuner times only those, and an untimed key takes the
model's best. ``kernels`` never imports this module: :func:`ranking` installs the
ranker (:func:`kernels.tuning.set_ranker`) for a block, and the training benchmark
runs inside one (:func:`ranked_by_model`).

Why a spread and not the model's best alone: the model's error against published
measurements is tens of percent (``workbench/model/published.yaml``, printed by
``tests/test_model_validation.py``), so candidates it predicts close together it cannot
order; timing them settles it. Every other candidate is one the
model predicts clearly slower, and is not timed: if the model is wrong about one of
those, the tuner misses it. Only a GPU can show how often that happens; no GPU timing
of these candidates exists in this repository.

Cost: each prediction compiles its candidate ahead of time (seconds, cold); predictions
are kept for the process. The ranker answers None (the tuner then falls back to the
prior: every candidate timed, the first taken untimed) on the interpreter (one
candidate, and no GPU to predict for) unless a GPU is named, on a GPU roofline does not
know, and wherever the model has no prediction for a candidate (an op, a rung, a GPU or
a dtype it does not cover).
"""
from __future__ import annotations

import contextlib
import functools
from typing import Callable, Iterator

import roofline

import kernels
from kernels import tuning

from .candidates import predict_config
from .rung import NO_MODEL

SPREAD = 1.25   # candidates predicted within 25 % of the best are timed...
MOST = 4        # ...at most this many (the tuning pass's time on a GPU)


@functools.lru_cache(maxsize=None)
def predicted_seconds(op: str, rung: str, shape: tuple, dtype: str, gpu: str, config: tuple,
                      kernel: str | None = None) -> float:
    """The model's time of one candidate (``config`` as sorted items; ``kernel``: the launch
    of a rung that tunes several), once per process."""
    return predict_config(op, rung, shape, dtype, gpu, dict(config), kernel).time_s


def gpu_here() -> str | None:
    """The roofline name of this process's GPU, or None (the interpreter, an unknown GPU): by
    torch's device name, its target and compute units (:func:`roofline.device_spec`)."""
    here = kernels.backend.current()
    if not here.is_gpu:
        return None
    try:
        return roofline.device_spec(here.device_name, here.arch, here.compute_units).name
    except KeyError:
        return None


class ModelRanker:
    """A :data:`kernels.tuning.Ranker` from the performance model; ``gpu`` names the GPU to
    predict for (default: this process's, none on the interpreter)."""

    def __init__(self, gpu: str | None = None, spread: float = SPREAD, most: int = MOST):
        if spread < 1 or most < 1:
            raise ValueError(f"spread must be >= 1 and most >= 1, got {spread} and {most}")
        self.gpu, self.spread, self.most = gpu and roofline.spec(gpu).name, spread, most

    def predictions(self, problem: tuning.Problem, candidates: list[dict]) -> list[float] | None:
        """The model's seconds per candidate, or None where it has no prediction for one."""
        gpu = self.gpu or gpu_here()
        if gpu is None:
            return None
        dtype = roofline.dtype_name(problem.dtype)
        try:
            return [predicted_seconds(problem.op, problem.rung, tuple(problem.shape), dtype, gpu,
                                      tuple(sorted(c.items())), problem.kernel) for c in candidates]
        except (*NO_MODEL, RuntimeError):   # RuntimeError: a candidate's compile failed here
            return None

    def __call__(self, problem: tuning.Problem, candidates: list[dict]) -> list[int] | None:
        seconds = self.predictions(problem, candidates)
        if seconds is None:
            return None
        order = sorted(range(len(candidates)), key=seconds.__getitem__)   # ties keep candidate order
        best = seconds[order[0]]
        within = [i for i in order if seconds[i] <= best * self.spread]
        tiles, firsts = set(), []
        for i in within:
            if tile(candidates[i]) not in tiles:
                tiles.add(tile(candidates[i]))
                firsts.append(i)
        return (firsts + [i for i in within if i not in firsts])[:self.most]


def tile(config: dict) -> tuple:
    """A candidate's tile shape: its ``BLOCK_*`` entries. The shortlist takes each shape's
    best before any shape's second: candidates of one tile that differ in a knob the model
    weighs little (``waves_per_eu`` where the registers fit either way, ``kpack``, the MFMA
    shape) can come out closer together than the model's error can order, and four of them
    would leave every other tile shape untimed."""
    return tuple(sorted((k, v) for k, v in config.items() if k.startswith("BLOCK")))


@contextlib.contextmanager
def ranking(ranker: tuning.Ranker | None = None) -> Iterator[tuning.Ranker]:
    """Within the block the tuners rank by ``ranker`` (default: a :class:`ModelRanker` for
    this process's GPU); the ranker before is restored after."""
    ranker = ranker or ModelRanker()
    before = tuning.set_ranker(ranker)
    try:
        yield ranker
    finally:
        tuning.set_ranker(before)


def ranked_by_model(fn: Callable) -> Callable:
    """``fn``, run with the model ranking the tuners' candidates (:func:`ranking`)."""
    @functools.wraps(fn)
    def ranked(*args, **kwargs):
        with ranking():
            return fn(*args, **kwargs)
    return ranked
