"""A correct exercise kernel's verdict shows the model's time for the learner's own file
beside the rung below's (labelled model; shown, never graded).

The learner's file is compiled ahead of time as ``isa.inspect(source=...)`` compiles it
(seconds, cold), so the two compiling tests share GEMM v3 and v4 at the representative
shape; the rest stub the model.
"""
from __future__ import annotations

import pytest

pytest.importorskip("ipywidgets", reason="the notebook extra is not installed (e.g. on a bare GPU image)")

from workbench import exercises
from workbench.model import rung as rung_model
from workbench.learn.exercises import grading, learner, source
from workbench.learn.exercises.model import Verdict
from workbench.model.learner import predict_file
from workbench.learn.exercises.widgets import verdict_html

SQUARE = (4096, 4096, 4096)


@pytest.fixture(autouse=True)
def _private(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_PROGRESS", str(tmp_path / "progress.json"))
    monkeypatch.setenv("WORKBENCH_EXERCISES_DIR", str(tmp_path / "exercises"))


def _solved(key: str, change=lambda text: text):
    """The exercise's file holding the package's rung (its solution), edited by ``change``."""
    exercise = exercises.get(key)
    path = learner.write(exercise)
    path.write_text(change(source.render(exercise.module)))
    return path


def test_a_correct_kernel_shows_its_predicted_time_beside_the_rung_below_once_shown(monkeypatch):
    path = _solved("gemm/v3")
    steps = []
    real = rung_model.step
    monkeypatch.setattr(rung_model, "step", lambda *a, **k: steps.append(k) or real(*a, **k))
    verdict = exercises.check("gemm/v3")
    assert verdict.passed and steps == []            # graded without the model
    line = verdict.predicted
    assert steps == [{"source": str(path)}] and line in str(verdict)
    mine = predict_file("gemm", "v3", path, SQUARE, "bf16", "MI300X")
    v2, v3 = (rung_model.predicted("gemm", r, SQUARE, "bf16", "MI300X") for r in ("v2", "v3"))
    assert mine.time_s == v3.time_s                 # the file is the package's rung: the same code
    assert mine.inputs["compiled from"] == (str(path), "the learner's file")
    assert line.startswith("Model (predicted from the compiled code, not measured) at gemm 'square 4096'")
    assert f"predicted speed-up of your v3 over v2: {v2.time_s / v3.time_s:.2f}x" in line
    assert line.endswith("(Shown, not graded.)")


def test_the_prediction_is_of_the_learners_own_code():
    """The file's v4 with one pipeline stage on AMD instead of two: another loop, another time."""
    two = "num_warps=8, num_stages=2, **amd_options(arch)"
    path = _solved("gemm/v4", lambda text: text.replace(two, two.replace("num_stages=2", "num_stages=1")))
    assert "num_stages=1, **amd_options(arch)" in path.read_text()
    mine = predict_file("gemm", "v4", path, SQUARE, "bf16", "MI300X")
    theirs = rung_model.predicted("gemm", "v4", SQUARE, "bf16", "MI300X")
    assert mine.time_s != theirs.time_s and mine.inputs["compiled from"][0] == str(path)


def test_a_wrong_kernel_has_no_model_line():
    _solved("gemm/v2", lambda text: text.replace("acc.to(c_ptr.dtype.element_ty)", "(acc + 1).to(c_ptr.dtype.element_ty)"))
    verdict = exercises.check("gemm/v2")
    assert not verdict.passed and "over the error bound" in verdict.message
    assert verdict.predict is None and verdict.predicted == ""


def test_a_file_that_does_not_compile_ahead_of_time_is_said_so_and_still_passes(monkeypatch):
    _solved("gemm/v2")

    def broken(*args, **kwargs):
        raise RuntimeError("compiling gemm v2 for gfx942 failed:\nTraceback ...")
    monkeypatch.setattr(rung_model, "step", broken)
    verdict = exercises.check("gemm/v2")
    assert verdict.passed
    assert verdict.predicted == ("Model (shown, not graded): your v2 does not compile ahead of time for "
                                 "gfx942: compiling gemm v2 for gfx942 failed:")


def test_the_verdict_shows_the_line_in_text_and_html():
    verdict = Verdict(True, "2 checks passed", speed="speed: not checked", predict=lambda: "Model: <1 ms>")
    assert str(verdict) == "PASS: 2 checks passed\nspeed: not checked\nModel: <1 ms>"
    assert "<p><i>Model: &lt;1 ms&gt;</i></p>" in verdict_html(verdict)
    assert str(Verdict(False, "wrong")) == "FAIL: wrong"


def test_the_exercises_speed_and_model_lines_judge_the_same_shape():
    assert grading.MODEL_TARGET == "gfx942" and rung_model.gpu_for(grading.MODEL_TARGET) == "MI300X"
    assert rung_model.representative("gemm")[1] == SQUARE
