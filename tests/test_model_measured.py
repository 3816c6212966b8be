"""The model against a GPU's own results rows (``workbench.model.measured``, ``workbench
predict --against``, the end of ``workbench gpu-report``), on rows made up here: no GPU has
recorded any yet."""
from __future__ import annotations

import pytest

from workbench import model, results
from workbench.cli import main
from workbench.model import measured

SHAPE = "4096x4096x4096"


@pytest.fixture(scope="module")
def predicted_ms():
    """GEMM v2's and v4's predicted forward on MI300X at SHAPE (compiled once per module)."""
    return {rung: model.predict("gemm", rung, (4096, 4096, 4096), "bf16", "MI300X").time_s * 1e3
            for rung in ("v2", "v4")}


def test_each_measured_row_the_model_covers_is_set_beside_its_prediction(make_row, predicted_ms):
    rows = [make_row(rung="ref", ratio_to_ref=1.0), make_row(rung="v2", ms=2 * predicted_ms["v2"]),
            make_row(rung="v4", ms=predicted_ms["v4"] / 2),
            make_row(rung="v3", status="error", error="boom", ms=None, tflops=None, gbps=None, ratio_to_ref=None),
            make_row(rung="v2", pass_name="forward+backward"),
            make_row(op="attention", rung="v5", pass_name="backward", gpu="NVIDIA H200", arch="sm_90",
                     shape="4x32x8x4096x4096x128x1"),
            make_row(rung="v2", gpu="NVIDIA A100-SXM4-80GB", arch="sm_80")]
    table, left = measured.compare(rows)
    backward = model.predict_backward("attention", "v5", (4, 32, 8, 4096, 4096, 128, 1), "bf16", "H200")
    assert [(r["rung"], r["pass"], r["gpu"], r["model ms"]) for r in table] == [
        ("v2", "forward", "AMD Instinct MI300X", round(predicted_ms["v2"], 4)),
        ("v4", "forward", "AMD Instinct MI300X", round(predicted_ms["v4"], 4)),
        ("v5", "backward", "NVIDIA H200", round(backward.time_s * 1e3, 4))]   # sm_90 covers the backward too
    assert [r["error %"] for r in table[:2]] == [100.0, -50.0]   # slower than the model: optimistic, +
    assert all(r["bound (model)"] for r in table)
    assert len(left) == 2
    assert "gemm v2 forward+backward on AMD Instinct MI300X: the model predicts the forward and backward" in left[0]
    assert left[1].startswith("gemm v2 forward on NVIDIA A100-SXM4-80GB: unknown GPU 'NVIDIA A100-SXM4-80GB' "
                              "on sm_80")


@pytest.mark.parametrize("device, arch, name", [
    ("NVIDIA H200", "sm_90", "H200 SXM"), ("NVIDIA H100 80GB HBM3", "sm_90", "H100 SXM"),
    ("AMD Instinct MI300X VF", "gfx942", "MI300X"), ("AMD Instinct MI355X", "gfx950", "MI355X"),
])
def test_a_row_is_predicted_on_the_gpu_its_device_name_names(make_row, device, arch, name):
    """Rows hold torch's device name; the model takes the spec's (roofline.device_spec)."""
    expected = model.predict("gemm", "v2", (4096, 4096, 4096), "bf16", name).time_s * 1e3
    table, left = measured.compare([make_row(rung="v2", gpu=device, arch=arch, ms=expected)])
    assert left == []
    assert [(r["gpu"], r["model ms"], r["error %"]) for r in table] == [(device, round(expected, 4), 0.0)]


def test_a_case_the_model_fails_on_is_named_and_the_others_are_still_predicted(make_row, predicted_ms, monkeypatch):
    """A GPU session is minutes long: a model defect on one case (here a ValueError, as an
    uncounted PTX instruction raised) must not cost the comparison of the others."""
    def predict(op, rung, *args):
        if rung == "v2":
            raise ValueError("'mma.sync.aligned.m16n8k16' is not a wgmma.mma_async instruction name")
        return model.predict(op, rung, *args)

    monkeypatch.setitem(measured.PREDICTORS, "forward", predict)
    table, left = measured.compare([make_row(rung="v2"), make_row(rung="v4", ms=predicted_ms["v4"])])
    assert [(r["rung"], r["error %"]) for r in table] == [("v4", 0.0)]
    assert left == ["gemm v2 forward on AMD Instinct MI300X: the model failed: ValueError: "
                    "'mma.sync.aligned.m16n8k16' is not a wgmma.mma_async instruction name"]


def test_once_stop_says_so_the_cases_left_are_named_not_predicted(make_row, predicted_ms):
    asked = []
    table, left = measured.compare([make_row(rung="v2"), make_row(rung="v4"), make_row(rung="v4", shape="64x64x64")],
                                   stop=lambda: asked.append(1) or len(asked) > 1)
    assert [r["rung"] for r in table] == ["v2"]
    assert left == ["gemm v4 forward on AMD Instinct MI300X: not predicted: the time allowed was spent"]


def test_predict_against_a_results_file_prints_the_comparison(make_row, predicted_ms, tmp_path, capsys):
    path = results.save([make_row(rung="v2", ms=predicted_ms["v2"]), make_row(op="gemm_fp8", rung="v1",
                                                                           gpu="NVIDIA H200")], tmp_path / "r.json")
    assert main(["predict", "--against", str(path)]) == 0
    out = capsys.readouterr().out
    table, left = measured.compare(results.load(path))
    assert measured.report(table, left) in out and "measured ms" in out
    assert [(r["rung"], abs(r["error %"]) <= 0.1) for r in table] == [("v2", True)]   # measured as predicted
    assert "left out: gemm_fp8 v1 forward on NVIDIA H200" in out
    assert main(["predict"]) == 2
    assert "an op, or --against" in capsys.readouterr().err
