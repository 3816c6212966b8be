"""A tuned rung predicted at one of its candidate configs: what the tuners rank by.

:func:`workbench.model.predict` predicts a rung with the config it would choose
itself; a tuner asks about each config its pruned space keeps. :func:`predict_config`
pins ``config`` for the call, and the rung's plan (:func:`.gemm.plan`) takes the
pinned config in place of its own choice. Only the tuned rungs (GEMM v5, v6) take one:
the others have a single config, and pinning one there is refused, not ignored (a
prediction whose config is not the pinned one is refused too).
"""
from __future__ import annotations

import dataclasses

from .covered import predict
from .pinned import pinning
from .prediction import Prediction

def predict_config(op: str, rung: int | str, shape, dtype, gpu: str, config: dict) -> Prediction:
    """``predict(op, rung, shape, dtype, gpu)`` with the tile config ``config`` (a tuner's
    candidate: tile sizes, warps, stages, AMD knobs) instead of the rung's own choice."""
    with pinning(config):
        found = predict(op, rung, shape, dtype, gpu)
    used = found.inputs.get("config", ({}, ""))[0]
    if any(used.get(name) != value for name, value in config.items()):
        raise NotImplementedError(f"the model's {op} {found.rung} predicts its own config, not a pinned one")
    return dataclasses.replace(found, inputs={**found.inputs, "config": (used, "a tuner's candidate, pinned")})
