"""The model against published measurements (workbench/model/published.yaml).

Each point compiles the GEMM ladder ahead of time at its shape (a minute or more on
a busy CPU), hence ``slow``. The table is printed (``pytest -s``) whatever the outcome.
"""
from __future__ import annotations

import functools

import pytest

from workbench.model import validation
from workbench.harness.table import format_table

pytestmark = pytest.mark.slow


@functools.lru_cache(maxsize=None)
def _rows() -> tuple[dict, ...]:
    return tuple(validation.row(p) for p in validation.points())


def test_every_point_names_a_known_source():
    known = validation.sources()
    for point in validation.points():
        assert point["source"] in known, point
        assert point["kind"] in ("library", "kernel"), point


def test_error_table_meets_the_goals():
    rows = list(_rows())
    print("\n" + format_table(rows))
    got = validation.summary(rows)
    print(got)
    assert got["worst ratio"] <= 2, got
    assert got["median |error| %"] <= 25, got


# The model's known overshoot: causal attention forward on MI355X, above every measurement at
# its config (the masked diagonal and the causal tail cost the measured kernels more than
# the model charges: HipKittens' Triton runs causal at 0.61x its non-causal TFLOP/s at
# S = 4096, the model at 0.92x).
# And the GEMM ladder's top on H100 (sm_90): v5 at 89 % of the dense peak, cuBLAS measured at
# 62-73 % (TRITON-2339, 2023). The model runs the tensor cores at the datasheet's 1830 MHz (no
# clock under load was found for H100), charges no launch overhead, and lets an in-flight
# wgmma hide the shared memory wholly behind the tensor cores.
OVER_THE_CEILING = {("attention", "forward", "MI355X", "16x16x16x4096x4096x128x1"),
                    ("attention", "forward", "MI355X", "16x16x16x8192x8192x128x1"),
                    ("gemm", "forward", "H100", "2048x4096x4096"),
                    ("gemm", "forward", "H100", "2048x8192x8192")}


def test_no_rung_is_predicted_past_the_best_measurement():
    """The best measurement at a config (a library's, or a kernel's where one beats it:
    HipKittens' Triton attention forward beats CK's non-causal) is a ceiling: a rung the
    model puts well above it is a model error (10 % slack: the runs' spread is not known
    here). The configs it is known to overshoot are listed, so the list cannot go stale."""
    best: dict[tuple, float] = {}
    for r in _rows():
        key = (r["op"], r["pass"], r["gpu"], r["shape"], r["dtype"])   # a backward has its own ceiling
        best[key] = max(best.get(key, 0.0), r["measured TFLOP/s"])
    over = {(r["op"], r["pass"], r["gpu"], r["shape"]) for r in _rows()
            if r["model TFLOP/s"] > 1.1 * best[r["op"], r["pass"], r["gpu"], r["shape"], r["dtype"]]}
    assert over == OVER_THE_CEILING, format_table(list(_rows()))
