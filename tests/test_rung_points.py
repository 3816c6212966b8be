"""The notebooks' roofline points (``model_rows.rung_points``): a rung the model covers at its
predicted height (labelled model), any other at its ceiling, named as one.

One shape, notebook 02's (Llama-3-8B attention, S = 4096, causal): each prediction
compiles its rung ahead of time (seconds, cold), and these are the ones its chart draws.
"""
from __future__ import annotations

import math

import pytest

pytest.importorskip("ipywidgets", reason="the notebook extra is not installed (e.g. on a bare GPU image)")

import torch

import roofline
from kernels.attention import spec as attention
from workbench import model
from workbench.widgets import model_rows

SHAPE = (4, 32, 8, 4096, 4096, 128, 1)
MINIMUM = attention.bytes_moved(SHAPE, torch.bfloat16)


def _pct(p: roofline.Point) -> float:
    return roofline.percent_of_roof("MI300X", p.intensity, p.dtype, p.tflops)


def test_a_covered_rung_sits_at_its_prediction_and_an_uncovered_one_at_its_ceiling():
    v0_bytes = 3 * MINIMUM   # a rung's own traffic model, where given
    points, missing = model_rows.rung_points("attention", ["v0", "v4"], SHAPE, torch.bfloat16, "MI300X",
                                             traffic={"v0": v0_bytes})
    v0, v4 = points
    p = model.predict("attention", "v4", SHAPE, "bf16", "MI300X")
    assert (v4.rung, v4.source, v4.op, v4.dtype) == ("attention v4", "model", "attention", "bf16")
    assert v4.ms == pytest.approx(p.time_s * 1e3) and v4.tflops == pytest.approx(p.tflops)
    assert v4.intensity == pytest.approx(attention.flops(SHAPE) / MINIMUM) and _pct(v4) < 100
    assert (v0.rung, v0.source) == ("attention v0 (ceiling)", "model") and _pct(v0) == pytest.approx(100)
    assert v0.intensity == pytest.approx(attention.flops(SHAPE) / v0_bytes)
    assert list(missing) == ["v0"] and "not v0" in missing["v0"]


def test_a_backward_point_is_rated_on_the_backward_flops_and_needs_its_traffic():
    (v5,), missing = model_rows.rung_points("attention", ["v5"], SHAPE, torch.bfloat16, "MI300X", backward=True,
                                            traffic={"v5": 2 * MINIMUM})
    p = model.predict_backward("attention", "v5", SHAPE, "bf16", "MI300X")
    assert (v5.rung, v5.source, missing) == ("attention v5 backward", "model", {})
    assert v5.tflops == pytest.approx(p.tflops) and math.isclose(v5.ms, p.time_s * 1e3)
    assert v5.intensity == pytest.approx(attention.backward_flops(SHAPE) / (2 * MINIMUM)) and _pct(v5) < 100
    with pytest.raises(ValueError, match="a backward point needs its traffic"):
        model_rows.rung_points("attention", ["v5"], SHAPE, torch.bfloat16, "MI300X", backward=True)
