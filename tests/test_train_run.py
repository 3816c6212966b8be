"""workbench.train.run: rows, results file, checkpoints, MFU arithmetic, CLI, torchrun."""
from __future__ import annotations

import dataclasses
import json
import os

import pytest
import roofline
import torch

from workbench import cli, train
from workbench.train import flops, store
from workbench.train.profiler_log import without_profiler_lines

from torchrun_training import train_two_gloo_ranks

SMOKE = train.PRESETS["cpu-smoke"]


def test_rows_have_every_field_and_label_the_interpreter(tmp_path, capfd):
    out = tmp_path / "train.json"
    rows = train.run("cpu-smoke", "torch", steps=2, profile=True, out=out, progress=False)
    assert "profiler_start" not in capfd.readouterr().err   # the profiler's own log lines are dropped
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert set(row) == set(store.FIELDS)
        assert row["backend"] == "interpreter" and row["dtype"] == "float32"
        assert row["tflops"] is None and row["mfu"] is None and row["peak_mem_gib"] is None
        assert row["step_ms"] > 0 and row["grad_norm"] > 0 and row["op_ms"]
        assert row["tokens_per_s"] == pytest.approx(SMOKE.batch * SMOKE.seq / row["step_ms"] * 1e3)
    assert store.load(out) == rows


def test_only_the_profilers_start_and_stop_lines_are_dropped_from_stderr(capfd):
    with without_profiler_lines():
        os.write(2, b"USDT:2026-12-02 03:54:23 1:1 SyncActivityProfilerHandler.cpp:52] profiler_start\n"
                    b"a warning\nUSDT:2026-12-02 03:54:26 1:1 SyncActivityProfilerHandler.cpp:59] profiler_stop\n")
    assert capfd.readouterr().err == "a warning\n"


def test_results_file_refuses_other_schemas(tmp_path):
    path = tmp_path / "x.json"
    path.write_text(json.dumps({"schema": "amd-kernel-workbench/results", "version": 3, "rows": []}))
    with pytest.raises(ValueError, match="not a training-rows file"):
        store.load(path)
    with pytest.raises(ValueError, match=".json"):
        store.save([], tmp_path / "x.csv")


def test_resuming_a_checkpoint_repeats_the_uninterrupted_losses(tmp_path):
    whole = train.run("cpu-smoke", steps=4, seed=1, progress=False)
    ckpt = tmp_path / "ckpt.pt"
    first = train.run("cpu-smoke", steps=2, seed=1, checkpoint=ckpt, progress=False)
    torch.manual_seed(1234)   # resume must not depend on the RNG state it was started with
    second = train.run("cpu-smoke", steps=2, seed=1, resume=ckpt, progress=False)
    assert [r["step"] for r in second] == [3, 4]
    assert [r["loss"] for r in first + second] == [r["loss"] for r in whole]
    assert [r["grad_norm"] for r in first + second] == [r["grad_norm"] for r in whole]


def test_mfu_is_model_flops_over_the_specs_peak():
    spec = dataclasses.replace(roofline.spec("MI300X"), name="fake",
                               peak_tflops={**roofline.spec("MI300X").peak_tflops, "bf16": 100.0})
    assert flops.mfu(6e13, 1.2, spec, torch.bfloat16) == pytest.approx(0.5)
    assert flops.mfu(6e13, 1.2, spec, torch.float8_e4m3fnuz) is None


def test_step_flops_are_six_active_params_plus_causal_attention_per_token():
    cfg = SMOKE
    per_token = 6 * flops.active_params(cfg) + 6 * cfg.layers * cfg.seq * cfg.dim
    assert flops.step_flops(cfg) == per_token * cfg.batch * cfg.seq
    assert flops.step_flops(cfg, world=2) == 2 * flops.step_flops(cfg)


def test_cli_train_prints_rows_and_writes_them(tmp_path, capsys):
    out = tmp_path / "rows.json"
    assert cli.main(["train", "--preset", "cpu-smoke", "--steps", "2",
                     "--kernels", "attention=workbench", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "grad_norm" in text and "not performance" in text and "tuning pass before the steps" in text
    rows = store.load(out)
    assert len(rows) == 2 and rows[0]["kernels"] == ("gemm=torch,attention=workbench,moe=torch,"
                                                     "norm=torch,rope=torch,swiglu=torch,loss=torch")


def test_cli_train_rejects_unknown_presets_and_ops(capsys):
    assert cli.main(["train", "--preset", "nope", "--steps", "1"]) == 2
    assert cli.main(["train", "--kernels", "softmax=workbench", "--steps", "1"]) == 2
    assert "unknown" in capsys.readouterr().err


@pytest.mark.parametrize("parallel", ["fsdp", pytest.param("ddp", marks=pytest.mark.slow)])
def test_two_gloo_processes_train_like_one_with_the_global_batch(tmp_path, parallel):
    """Two CPU processes under torchrun (gloo, 127.0.0.1) against one with twice the batch.

    Same data and averaged gradients, so the losses agree; not bit for bit, because each
    process's MoE balancing loss sees only its own tokens (as in real data-parallel MoE).
    """
    out = tmp_path / "rows.json"
    train_two_gloo_ranks(["--steps", "3", "--parallel", parallel, "--out", str(out)], timeout=180)
    rows = store.load(out)
    assert [r["world_size"] for r in rows] == [2, 2, 2]
    single = train.run(dataclasses.replace(SMOKE, batch=2 * SMOKE.batch), steps=3, progress=False)
    torch.testing.assert_close([r["loss"] for r in rows], [r["loss"] for r in single],
                               rtol=1e-4, atol=1e-4)
