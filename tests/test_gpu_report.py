"""``workbench gpu-report`` and ``make gpu``, with everything GPU-ish pretended."""
from __future__ import annotations

import dataclasses
import datetime
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

import kernels
from kernels import registry
from workbench import gpu_report, model, results
from workbench.train import quick as train_quick
from workbench.train import store as train_store
from workbench.check import CheckReport
from workbench.cli import main

ROOT = Path(__file__).resolve().parent.parent
CEILINGS = {"gpu": "NVIDIA H200", "date": "2026-11-30T17:00:00+00:00", "hbm_tbps": 4.1,
            "peak_tflops": {"bf16": 700.0, "fp16": 710.0}}


@pytest.fixture
def pretended_h200(fake_gpu, fake_timer, monkeypatch, tmp_path):
    """An H200 that checks every rung as passing, times ref 1 ms and each rung 0.5 ms, and
    records into tmp_path; the quick suite runs gemm_fp8 at one small shape."""
    fake_gpu("cuda", "sm_90", "NVIDIA H200")
    fake_timer(ms=[1.0, 0.5, 0.5, 0.5])      # ref, v0, v1, v2 of each case
    spec = kernels.spec("gemm_fp8")
    monkeypatch.setitem(registry._SPECS, "gemm_fp8", dataclasses.replace(
        spec, bench_shapes={"tiny": (16, 32, 48)}, quick_shapes=("tiny",)))
    monkeypatch.setattr(kernels, "ops", lambda: ("gemm_fp8",))
    monkeypatch.setattr(gpu_report, "measure_ceilings", lambda force: dict(CEILINGS))
    monkeypatch.setattr(gpu_report, "RECORDED", tmp_path)
    monkeypatch.setattr("workbench.harness.suite.check", lambda op, rung, progress: [CheckReport(
        op, kernels.get(op, rung).title, (5, 7, 3), "float8_e4m3fn", True, 0.0, 0.0, 1.0, 0, 105,
        None, None, None)])
    monkeypatch.setattr(train_quick, "run", _fake_train_run)
    return tmp_path


def _fake_train_run(preset, kernels, steps, seed, progress):
    """Steps of 100 ms (torch) or 80 ms (workbench), the first three slow (warm-up)."""
    ms = 100.0 if kernels == "torch" else 80.0
    return [{**dict.fromkeys(train_store.FIELDS), **dict(
        step=i + 1, loss=5.0 - 0.1 * i, step_ms=ms * (10 if i < 3 else 1),
        tokens_per_s=1000.0 / (ms * (10 if i < 3 else 1)), mfu=0.01 * 100 / ms,
        preset=preset, kernels=kernels)} for i in range(steps)]


def _today() -> str:
    return datetime.datetime.now(datetime.timezone.utc).date().isoformat()


def test_gpu_report_records_the_quick_suite_and_prints_ratios(pretended_h200, capsys):
    assert main(["gpu-report"]) == 0
    out = capsys.readouterr().out
    path = pretended_h200 / f"nvidia-h200-{_today()}.json"
    rows = results.load(path)
    assert [(r.rung, r.ratio_to_ref) for r in rows] == [("ref", 1.0), ("v0", 2.0), ("v1", 2.0), ("v2", 2.0)]
    assert {r.gpu for r in rows} == {"NVIDIA H200"} and all(r.ok for r in rows)
    assert "HBM copy 4.10 TB/s; matmul bf16 700 TFLOP/s, fp16 710 TFLOP/s" in out
    table = out.split("Ladder (vs_ref")[1]
    assert "vs_ref" in table and "triton_fp8_dot" in table and " 2 " in table
    assert "4 rows measured, 0 error rows, 0 of 4 checks failed" in out and f"wrote {path}" in out
    model_part = out.split("model against measured")[1]   # the model covers no FP8 GEMM on sm_90: said, per rung
    assert "no measured row is a case the model covers" in model_part
    assert [": ".join(line.split(": ")[:2]) for line in model_part.splitlines() if line.startswith("left out")] == [
        f"left out: gemm_fp8 {rung} forward on NVIDIA H200" for rung in ("v0", "v1", "v2")]


@pytest.mark.parametrize("device, gpu", [("NVIDIA H200", "H200"), ("NVIDIA H100 80GB HBM3", "H100 SXM")])
def test_on_a_pretended_sm_90_gpu_the_model_is_set_beside_each_measured_rung_it_covers(
        pretended_h200, fake_gpu, fake_timer, monkeypatch, capsys, device, gpu):
    """GEMM on sm_90, which the model covers (v2-v6, from the PTX), on the H200 and on an H100
    as torch names them: every rung and ref "measured" at half GEMM v2's predicted time, so
    v2's signed error is -50 % (the model pessimistic)."""
    fake_gpu("cuda", "sm_90", device)
    shape = (128, 256, 64)
    v2 = model.predict("gemm", "v2", shape, "bf16", gpu).time_s * 1e3
    fake_timer(ms=[v2 / 2])
    monkeypatch.setitem(registry._SPECS, "gemm", dataclasses.replace(
        kernels.spec("gemm"), bench_shapes={"tiny": shape}, quick_shapes=("tiny",), dtypes=(torch.bfloat16,)))
    monkeypatch.setattr(kernels, "ops", lambda: ("gemm",))
    assert gpu_report.gpu_report(folder=pretended_h200, progress=False) == 0
    model_part = capsys.readouterr().out.split("model against measured")[1]
    row = re.compile(rf"gemm +(v\d) +forward +128x256x64 +bfloat16 +{device} +(\S+) +(\S+) +(\S+) +(.+?) *$")
    rows = {m[1]: m.groups()[1:] for m in map(row.match, model_part.splitlines()) if m}
    assert set(rows) == {"v2", "v3", "v4", "v5", "v6"}
    for rung, printed in rows.items():   # numbers as the table prints them (3 digits); error %: measured / model - 1
        p = model.predict("gemm", rung, shape, "bf16", gpu)
        numbers = (v2 / 2, round(p.time_s * 1e3, 4), round(100 * (v2 / 2 / (p.time_s * 1e3) - 1), 1))
        assert printed == (*(f"{n:.3g}" for n in numbers), p.bound)
    assert rows["v2"][2] == "-50"   # signed: the model is pessimistic where the GPU beats it
    assert "left out" not in model_part   # ref is no case; the SIMT rungs v0 and v1 run no bf16


def test_gpu_report_ends_with_the_training_step_of_both_kernel_sets(pretended_h200, capsys):
    assert gpu_report.gpu_report(folder=pretended_h200, progress=False) == 0
    out = capsys.readouterr().out.split("training step:")[1]
    rows = train_store.load(pretended_h200 / "train" / f"nvidia-h200-{_today()}.json")
    assert [r["kernels"] for r in rows] == ["torch"] * 8 + ["workbench"] * 8
    summary = train_quick.compare(pretended_h200 / "again.json")
    assert [s["step_ms"] for s in summary] == [100.0, 80.0]      # warm-up steps left out
    assert summary[1]["speedup"] == 1.25 and summary[1]["mfu"] == pytest.approx(0.0125)
    assert "gpu-moe-small" in out and "1.25" in out


def test_a_failed_training_step_is_reported_and_fails_the_report(pretended_h200, monkeypatch, capsys):
    def oom(**kwargs):
        raise RuntimeError("CUDA out of memory")
    monkeypatch.setattr(train_quick, "run", oom)
    assert gpu_report.gpu_report(folder=pretended_h200, progress=False) == 1
    assert "training step failed: RuntimeError: CUDA out of memory" in capsys.readouterr().out


def test_gpu_report_shows_error_rows_and_exits_1(pretended_h200, fake_timer, capsys):
    fake_timer(ms=[1.0], fail={2: RuntimeError("no kernel image for sm_90")})
    assert gpu_report.gpu_report(folder=pretended_h200, progress=False) == 1
    out = capsys.readouterr().out
    assert "RuntimeError: no kernel image for sm_90" in out and "1 error rows" in out
    assert [r.status for r in results.load(pretended_h200 / f"nvidia-h200-{_today()}.json")] == [
        "ok", "error", "ok", "ok"]


def test_gpu_report_says_what_a_spent_budget_left_out(pretended_h200, capsys):
    assert gpu_report.gpu_report(budget_s=1e-9, folder=pretended_h200, progress=False) == 1
    out = capsys.readouterr().out
    assert "time budget of 0 s spent; not run: gemm_fp8: checks and every case" in out
    assert "training step (gpu-moe-small, torch vs workbench)" in out
    assert "nothing written" in out and not list(pretended_h200.iterdir())


def test_a_second_report_the_same_day_does_not_overwrite_the_first(tmp_path):
    first = gpu_report.report_path("AMD Instinct MI300X", "2026-11-30", tmp_path)
    assert first.name == "amd-instinct-mi300x-2026-11-30.json"
    first.write_text("{}")
    assert gpu_report.report_path("AMD Instinct MI300X", "2026-11-30", tmp_path).name == \
        "amd-instinct-mi300x-2026-11-30-2.json"


def test_gpu_report_refuses_without_a_gpu(capsys, tmp_path):
    if kernels.backend.current().is_gpu:
        pytest.skip("a GPU is present")
    assert gpu_report.gpu_report(folder=tmp_path) == 2
    assert "no GPU here" in capsys.readouterr().err and not list(tmp_path.iterdir())
    assert main(["gpu-report"]) == 2
    with pytest.raises(SystemExit):
        main(["gpu-report", "--budget-s", "-5"])


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
@pytest.mark.parametrize("flags, python", [
    ([], ".venv/bin/python"),
    (["SYSTEM_PYTHON=1"], f"PYTHONPATH={ROOT} python3"),   # an offline GPU image: install nothing
])
def test_make_gpu_runs_the_gpu_tests_then_the_report(flags, python):
    out = subprocess.run(["make", "-n", "-B", "gpu", *flags], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout   # -B: the setup shows even if done
    tests = out.index(f"WORKBENCH_TEST_GPU=1 {python} -m pytest -m gpu")
    report = out.index(f"{python} -m workbench.cli gpu-report --budget-s 300")
    assert tests < report
    assert ("pip install" in out) == (not flags)
