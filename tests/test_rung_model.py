"""Rung pages state the model's predicted speed-up over the rung below, with the resource
that binds each, at the op's representative shape (labelled model; "no model" where it
does not cover a rung).

Predictions compile rungs ahead of time (seconds each, cold), so the GEMM tests share
v2 and v3 at the representative shape; everything else the model does not cover and
refuses before compiling.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

import kernels
from workbench import model
from workbench.model import rung as rung_model
from workbench.views.rung import view_rung

PAGE_SHAPE = (9, 7, 5)


def test_the_representative_shape_is_the_ops_first_quick_preset():
    spec = kernels.spec("gemm")
    assert rung_model.representative("gemm") == (spec.quick_shapes[0], spec.bench_shapes[spec.quick_shapes[0]])
    assert rung_model.representative("gemm") == ("square 4096", (4096, 4096, 4096))


def test_each_target_has_a_gpu_to_predict_for():
    assert [rung_model.gpu_for(t) for t in ("gfx942", "gfx950", "sm90", "sm_90")] == \
        ["MI300X", "MI355X", "H100 SXM", "H100 SXM"]


def test_the_rung_below_computes_the_same():
    labels = {r.label: r for r in kernels.variants("attention")}
    assert rung_model.below(kernels.get("gemm", "v3")).label == "v2"
    assert rung_model.below(kernels.get("gemm", "v0")) is None
    assert rung_model.below(kernels.get("gemm", "ref")) is None
    assert rung_model.below(labels["v4"]).label == "v3"
    assert labels["v5"].backward and rung_model.below(labels["v5"]) is None   # v0-v4 have no backward


def test_a_gemm_page_states_the_predicted_speedup_over_the_rung_below():
    page = view_rung("gemm", "v3", PAGE_SHAPE, "gfx942", gpu="MI300X")
    step = page.model
    v2, v3 = (model.predict("gemm", r, (4096, 4096, 4096), "bf16", "MI300X") for r in ("v2", "v3"))
    assert (step.rung, step.below, step.gpu, step.dtype) == ("v3", "v2", "MI300X", "bf16")
    assert step.speedup == pytest.approx(v2.time_s / v3.time_s)
    assert step.this.bound == v3.bound and step.previous.bound == v2.bound
    text = step.text()
    assert text.startswith("Model (predicted from the compiled code, not measured)")
    assert "gemm 'square 4096' (4096x4096x4096), bf16, on MI300X" in text
    assert f"predicted speed-up of v3 over v2: {v2.time_s / v3.time_s:.2f}x" in text
    assert text in str(page) and "Model (predicted" in page._repr_html_()


def test_the_page_names_the_resource_that_moved_or_that_it_stayed():
    base = rung_model.predicted("gemm", "v2", (4096, 4096, 4096), "bf16", "MI300X")
    lds = dataclasses.replace(base, bound="LDS", time_s=base.time_s / 2)
    step = rung_model.ModelStep("gemm", "v3", "v3", "v2", "square 4096", (4096, 4096, 4096), "bf16",
                                "MI300X", lds, base)
    assert step.speedup == pytest.approx(2.0)
    assert f"{base.bound} bound -> LDS bound" in step.text() and "2.00x" in step.text()
    same = dataclasses.replace(step, this=dataclasses.replace(lds, bound=base.bound))
    assert f"{base.bound} bound in both" in same.text()


def test_a_covered_rung_over_an_uncovered_one_has_a_time_but_no_speedup():
    step = rung_model.step("gemm", "v2", torch.bfloat16, "MI300X")
    assert step.this is not None and step.previous is None and step.speedup is None
    assert "no model for v1 (the model covers" in step.text() and "so no speed-up" in step.text()


@pytest.mark.parametrize(("op", "rung", "gpu"), [("gemm", "v1", "MI300X"), ("gemm", "ref", "MI300X"),
                                                 ("gemm", "v3", "MI250X"), ("attention", "v0", "MI300X")])
def test_what_the_model_does_not_cover_says_no_model_and_why(op, rung, gpu):
    step = rung_model.step(op, rung, torch.bfloat16, gpu)
    assert step.this is None and step.speedup is None and step.why
    assert f"no model for {rung}: {step.why}" in step.text()


def test_a_first_rung_or_the_first_backward_has_nothing_below():
    step = dataclasses.replace(rung_model.step("gemm", "v2", torch.bfloat16, "MI300X"), below=None)
    assert "no rung below it computes the same, so no speed-up" in step.text()


def test_the_pages_the_notebooks_show_all_get_a_model_line(monkeypatch):
    """Notebooks 01-03 call ``view_rung`` for every rung of these ops with these GPUs and
    dtypes; each page's model step comes back (a speed-up, a time, or "no model") without
    an error. GEMM's covered rungs are predicted in the tests above, so they are stubbed
    here: this is about every other rung's path."""
    real = rung_model.predicted

    def no_gemm_compile(op, rung, shape, dtype, gpu):
        if op == "gemm" and rung in ("v2", "v3", "v4", "v5", "v6"):
            return real(op, "v2", shape, dtype, gpu)
        return real(op, rung, shape, dtype, gpu)
    monkeypatch.setattr(rung_model, "predicted", no_gemm_compile)
    pages = [("gemm", torch.bfloat16, "MI300X"), ("gemm_fp8", torch.float8_e4m3fnuz, "MI300X"),
             ("gemm_mxfp4", kernels.gemm_mxfp4.FORMAT, "MI355X"), ("attention", torch.bfloat16, "MI300X"),
             ("grouped_gemm", torch.bfloat16, "MI300X"), ("moe", torch.bfloat16, "MI300X")]
    for op, dtype, gpu in pages:
        for rung in kernels.variants(op):
            chosen = dtype if dtype in rung.dtypes else rung.dtypes[0]
            step = rung_model.step(op, rung.label, chosen, gpu)
            assert step.text().startswith("Model (predicted from the compiled code, not measured)"), (op, rung)
            assert step.this is not None or step.why, (op, rung.label)
