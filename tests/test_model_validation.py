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


def test_no_rung_is_predicted_past_the_library_ceiling():
    """The library points are ceilings: a rung the model puts well above one is a model
    error (10 % slack: the library's own run-to-run spread is not known here)."""
    over = [r for r in _rows() if r["kind"] == "library" and r["error %"] > 10]
    assert not over, format_table(over)
