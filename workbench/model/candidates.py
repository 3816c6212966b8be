"""A tuned rung predicted at one of its candidate configs: what the tuners rank by.

:func:`workbench.model.predict` predicts a rung with the config it would choose
itself; a tuner asks about each config its pruned space keeps. :func:`predict_config`
pins ``config`` for the call, and the rung's plan (:func:`.gemm.plan`) takes the
pinned config in place of its own choice. Only the tuned rungs take one (GEMM v5, v6,
attention v4; and, one launch at a time, :data:`workbench.model.LAUNCHES`: grouped GEMM v4's
forward, dX and dW, MoE v3's two kernels, attention v5's two backward kernels): the others
have a single config, and pinning one there is refused, not ignored (a prediction whose
config is not the pinned one is refused too).
"""
from __future__ import annotations

import contextvars
import dataclasses

from .prediction import Prediction

_PINNED: contextvars.ContextVar[dict | None] = contextvars.ContextVar("model_pinned_config", default=None)


def pinned() -> dict | None:
    """The config :func:`predict_config` pinned for the prediction under way, else None."""
    return _PINNED.get()


def predict_config(op: str, rung: int | str, shape, dtype, gpu: str, config: dict,
                   kernel: str | None = None) -> Prediction:
    """``predict(op, rung, shape, dtype, gpu)`` with the tile config ``config`` (a tuner's
    candidate: tile sizes, warps, stages, AMD knobs) instead of the rung's own choice;
    ``kernel``: the one launch of a rung that tunes several (``predict_launch``)."""
    from . import predict, predict_launch

    token = _PINNED.set(dict(config))
    try:
        found = (predict(op, rung, shape, dtype, gpu) if kernel is None
                 else predict_launch(op, rung, kernel, shape, dtype, gpu))
    finally:
        _PINNED.reset(token)
    used = found.inputs.get("config", ({}, ""))[0]
    if any(used.get(name) != value for name, value in config.items()):
        raise NotImplementedError(f"the model's {op} {found.rung} predicts its own config, not a pinned one")
    return dataclasses.replace(found, inputs={**found.inputs, "config": (used, "a tuner's candidate, pinned")})
