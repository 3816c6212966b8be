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
from workbench import gpu_report, gpu_report_fp8, gpu_report_goals as goals, model, results
from workbench.harness.bench import Budget
from workbench.harness.results import Recorder
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
    records into tmp_path; the quick suite runs gemm_fp8 at one small shape, and the FP8
    section its GEMMs at :data:`SMALL` instead of 8192^3."""
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
    monkeypatch.setattr(gpu_report_fp8, "SHAPE", SMALL)
    monkeypatch.setattr(train_quick, "run", _fake_train_run)
    return tmp_path


SMALL = (32, 48, 256)
STEP_MS = {None: 80.0, "blockwise": 60.0, "rowwise": 70.0}      # workbench bf16, and under each recipe
LOSS_FACTOR = {None: 1.0, "blockwise": 1.005, "rowwise": 1.02}


def _fake_train_run(preset, kernels, steps, seed, progress, fp8=None):
    """Steps of 100 ms (torch) or 80 ms (workbench; 60 ms under blockwise FP8, 70 ms under
    rowwise), the first three slow (warm-up); FP8 losses 0.5 % (blockwise) and 2 % (rowwise)
    above bf16's; a tuning pass of 12 s (15 s for torch)."""
    ms = 100.0 if kernels == "torch" else STEP_MS[fp8]
    return [{**dict.fromkeys(train_store.FIELDS), **dict(
        step=i + 1, loss=(5.0 - 0.1 * i) * LOSS_FACTOR[fp8], step_ms=ms * (10 if i < 3 else 1),
        tokens_per_s=1000.0 / (ms * (10 if i < 3 else 1)), mfu=0.01 * 100 / ms,
        preset=preset, kernels=kernels, fp8=fp8, tuning_s=15.0 if kernels == "torch" else 12.0)}
        for i in range(steps)]


def _today() -> str:
    return datetime.datetime.now(datetime.timezone.utc).date().isoformat()


@pytest.mark.slow   # the model compiles the FP8 GEMM's rungs for sm_90 beside the measured rows
def test_gpu_report_records_the_quick_suite_and_prints_ratios(pretended_h200, capsys):
    assert main(["gpu-report"]) == 0
    out = capsys.readouterr().out
    path = pretended_h200 / f"nvidia-h200-{_today()}.json"
    rows = results.load(path)[:4]   # the quick suite's; the FP8 section's follow
    assert [(r.rung, r.ratio_to_ref) for r in rows] == [("ref", 1.0), ("v0", 2.0), ("v1", 2.0), ("v2", 2.0)]
    assert {r.gpu for r in rows} == {"NVIDIA H200"} and all(r.ok for r in rows)
    assert "HBM copy 4.10 TB/s; matmul bf16 700 TFLOP/s, fp16 710 TFLOP/s" in out
    table = out.split("Ladder (vs_ref")[1]
    assert "vs_ref" in table and "triton_fp8_dot" in table and " 2 " in table
    assert "4 rows measured, 0 error rows, 0 of 4 checks failed" in out and f"wrote {path}" in out
    model_part = out.split("model against measured")[1]   # the FP8 GEMM's tuned rungs on sm_90, v0 said
    rows = [line.split() for line in model_part.splitlines() if line.startswith("gemm_fp8 ")]
    assert [(row[1], row[2]) for row in rows] == [("v1", "forward"), ("v2", "forward")], model_part
    assert [": ".join(line.split(": ")[:2]) for line in model_part.splitlines() if line.startswith("left out")] == [
        "left out: gemm_fp8 v0 forward on NVIDIA H200"]


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


@pytest.mark.slow   # the model compiles attention's rungs and v5's backward launches for sm_90
def test_on_a_pretended_h200_the_model_is_set_beside_the_measured_backward_pass(
        pretended_h200, fake_timer, monkeypatch, capsys):
    """The backward rows too: attention v5's backward pass, which the model covers on sm_90,
    gets its prediction beside the measured time (1 ms), as the forward rows do."""
    shape = (1, 2, 1, 128, 128, 128, 1)
    fake_timer(ms=[1.0])
    monkeypatch.setitem(registry._SPECS, "attention", dataclasses.replace(
        kernels.spec("attention"), bench_shapes={"tiny": shape}, quick_shapes=("tiny",), dtypes=(torch.bfloat16,)))
    monkeypatch.setattr(kernels, "ops", lambda: ("attention",))
    assert gpu_report.gpu_report(folder=pretended_h200, progress=False) == 0
    model_part = capsys.readouterr().out.split("model against measured")[1]
    row = re.search(r"^attention +v5 +backward +1x2x1x128x128x128x1 +bfloat16 +NVIDIA H200 +(\S+) +(\S+) +(\S+) +(.+?) *$",
                    model_part, re.MULTILINE)
    p = model.predict_backward("attention", "v5", shape, "bf16", "H200")
    assert row and row.groups() == ("1", f"{round(p.time_s * 1e3, 4):.3g}",
                                    f"{round(100 * (1 / (p.time_s * 1e3) - 1), 1):.3g}", p.bound), model_part
    left = [line.split(" on NVIDIA")[0] for line in model_part.splitlines() if line.startswith("left out")]
    assert [line for line in left if "backward" in line] == ["left out: attention v5 forward+backward"]   # not alone


def test_gpu_report_ends_with_the_training_step_of_both_kernel_sets(pretended_h200, capsys):
    assert gpu_report.gpu_report(folder=pretended_h200, progress=False) == 0
    out = capsys.readouterr().out.split("training step:")[1]
    rows = train_store.load(pretended_h200 / "train" / f"nvidia-h200-{_today()}.json")
    assert [r["kernels"] for r in rows] == ["torch"] * 8 + ["workbench"] * 8
    summary = train_quick.compare(pretended_h200 / "again.json")
    assert [s["step_ms"] for s in summary] == [100.0, 80.0]      # warm-up steps left out
    assert summary[1]["speedup"] == 1.25 and summary[1]["mfu"] == pytest.approx(0.0125)
    assert [(s["run"], s["tuning_s"], s["loss_rel_diff"]) for s in summary] == [
        ("torch", 15.0, 0.0), ("workbench", 12.0, 0.0)]   # tuning apart from the steps
    assert "gpu-moe-small" in out.split("FP8 training step")[0] and "1.25" in out


def test_the_top_rungs_goals_are_judged_from_the_rows_of_one_run(make_row):
    """Issue 18's ratios, each a rung against ref in the same run: per shape and dtype, met or
    not; an error row says its error; a pass no goal names is not judged; a goal whose rung did
    not run says so. Attention's lines name the backend SDPA chose (on this CPU: torch's own
    choice for CPU tensors of that shape)."""
    attention = "1x4x2x64x64x64x1"
    rows = [make_row(op="attention", rung="v4", shape=attention, ratio_to_ref=1.2),
            make_row(op="attention", rung="v4", shape=attention, dtype="float16", ratio_to_ref=0.8),
            make_row(op="attention", rung="v5", shape=attention, pass_name="backward", ratio_to_ref=0.9),
            make_row(op="attention", rung="v5", shape=attention, ratio_to_ref=5.0),   # v5's forward: no goal's
            make_row(op="moe", rung="v3", shape="64x32x48x4x2x1", pass_name="forward+backward", status="error",
                     error="boom", ms=None, tflops=None, gbps=None, ratio_to_ref=None)]
    table = goals.kernel_goals(rows)
    assert [(line["goal"], line["dtype"], line["ratio"], line["verdict"]) for line in table] == [
        ("attention forward vs SDPA", "bfloat16", 1.2, "met"),
        ("attention forward vs SDPA", "float16", 0.8, "not met"),
        ("attention backward vs SDPA", "bfloat16", 0.9, "met"),
        ("MoE layer forward+backward vs eager", "bfloat16", None, "error: boom")]
    backends = {line["against"] for line in table[:3]}
    assert backends <= {f"SDPA {name}" for name in torch.nn.attention.SDPBackend.__members__}, backends
    assert goals.kernel_goals(rows[:1])[-1]["verdict"] == "not measured in this run"


def test_sdpas_backend_is_unknown_with_the_reason_where_torch_cannot_say(monkeypatch):
    def refuse(*args, **kwargs):
        raise RuntimeError("no backend takes these inputs")
    monkeypatch.setattr(torch, "_fused_sdp_choice", refuse)
    assert goals.sdpa_backend("1x4x2x64x64x64x1", "bfloat16") == "unknown (RuntimeError: no backend takes these inputs)"


def test_gpu_report_judges_the_training_step_against_its_goal(pretended_h200, capsys):
    """The pretended run: the workbench step 1.25x eager torch's (goal 1.1x: met); the suite
    ran no attention or MoE rung, so their goals say so; torch.compile's goal is named as not
    run here."""
    assert gpu_report.gpu_report(folder=pretended_h200, progress=False) == 0
    part = capsys.readouterr().out.split("goals of the top rungs")[1].split("model against measured")[0]
    lines = [line.split() for line in part.splitlines()]
    assert ["training", "step", "vs", "eager", "PyTorch", "gpu-moe-small", "-", "bf16", "1.25", ">=", "1.1x",
            "met", "torch", "(eager)"] in lines, part
    assert sum("not measured in this run" in line for line in part.splitlines()) == len(goals.GOALS)
    assert "torch.compile: not run here: workbench train --compile" in part


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
        "ok", "error", "ok", "ok"] + ["ok"] * 8    # the FP8 section's rows follow


def test_gpu_report_says_what_a_spent_budget_left_out(pretended_h200, capsys):
    assert gpu_report.gpu_report(budget_s=1e-9, folder=pretended_h200, progress=False) == 1
    out = capsys.readouterr().out
    assert "time budget of 0 s spent; not run: gemm_fp8: checks and every case" in out
    assert "training step (gpu-moe-small, torch vs workbench)" in out
    assert "FP8 GEMM at 32x48x256 (bf16 top rung against each FP8 rung)" in out
    assert "FP8 training step (gpu-dense-1b, bf16 vs fp8 blockwise and rowwise)" in out
    assert "nothing written" in out and not list(pretended_h200.iterdir())


# The quick suite's four timings (ref, v0, v1, v2), then the FP8 section's: gemm ref and
# bf16 v6 (1 ms), then ref and the rung of each FP8 case runnable on sm_90 (no mxfp8).
FP8_SECTION_MS = [1.0, 0.5, 0.5, 0.5,  0.8, 1.0,  0.7, 0.5,  0.7, 0.7,  3.0, 0.625]


def test_gpu_report_times_each_fp8_gemm_rung_against_bf16_v6_and_says_if_it_meets_the_goal(
        pretended_h200, fake_timer, capsys):
    fake_timer(ms=FP8_SECTION_MS)
    assert gpu_report.gpu_report(folder=pretended_h200, progress=False) == 0
    out = capsys.readouterr().out.split("FP8 GEMM at 32x48x256")[1].split("training step:")[0]
    rows = results.load(pretended_h200 / f"nvidia-h200-{_today()}.json")[4:]
    assert [(r.op, r.rung, r.name, r.dtype, r.ms) for r in rows] == [
        ("gemm", "ref", "ref [layout=NT]", "bfloat16", 0.8), ("gemm", "v6", "persistent [layout=NT]", "bfloat16", 1.0),
        ("gemm_fp8", "ref", "ref [granularity=tensor, layout=NT]", "float8_e4m3fn", 0.7),
        ("gemm_fp8", "v2", "triton_blockwise [granularity=tensor, layout=NT]", "float8_e4m3fn", 0.5),
        ("gemm_fp8", "ref", "ref [granularity=channel, layout=NT]", "float8_e4m3fn", 0.7),
        ("gemm_fp8", "v2", "triton_blockwise [granularity=channel, layout=NT]", "float8_e4m3fn", 0.7),
        ("gemm_fp8", "ref", "ref [granularity=block128x128, layout=NT]", "float8_e4m3fn", 3.0),
        ("gemm_fp8", "v2", "triton_blockwise [granularity=block128x128, layout=NT]", "float8_e4m3fn", 0.625)]
    assert {(r.gpu, r.shape, r.pass_name) for r in rows} == {("NVIDIA H200", "32x48x256", "forward")}
    assert all(r.commit and r.torch_version and r.timestamp for r in rows)
    assert "goal: each FP8 rung >= 1.6x the bf16 rung's speed" in out
    assert "bf16 gemm v6 (persistent): 1.000 ms" in out
    verdicts = {line.split()[0]: line.split(">= 1.6x")[1].strip() for line in out.splitlines()
                if line.split()[:1] in (["tensorwise"], ["rowwise"], ["blockwise"])}
    assert verdicts == {"tensorwise": "met", "rowwise": "not met", "blockwise": "met"}
    lines = {line.split()[0]: line for line in out.splitlines() if line.split()[:1] in
             (["tensorwise"], ["rowwise"], ["blockwise"])}
    speedups = {"tensorwise": " 2 ", "rowwise": " 1.43 ", "blockwise": " 1.6 "}   # 1 ms over 0.5, 0.7, 0.625
    assert all(speedups[recipe] in line for recipe, line in lines.items()) and len(lines) == 3, lines
    mx = next(line for line in out.splitlines() if line.startswith("mxfp8"))
    assert "skipped: no MX matrix cores on sm_90 (native on gfx950, sm_100" in mx


def test_each_gemm_of_the_fp8_section_runs_at_the_forward_s_layout():
    """The bf16 rung and every FP8 GEMM case at NT (x @ w.t(), B K-contiguous): the inputs their
    make_inputs gives lie so, and the bf16 one is timed with the same layout."""
    from kernels.gemm.spec import layout
    for case in gpu_report_fp8.CASES:
        if case.op == "gemm_fp8":
            a, b, *_ = kernels.spec(case.op).make_inputs((256, 128, 256), **case.input_args)
            assert layout(a, b) == gpu_report_fp8.LAYOUT == "NT", case
    assert layout(*kernels.spec("gemm").make_inputs((8, 6, 4), layout=gpu_report_fp8.LAYOUT)) == "NT"


@pytest.mark.parametrize("op, rung, args", [("gemm", "v6", {}),
                                             *(("gemm_fp8", "v2", {"granularity": g}) for g in
                                               ("tensor", "channel", "block128x128"))])
def test_the_rungs_the_fp8_section_times_are_right_at_its_layout(op, rung, args):
    """What the section times at NT, judged as every rung is (:func:`workbench.harness.check.judge`:
    against the op's float64 reference, outputs poisoned, within the library baseline's error)."""
    from workbench.harness.check import judge
    spec = kernels.spec(op)
    inputs = spec.make_inputs((96, 80, 256), torch.bfloat16 if op == "gemm" else torch.float8_e4m3fn,
                              seed=3, layout=gpu_report_fp8.LAYOUT, **args)
    ((_, fields),) = judge(kernels.get(op, rung), spec, inputs, 3)
    assert fields["passed"], fields


def test_each_fp8_case_times_the_rung_its_recipe_trains_with():
    """matmul_fp8 (tensorwise, rowwise) and blockwise_matmul both run gemm_fp8's best rung."""
    from kernels.gemm.ops import best_rung
    from kernels.gemm_fp8 import fp8_dtype
    top = best_rung("gemm_fp8", fp8_dtype()).label
    assert {c.recipe: c.rung for c in gpu_report_fp8.CASES if c.op == "gemm_fp8"} == dict.fromkeys(
        ("tensorwise", "rowwise", "blockwise"), top)


@pytest.mark.parametrize("arch, skipped", [("sm_90", {"mxfp8"}), ("gfx942", {"mxfp8"}),
                                           ("gfx950", set()), ("sm_100", set())])
def test_mxfp8_is_timed_only_where_the_matrix_cores_take_mx_scales(fake_gpu, arch, skipped):
    fake_gpu("hip" if arch.startswith("gfx") else "cuda", arch, f"a GPU with {arch}")
    why = {c.recipe: gpu_report_fp8.why_not(c) for c in gpu_report_fp8.CASES}
    assert {recipe for recipe, reason in why.items() if reason} == skipped
    assert all(arch in why[recipe] for recipe in skipped)


def test_the_fp8_gemm_section_times_mxfp8_on_gfx950(fake_gpu, fake_timer, monkeypatch):
    fake_gpu("hip", "gfx950", "AMD Instinct MI355X")
    fake_timer(ms=[1.0])
    monkeypatch.setattr(gpu_report_fp8, "SHAPE", SMALL)
    table = gpu_report_fp8.gemm(Recorder(), Budget(1000.0), progress=False)
    assert [(t["recipe"], t["verdict"]) for t in table] == [
        ("tensorwise", "not met"), ("rowwise", "not met"), ("blockwise", "not met"), ("mxfp8", "not met")]
    assert table[-1]["rung"] == "v0 triton_dot_scaled" and table[-1]["vs bf16 v6"] == 1.0


def test_the_fp8_sections_are_skipped_and_named_when_their_reserve_is_not_left(pretended_h200, capsys):
    budget = Budget(gpu_report_fp8.GEMM_RESERVE_S - 1)
    assert gpu_report_fp8.gemm(Recorder(), budget, progress=False) is None
    budget = Budget(gpu_report_fp8.TRAIN_RESERVE_S - 1, skipped=budget.skipped)
    assert gpu_report_fp8.train(pretended_h200 / "fp8.json", budget) is False
    assert budget.skipped == ["FP8 GEMM at 32x48x256 (bf16 top rung against each FP8 rung)",
                              "FP8 training step (gpu-dense-1b, bf16 vs fp8 blockwise and rowwise)"]
    assert capsys.readouterr().out == "" and not list(pretended_h200.iterdir())


def test_gpu_report_compares_the_fp8_training_step_with_bf16(pretended_h200, capsys):
    assert gpu_report.gpu_report(folder=pretended_h200, progress=False) == 0
    out = capsys.readouterr().out.split("FP8 training step (gpu-dense-1b")[1].split("model against")[0]
    rows = train_store.load(pretended_h200 / "train" / f"nvidia-h200-{_today()}-fp8.json")
    assert [(r["preset"], r["kernels"], r["fp8"]) for r in rows[::8]] == [
        ("gpu-dense-1b", "workbench", None), ("gpu-dense-1b", "workbench", "blockwise"),
        ("gpu-dense-1b", "workbench", "rowwise")]
    table = {line.split("  ")[0]: line for line in out.splitlines()[1:]}
    assert "tuning_s" in out and "step >= 1.3x" in out and "loss within 1%" in out
    assert table["fp8 blockwise"].split()[-2:] == ["met", "met"]          # 80/60 ms, 0.5 % off
    assert table["fp8 rowwise"].split()[-4:] == ["not", "met", "not", "met"]  # 80/70 ms, 2 % off
    assert " 1.33 " in table["fp8 blockwise"] and " 12 " in table["fp8 blockwise"]
    assert "met by fp8 blockwise" in out


def test_a_failed_fp8_training_step_is_reported_and_fails_the_report(pretended_h200, monkeypatch, capsys):
    def oom(**kwargs):
        if kwargs["preset"] == "gpu-dense-1b":
            raise RuntimeError("CUDA out of memory")
        return _fake_train_run(**kwargs)
    monkeypatch.setattr(train_quick, "run", oom)
    assert gpu_report.gpu_report(folder=pretended_h200, progress=False) == 1
    assert "FP8 training step failed: RuntimeError: CUDA out of memory" in capsys.readouterr().out


def test_gpu_report_runs_only_the_sections_asked_for(pretended_h200, fake_timer, capsys):
    fake_timer(ms=FP8_SECTION_MS[4:])
    assert main(["gpu-report", "--sections", "fp8-train", "fp8-gemm"]) == 0
    out = capsys.readouterr().out
    assert "sections fp8-gemm, fp8-train" in out and out.index("FP8 GEMM at") < out.index("FP8 training step")
    assert "quick suite" not in out and "training step:" not in out and "model against" not in out
    rows = results.load(pretended_h200 / f"nvidia-h200-{_today()}.json")
    assert [(r.op, r.rung) for r in rows][:2] == [("gemm", "ref"), ("gemm", "v6")] and len(rows) == 8
    with pytest.raises(ValueError, match="unknown sections"):
        gpu_report.gpu_report(sections=("fp8",))
    with pytest.raises(SystemExit):
        main(["gpu-report", "--sections", "fp8"])


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
