"""The model against published measurements (``published.yaml``): the error table.

A ``library`` point is a vendor library's measured TFLOP/s, the ceiling the ladder
approaches; it is set against the model's fastest rung at the same GPU, shape and
dtype, so its error says how far the model puts the best rung from that ceiling. A
``kernel`` point is a Triton kernel built like one rung (``rung``), set against that rung.
A point's ``op`` is "gemm" unless it says otherwise; its shape is in the op's order; its
``pass`` is "forward" unless it says "backward" (:func:`workbench.model.predict_backward`).
"""
from __future__ import annotations

import statistics
from functools import lru_cache
from pathlib import Path

import yaml

from .covered import predict, predict_backward, rungs

_FILE = Path(__file__).with_name("published.yaml")


@lru_cache(maxsize=None)
def _data() -> dict:
    return yaml.safe_load(_FILE.read_text("utf-8"))


def points() -> list[dict]:
    return [dict(p) for p in _data()["points"]]


def sources() -> dict[str, str]:
    return {tag: " ".join(text.split()) for tag, text in _data()["sources"].items()}


def row(point: dict) -> dict:
    """One line of the error table: measured beside the model's fastest rung."""
    shape, op = tuple(point["shape"]), point.get("op", "gemm")
    backward = point.get("pass", "forward") == "backward"
    how = predict_backward if backward else predict
    candidates = [point["rung"]] if point["kind"] == "kernel" else rungs(op, backward)
    best = min((how(op, r, shape, point["dtype"], point["gpu"]) for r in candidates), key=lambda p: p.time_s)
    return {"label": "model", "op": op, "pass": "backward" if backward else "forward", "kind": point["kind"],
            "what": point["what"], "gpu": point["gpu"],
            "shape": "x".join(map(str, shape)), "dtype": point["dtype"],
            "measured TFLOP/s": point["tflops"], "model TFLOP/s": round(best.tflops, 1),
            "model rung": best.rung, "error %": round(100 * (best.tflops / point["tflops"] - 1), 1),
            "source": point["source"]}


def summary(rows: list[dict]) -> dict:
    """The issue's goals: median |error| <= 25 %, no point off by more than 2x."""
    ratios = [1 + r["error %"] / 100 for r in rows]
    return {"median |error| %": statistics.median(abs(r["error %"]) for r in rows),
            "worst ratio": max(max(x, 1 / x) for x in ratios)}
