"""Every exercise, one module per ladder; the order here is the order of the learning path."""
from __future__ import annotations

import importlib

from ..model import Exercise

LADDERS = ("gemm", "gemm_fp8", "gemm_mxfp4", "attention", "moe", "comm")


def all_exercises() -> dict[str, Exercise]:
    found: dict[str, Exercise] = {}
    for ladder in LADDERS:
        for exercise in importlib.import_module(f"{__name__}.{ladder}").EXERCISES:
            if exercise.key in found:
                raise ValueError(f"exercise {exercise.key} is defined twice")
            found[exercise.key] = exercise
    return found
