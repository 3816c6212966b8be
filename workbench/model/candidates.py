"""A tuned rung predicted at one of its candidate configs: what the tuners rank by.

:func:`workbench.model.predict` predicts a rung with the config it would choose
itself; a tuner asks about each config its pruned space keeps. :func:`predict_config`
pins ``config`` for the call, and the rung's plan (:func:`.gemm.plan`) takes the
pinned config in place of its own choice. Only the tuned rungs take one (GEMM v5, v6,
attention v4, the FP8 GEMM's v1 and v2; and, one launch at a time, :data:`workbench.model.LAUNCHES`: grouped GEMM v4's
forward, dX and dW, MoE v3's two kernels, attention v5's two backward kernels, each binary of the FP8 GEMM's v1 and v2 at each operand layout): the others
have a single config, and pinning one there is refused, not ignored (a prediction whose
config is not the pinned one is refused too).
"""
from __future__ import annotations

import dataclasses

from .covered import predict, predict_launch
from .pinned import pinning
from .prediction import Prediction


def predict_config(op: str, rung: int | str, shape, dtype, gpu: str, config: dict,
                   kernel: str | None = None) -> Prediction:
    """``predict(op, rung, shape, dtype, gpu)`` with the tile config ``config`` (a tuner's
    candidate: tile sizes, warps, stages, AMD knobs) instead of the rung's own choice;
    ``kernel``: the one launch of a rung that tunes several (``predict_launch``)."""
    with pinning(config):
        found = (predict(op, rung, shape, dtype, gpu) if kernel is None
                 else predict_launch(op, rung, kernel, shape, dtype, gpu))
    used = found.inputs.get("config", ({}, ""))[0]
    if any(used.get(name) != value for name, value in config.items()):
        raise NotImplementedError(f"the model's {op} {found.rung} predicts its own config, not a pinned one")
    return dataclasses.replace(found, inputs={**found.inputs, "config": (used, "a tuner's candidate, pinned")})
