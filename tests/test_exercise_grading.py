"""The speed target's rung to beat: on a GPU a learner's rung is timed against it."""
from __future__ import annotations

import kernels
from workbench.learn.exercises.grading import _previous


def test_a_rung_is_timed_against_the_nearest_lower_rung_that_computes_the_same():
    assert _previous(kernels.get("attention", "v3")).label == "v2"
    assert _previous(kernels.get("gemm", "v1")).label == "v0"


def test_a_first_rung_or_the_first_backward_has_nothing_to_beat():
    assert _previous(kernels.get("attention", "v0")) is None
    assert _previous(kernels.get("attention", "v5")) is None    # v0-v4 are forward only
