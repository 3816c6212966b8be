"""The benchmark on a pretended GPU: what it plans, error rows, rows saved as they come."""
from __future__ import annotations

import dataclasses

import pytest
import torch

import kernels
from kernels import registry
from workbench import results
from workbench.harness.bench import Budget, bench, planned_dtypes

SHAPES = [(16, 32, 48), (32, 16, 48), (48, 32, 16), (16, 16, 16)]


@pytest.mark.parametrize("backend, arch, native", [
    ("hip", "gfx942", torch.float8_e4m3fnuz),
    ("hip", "gfx950", torch.float8_e4m3fn),
    ("cuda", "sm_90", torch.float8_e4m3fn),
])
def test_fp8_plan_holds_only_the_format_this_gpu_takes(fake_gpu, fake_timer, backend, arch, native):
    fake_gpu(backend, arch)
    fake_timer()
    rows = bench("gemm_fp8", shapes=SHAPES[:1], progress=False)
    assert {r.dtype for r in rows} == {str(native).replace("torch.", "")}
    assert [r.rung for r in rows] == ["ref", "v0", "v1", "v2"] and all(r.ok for r in rows)


def test_asking_for_a_dtype_ref_does_not_take_here_is_refused(fake_gpu):
    fake_gpu("hip", "gfx942")
    with pytest.raises(ValueError, match="ref does not take float8_e4m3fn on hip \\(gfx942\\)"):
        planned_dtypes("gemm_fp8", [torch.float8_e4m3fn])
    assert planned_dtypes("gemm") == [torch.bfloat16, torch.float16]


def test_a_failing_case_is_an_error_row_and_the_run_goes_on(fake_gpu, fake_timer):
    fake_gpu()
    fake_timer(ms=[1.0, 0.5], fail={2: RuntimeError("launch failed")})
    rows = bench("gemm_fp8", shapes=SHAPES[:2], rungs=["v1"], progress=False)
    assert [(r.shape, r.rung, r.status) for r in rows] == [
        ("16x32x48", "ref", "ok"), ("16x32x48", "v1", "error"),
        ("32x16x48", "ref", "ok"), ("32x16x48", "v1", "ok")]
    failed = rows[1]
    assert failed.error == "RuntimeError: launch failed" and failed.dtype == "float8_e4m3fn"
    assert failed.ms is failed.tflops is failed.gbps is failed.ratio_to_ref is None
    assert rows[3].ratio_to_ref == pytest.approx(1.0 / 0.5)


def test_without_ref_the_rungs_are_timed_with_no_ratio(fake_gpu, fake_timer):
    fake_gpu()
    fake_timer(fail={1: RuntimeError("library refused")})
    ref, v1 = bench("gemm_fp8", shapes=SHAPES[:1], rungs=["v1"], progress=False)
    assert not ref.ok and v1.ok and v1.ratio_to_ref is None and v1.ms == 1.0


def test_inputs_that_cannot_be_made_give_an_error_row_per_rung(fake_gpu, fake_timer, monkeypatch):
    fake_gpu()
    fake_timer()

    def no_inputs(*args, **kwargs):
        raise MemoryError("out of memory")
    spec = kernels.spec("gemm_fp8")
    monkeypatch.setitem(registry._SPECS, "gemm_fp8", dataclasses.replace(spec, make_inputs=no_inputs))
    rows = bench("gemm_fp8", shapes=SHAPES[:1], rungs=["v0", "v1"], progress=False)
    assert [(r.rung, r.error) for r in rows] == [
        (label, "making inputs: MemoryError: out of memory") for label in ("ref", "v0", "v1")]


@pytest.mark.parametrize("suffix", [".json", ".csv"])
def test_an_interrupt_keeps_every_row_measured_before_it(fake_gpu, fake_timer, tmp_path, suffix):
    fake_gpu()
    fake_timer(fail={3: KeyboardInterrupt()})      # the third case (only ref is timed)
    out = tmp_path / f"rows{suffix}"
    with pytest.raises(KeyboardInterrupt):
        bench("gemm_fp8", shapes=SHAPES, rungs=[], progress=False, out=out)
    saved = results.load(out)
    assert [r.shape for r in saved] == ["16x32x48", "32x16x48"] and all(r.ok for r in saved)
    assert [p.name for p in tmp_path.iterdir()] == [out.name]   # no temporary file left


def test_rows_are_saved_one_by_one(fake_gpu, fake_timer, tmp_path, monkeypatch):
    fake_gpu()
    fake_timer()
    out, seen = tmp_path / "rows.json", []
    save = results.save
    monkeypatch.setattr(results, "save", lambda rows, path: seen.append(len(rows)) or save(rows, path))
    rows = bench("gemm_fp8", shapes=SHAPES[:2], rungs=["v1"], progress=False, out=out)
    assert seen == [1, 2, 3, 4] and results.load(out) == rows


def test_a_spent_budget_starts_no_new_case_and_lists_the_rest(fake_gpu, fake_timer):
    fake_gpu()
    calls = fake_timer()
    budget = Budget(0.0)
    assert bench("gemm_fp8", shapes=SHAPES[:2], progress=False, budget=budget) == []
    assert calls == [] and budget.skipped == ["gemm_fp8 16x32x48 float8_e4m3fn",
                                              "gemm_fp8 32x16x48 float8_e4m3fn"]


def test_every_rung_is_timed_through_bind(fake_gpu, monkeypatch):
    """The timed callable is the one ``Rung.bind`` returned: preparation stays outside."""
    from workbench.harness import bench as bench_module
    from workbench.harness.timing import Timing

    fake_gpu()
    bound, timed = [], []
    real_bind = registry.Rung.bind

    def bind(self, *inputs):
        bound.append(real_bind(self, *inputs))
        return bound[-1]
    monkeypatch.setattr(registry.Rung, "bind", bind)
    monkeypatch.setattr(bench_module, "time_ms",
                        lambda fn, **work: timed.append(fn) or Timing(1.0, 1.0, 1.0, 10, **work))
    bench("gemm_fp8", shapes=SHAPES[:1], progress=False)
    assert len(timed) == 4 and all(t is b for t, b in zip(timed, bound))


TINY_ATTENTION = (1, 2, 1, 16, 16, 16, 1)   # (B, Hq, Hkv, S, S_k, D, causal)
FORWARD_ONLY = ["v0", "v1", "v2", "v3", "v4"]


def test_rungs_with_a_backward_are_timed_in_every_pass_the_others_forward_only(fake_gpu, fake_timer):
    fake_gpu()
    # calls: forward ref, v0..v5; backward ref, v5; forward+backward ref, v5
    fake_timer(ms=[1.0, 9.0, 9.0, 9.0, 9.0, 9.0, 0.5, 4.0, 8.0, 6.0, 3.0])
    rows = bench("attention", shapes=[TINY_ATTENTION], dtypes=[torch.bfloat16], progress=False)
    assert [(r.pass_name, r.rung) for r in rows] == [
        *[("forward", label) for label in ["ref", *FORWARD_ONLY, "v5"]],
        ("backward", "ref"), ("backward", "v5"), ("forward+backward", "ref"), ("forward+backward", "v5")]
    assert all(r.ok for r in rows)
    v5 = {r.pass_name: r for r in rows if r.rung == "v5"}
    assert v5["forward"].ratio_to_ref == pytest.approx(1.0 / 0.5)       # ratios within a pass
    assert v5["backward"].ratio_to_ref == pytest.approx(4.0 / 8.0)
    assert v5["forward+backward"].ratio_to_ref == pytest.approx(6.0 / 3.0)
    spec = kernels.spec("attention")
    forward = spec.flops(TINY_ATTENTION)
    assert spec.backward_flops(TINY_ATTENTION) == 2.5 * forward
    assert v5["backward"].tflops == pytest.approx(2.5 * forward / 8.0 / 1e9)
    assert v5["forward+backward"].tflops == pytest.approx(3.5 * forward / 3.0 / 1e9)
    # backward traffic: q, k, v, o and dO read, dQ, dK, dV written (bf16: 2 bytes)
    q, kv = 1 * 2 * 16 * 16, 1 * 1 * 16 * 16
    assert v5["backward"].gbps == pytest.approx(2 * (2 * (q + 2 * kv) + 2 * q) / 8.0 / 1e6)
    gemm = bench("gemm_fp8", shapes=SHAPES[:1], progress=False)
    assert {r.pass_name for r in gemm} == {"forward"}


def test_an_error_in_one_rungs_backward_is_an_error_row_and_the_run_goes_on(fake_gpu, fake_timer):
    fake_gpu()
    fake_timer(ms=[1.0, 0.5], fail={4: RuntimeError("backward launch failed")})
    rows = bench("attention", shapes=[TINY_ATTENTION, TINY_ATTENTION[:-1] + (0,)],
                 dtypes=[torch.bfloat16], rungs=["v5"], progress=False)
    assert [(r.shape[-1], r.pass_name, r.rung, r.status) for r in rows] == [
        (shape, p, label, "error" if (shape, p, label) == ("1", "backward", "v5") else "ok")
        for shape in "10" for p in ("forward", "backward", "forward+backward") for label in ("ref", "v5")]
    failed = rows[3]
    assert failed.error == "RuntimeError: backward launch failed"
    assert failed.ms is failed.tflops is failed.ratio_to_ref is None
    assert rows[5].ratio_to_ref == pytest.approx(1.0 / 0.5)


def test_a_backward_that_cannot_be_set_up_is_an_error_row(fake_gpu, fake_timer, monkeypatch):
    """Errors while building a backward (before the clock) are error rows of that pass."""
    fake_gpu()
    fake_timer()
    v5, ref = kernels.get("attention", "v5"), kernels.get("attention", "ref")

    def no_grad_kernel(q, *rest, **kwargs):
        if q.requires_grad:
            raise RuntimeError("no kernel")
        return ref.fn(q, *rest, **kwargs)
    changed = {"v5": dataclasses.replace(v5, fn=lambda *a, **k: v5.fn(*a, **k).detach()),
               "ref": dataclasses.replace(ref, fn=no_grad_kernel)}
    monkeypatch.setitem(registry._RUNGS, "attention",
                        [changed.get(r.label, r) for r in kernels.variants("attention")])
    rows = bench("attention", shapes=[TINY_ATTENTION], dtypes=[torch.bfloat16], rungs=["v5"],
                 progress=False)
    assert [(r.pass_name, r.rung, r.ok) for r in rows] == [
        (p, label, p == "forward") for p in ("forward", "backward", "forward+backward")
        for label in ("ref", "v5")]
    assert rows[2].error == "RuntimeError: no kernel" and "does not require grad" in rows[3].error


def test_passes_can_be_chosen_and_unknown_ones_are_refused(fake_gpu, fake_timer):
    fake_gpu()
    fake_timer()
    rows = bench("attention", shapes=[TINY_ATTENTION], dtypes=[torch.bfloat16], rungs=["v5", "v2"],
                 passes=["forward+backward", "forward"], progress=False)
    assert [(r.pass_name, r.rung) for r in rows] == [
        ("forward", "ref"), ("forward", "v5"), ("forward", "v2"),   # the rungs as asked,
        ("forward+backward", "ref"), ("forward+backward", "v5")]        # the passes in order
    with pytest.raises(ValueError, match="unknown passes \\['sideways'\\]"):
        bench("attention", shapes=[TINY_ATTENTION], passes=["sideways"], progress=False)


@pytest.mark.parametrize("label", ["ref", "v5"])
def test_timed_backward_calls_return_the_gradients_call_after_call(fake_gpu, label):
    """The timed ``backward`` walks the graph built before the clock (retain_graph), so
    every call gives the same gradients as one autograd pass; ``forward+backward`` too."""
    from workbench.harness.bench import _output_grad, timed_pass

    fake_gpu()
    spec, rung = kernels.spec("attention"), kernels.get("attention", label)
    inputs = spec.make_inputs(TINY_ATTENTION, torch.float32)
    leaves = [t.clone().requires_grad_() for t in inputs[:3]]
    out = rung(*leaves, inputs[3])
    expected = torch.autograd.grad(out, leaves, _output_grad(out))
    for p in ("backward", "forward+backward"):
        fn, work = timed_pass(rung, spec, TINY_ATTENTION, torch.float32, inputs, p)
        for _ in range(3):
            for got, want in zip(fn(), expected):
                torch.testing.assert_close(got, want)
        factor = 2.5 if p == "backward" else 3.5
        assert work["flops"] == factor * spec.flops(TINY_ATTENTION)
    assert not any(t.requires_grad for t in inputs[:3])   # the caller's inputs are untouched


def test_suite_times_attentions_backward_passes(fake_gpu, fake_timer, monkeypatch):
    from workbench.harness import suite
    from workbench.check import CheckReport

    fake_gpu()
    fake_timer()
    spec = kernels.spec("attention")
    monkeypatch.setitem(registry._SPECS, "attention", dataclasses.replace(
        spec, bench_shapes={"tiny": TINY_ATTENTION}, quick_shapes=("tiny",)))
    monkeypatch.setattr(kernels, "ops", lambda: ("attention",))
    monkeypatch.setattr(suite, "check", lambda op, rung, progress: [CheckReport(
        op, kernels.get(op, rung).title, (1, 2, 1, 5, 5, 16, 0), "bfloat16", True,
        0.0, 0.0, 1.0, 0, 10, None, None, None)])
    _, rows = suite.run_suite("quick", progress=False)
    for dtype in ("bfloat16", "float16"):
        timed = [(r.pass_name, r.rung) for r in rows if r.dtype == dtype and r.pass_name != "forward"]
        assert timed == [("backward", "ref"), ("backward", "v5"),
                         ("forward+backward", "ref"), ("forward+backward", "v5")]


@pytest.fixture
def tiny_quick_suite(monkeypatch):
    """The quick suite over gemm_fp8 only, at one small shape (the real one is GPU-sized)."""
    spec = kernels.spec("gemm_fp8")
    monkeypatch.setitem(registry._SPECS, "gemm_fp8", dataclasses.replace(
        spec, bench_shapes={"tiny": SHAPES[0]}, quick_shapes=("tiny",)))
    monkeypatch.setattr(kernels, "ops", lambda: ("gemm_fp8",))


def test_suite_a_check_that_raises_gives_error_rows_and_one_that_fails_no_timing(
        fake_gpu, fake_timer, tiny_quick_suite, monkeypatch, tmp_path):
    from workbench.harness import suite
    from workbench.check import CheckReport

    fake_gpu()
    fake_timer()

    def check(op, rung, progress):
        if rung == "v0":
            raise RuntimeError("illegal memory access")
        passed = rung != "v1"
        return [CheckReport(op, kernels.get(op, rung).title, (5, 7, 3), "float8_e4m3fn", passed,
                            0.0, 0.0, 1.0, 0, 105, None, None, None)]
    monkeypatch.setattr(suite, "check", check)
    reports, rows = suite.run_suite("quick", out=tmp_path / "quick.json", progress=False)
    assert [(r.rung, r.status) for r in rows] == [("ref", "ok"), ("v0", "error"), ("v2", "ok")]   # v1 failed
    assert rows[1].error == ("correctness check raised RuntimeError: illegal memory access; "
                             "not timed")
    assert [r.passed for r in reports] == [False, True, True] and results.load(tmp_path / "quick.json") == rows


@pytest.mark.gpu
def test_fp8_bench_completes_on_this_gpu_in_its_own_format(tmp_path):
    from kernels.gemm_fp8 import fp8_dtype

    out = tmp_path / "fp8.json"
    rows = bench("gemm_fp8", shapes=[(256, 512, 384), (16, 512, 384)], progress=False, out=out)
    assert all(r.ok for r in rows), [r.error for r in rows if not r.ok]
    assert [r.rung for r in rows] == ["ref", "v0", "v1", "v2"] * 2
    assert {r.dtype for r in rows} == {str(fp8_dtype()).replace("torch.", "")}
    assert results.load(out) == rows


@pytest.mark.gpu
def test_attention_bench_times_every_pass_on_this_gpu(tmp_path):
    out = tmp_path / "attention.json"
    rows = bench("attention", shapes=[(1, 4, 2, 128, 128, 64, 1)], dtypes=[torch.bfloat16],
                 progress=False, out=out)
    assert all(r.ok for r in rows), [r.error for r in rows if not r.ok]
    passes = {(r.pass_name, r.rung) for r in rows}
    assert {("backward", "ref"), ("backward", "v5"), ("forward+backward", "ref"),
            ("forward+backward", "v5")} <= passes
    assert {r.rung for r in rows if r.pass_name == "forward"} == {"ref", "v0", "v1", "v2", "v3",
                                                                  "v4", "v5"}
    assert all(r.ratio_to_ref > 0 for r in rows) and results.load(out) == rows
