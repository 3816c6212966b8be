"""A pass that runs several launches one after another (a backward's dX and dW, an MoE layer's
kernels), predicted as the sum of its launches' modelled times.

Each launch is a :class:`.Prediction` of its own (compiled and weighed like any covered
rung); launches with no compiled kernel of this project (a torch copy, an elementwise
step) are charged their HBM bytes at the spec's bandwidth, named as such. Launches do not
overlap: each waits for the one before, as on one stream.
"""
from __future__ import annotations

from .prediction import Prediction


def hbm_seconds(nbytes: float, chip) -> float:
    """A memory-bound step's time: its bytes at the spec's HBM bandwidth (a floor)."""
    return nbytes / chip.bandwidth["hbm"]


def total(op: str, rung: str, shape: tuple, dtype: str, gpu: str, launches: dict[str, Prediction],
          streams: dict[str, float], flops: float, inputs: dict) -> Prediction:
    """The pass: ``launches`` (name -> prediction) and ``streams`` (name -> seconds of a
    memory-bound step) one after another; TFLOP/s on ``flops``; bound: the resource that
    binds the launches taking the most time together."""
    seconds, by_bound, breakdown = 0.0, {}, {}
    for name, p in launches.items():
        seconds += p.time_s
        by_bound[p.bound] = by_bound.get(p.bound, 0.0) + p.time_s
        breakdown.update({f"{name}: {part}": value for part, value in p.breakdown.items()})
    for name, value in streams.items():
        seconds += value
        by_bound["HBM"] = by_bound.get("HBM", 0.0) + value
        breakdown[f"{name}: HBM"] = value
    launch_inputs = {f"{name} launch (ms)": (round(p.time_s * 1e3, 4), "model") for name, p in launches.items()}
    launch_inputs.update({f"{name} (ms)": (round(s * 1e3, 4), "model: its HBM bytes at the spec's bandwidth")
                          for name, s in streams.items()})
    for name, p in launches.items():
        launch_inputs.update({f"{name}: {key}": value for key, value in p.inputs.items()
                              if key in ("config", "compiled kernel", "compile options",
                                         "hot loop per wave and iteration",
                                         "occupancy", "K steps per iteration")})
    return Prediction(op, rung, shape, dtype, gpu, seconds, flops / seconds / 1e12,
                      max(by_bound, key=by_bound.get), breakdown, {**inputs, **launch_inputs})
