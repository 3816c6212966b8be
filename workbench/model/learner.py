"""The model's prediction for a learner's copy of a rung (:mod:`workbench.exercises`).

The learner edits one idea of a registered rung in a file of their own; the exercise
shows that file's predicted time beside the rung below (shown, never graded). The
prediction is :func:`workbench.model.predict`'s, with the rung compiled from the file
(:func:`workbench.isa.compiled_from`) instead of from the package: the hot loop, the
registers and the occupancy are the learner's; the config for the shape and the tile
waves are the package rung's (an exercise cuts out an idea, not the config).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from .. import isa
from .covered import predict
from .prediction import Prediction


def predict_file(op: str, rung: int | str, source: str | Path, shape, dtype="bf16",
                 gpu: str = "MI300X") -> Prediction:
    """``predict(op, rung, shape, dtype, gpu)`` with the rung compiled from ``source``."""
    with isa.compiled_from(op, rung, source):
        found = predict(op, rung, shape, dtype, gpu)
    return dataclasses.replace(found, inputs={**found.inputs,
                                              "compiled from": (str(source), "the learner's file")})
