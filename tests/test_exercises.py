"""The exercise framework: templates cut from rung sources, the learner's file as a rung,
CPU guards that name the culprit, answers, hints, progress, widgets and the CLI."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from kernels.simt import as_simt_array, float32, simt
from workbench import exercises
from workbench.cli import main
from workbench.learn.exercises import guards, learner, progress, source
from workbench.learn.exercises.model import AnswerExercise, KernelExercise, Verdict


@pytest.fixture(autouse=True)
def _private(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_PROGRESS", str(tmp_path / "progress.json"))
    monkeypatch.setenv("WORKBENCH_EXERCISES_DIR", str(tmp_path / "exercises"))


MARKED = '''from __future__ import annotations
from .. import validate
from ..outputs import new_output
from . import configs


def f(x):
    y = x
    # exercise begin: body
    y = y + 1
    if y > 3:
        y = 0
    # exercise end
    return y
'''


def test_blocks_and_render_replace_only_the_marked_lines(monkeypatch):
    monkeypatch.setattr(source, "module_source", lambda module: MARKED)
    assert source.blocks(MARKED)["body"].text == "y = y + 1\nif y > 3:\n    y = 0"
    text = source.render("kernels.gemm.fake", {"body": "raise NotImplementedError('TODO')"})
    assert "    raise NotImplementedError('TODO')\n    return y" in text
    assert "# exercise" not in text and "y = y + 1" not in text
    solution = source.render("kernels.gemm.fake")
    assert "    y = y + 1\n    if y > 3:\n        y = 0\n    return y" in solution


def test_render_makes_relative_imports_absolute(monkeypatch):
    monkeypatch.setattr(source, "module_source", lambda module: MARKED)
    text = source.render("kernels.gemm.fake")
    assert "from kernels import validate" in text
    assert "from kernels.outputs import new_output" in text
    assert "from kernels.gemm import configs" in text


@pytest.mark.parametrize("broken, complaint", [
    ("# exercise begin: a\nx = 1\n", "never closed"),
    ("x = 1\n# exercise end\n", "without a begin"),
    ("# exercise begin: a\n# exercise begin: b\n# exercise end\n", "inside another"),
    ("# exercise begin: a\n# exercise end\n# exercise begin: a\n# exercise end\n", "twice"),
])
def test_malformed_markers_are_an_error(broken, complaint):
    with pytest.raises(ValueError, match=complaint):
        source.blocks(broken)


def test_a_replacement_for_a_block_that_is_not_there_is_refused():
    with pytest.raises(KeyError, match="no exercise block"):
        source.render("kernels.gemm.v2_triton_tile", {"no_such_block": "pass"})


def test_load_writes_the_template_once_and_never_over_the_learners_work():
    path = exercises.load("gemm/v2")
    assert path.name == "gemm_v2.py" and "TODO" in path.read_text()
    path.write_text("# my work\n")
    assert exercises.load("gemm/v2").read_text() == "# my work\n"
    assert "TODO" in exercises.load("gemm/v2", overwrite=True).read_text()


def test_a_file_that_does_not_import_fails_with_its_line():
    path = exercises.load("gemm/v2")
    path.write_text(path.read_text().replace("def gemm_v2(", "def gemm_v2(((", 1))
    verdict = exercises.check("gemm/v2")
    assert not verdict.passed and "does not import" in verdict.message and "SyntaxError" in verdict.message


def test_a_file_without_the_rung_decorator_is_told_so():
    path = exercises.load("gemm/v2")
    path.write_text(path.read_text().replace("@rung(", "_unused = dict(", 1).replace(
        'interpreter=True, kind="triton", aot=aot)', 'interpreter=True, kind="triton", aot=aot)\n_unused = 0\n', 1))
    verdict = exercises.check("gemm/v2")
    assert not verdict.passed and "declares no gemm v2 rung" in verdict.message


def test_the_learners_rung_never_joins_the_ladder():
    import kernels
    before = [r.title for r in kernels.variants("gemm")]
    path = exercises.load("gemm/v2")
    module, captured = learner.import_file(path, "gemm")
    assert [r.label for r in captured] == ["v2"] and captured[0].module == module.__name__
    assert [r.title for r in kernels.variants("gemm")] == before
    assert kernels.get("gemm", "v2").module == "kernels.gemm.v2_triton_tile"


def test_check_records_progress_and_keeps_a_pass():
    exercises.load("gemm/v2")
    assert not exercises.check("gemm/v2").passed
    path = learner.default_path(exercises.get("gemm/v2"))
    path.write_text(source.render("kernels.gemm.v2_triton_tile"))
    assert exercises.check("gemm/v2").passed
    path.write_text("raise SystemError\n")
    assert not exercises.check("gemm/v2").passed
    state = progress.load()["gemm/v2"]
    assert state["attempts"] == 3 and state["passed"] is True
    row = next(r for r in exercises.list_exercises() if r["key"] == "gemm/v2")
    assert row["passed"] and row["attempts"] == 3


def test_the_notebook_and_the_terminal_share_one_copy_whatever_their_directory(monkeypatch, tmp_path):
    monkeypatch.delenv("WORKBENCH_EXERCISES_DIR")
    checkout = Path(learner.__file__).resolve().parents[3]
    seen = set()
    for cwd in (checkout, checkout / "notebooks", tmp_path):   # the CLI, a notebook, anywhere
        monkeypatch.chdir(cwd)
        seen.add(learner.default_path(exercises.get("gemm/v1")))
    assert seen == {checkout / "exercises" / "gemm_v1.py"}
    monkeypatch.setattr(learner, "_is_checkout", lambda root: False)   # an installed package
    assert learner.workdir() == progress.progress_path().parent / "exercises"
    monkeypatch.setenv("WORKBENCH_EXERCISES_DIR", str(tmp_path / "mine"))
    assert learner.workdir() == tmp_path / "mine"


def test_a_checkout_is_known_by_its_project_name(tmp_path):
    assert learner._is_checkout(Path(learner.__file__).resolve().parents[3])
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "something-else"\n')
    assert not learner._is_checkout(tmp_path) and not learner._is_checkout(tmp_path / "nowhere")


def test_checking_the_same_file_or_answer_again_is_not_another_attempt():
    path = exercises.load("gemm/v2")
    for _ in range(3):                                 # Run All, three times
        assert not exercises.check("gemm/v2").passed
    assert progress.load()["gemm/v2"]["attempts"] == 1
    path.write_text(source.render("kernels.gemm.v2_triton_tile"))
    assert exercises.check("gemm/v2").passed and exercises.check("gemm/v2").passed
    assert progress.load()["gemm/v2"]["attempts"] == 2
    for answer in (3, 3, 4):
        exercises.check("gemm/v0-bytes", answer=answer)
    assert progress.load()["gemm/v0-bytes"]["attempts"] == 2


def test_progress_from_before_the_digest_still_reads_and_counts_its_next_check():
    entry = {"passed": False, "attempts": 2, "hints": 1, "last_message": "", "updated": ""}
    progress.progress_path().write_text(json.dumps({"gemm/v0-bytes": entry}))
    exercises.check("gemm/v0-bytes", answer=3)
    assert progress.load()["gemm/v0-bytes"]["attempts"] == 3


def test_progress_file_is_json_in_the_config_folder_unless_moved(monkeypatch, tmp_path):
    monkeypatch.delenv("WORKBENCH_PROGRESS")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    assert progress.progress_path() == tmp_path / "config" / "amd-gpu-workbench" / "progress.json"
    progress.record_hints("gemm/v1", 2)
    assert json.loads(progress.progress_path().read_text())["gemm/v1"]["hints"] == 2
    assert progress.progress_path(tmp_path / "elsewhere.json") == tmp_path / "elsewhere.json"


def test_hints_come_one_at_a_time_and_are_remembered():
    ladder = exercises.hints("gemm/v1")
    assert ladder.revealed == [] and ladder.remaining == 3
    first = ladder.reveal()
    assert first == exercises.get("gemm/v1").hints[0]
    assert exercises.hints("gemm/v1").revealed == [first]        # reopened: still shown
    ladder.reveal(), ladder.reveal()
    assert ladder.reveal() is None and ladder.shown == 3         # no fourth hint, no repeat
    assert progress.load()["gemm/v1"]["hints"] == 3


def test_hint_widget_button_reveals_and_counts_down():
    view = exercises.hints("gemm/v2").widget()
    assert view.button.description == "Show hint 1 of 3" and view.hints.value == ""
    view.click()
    assert exercises.get("gemm/v2").hints[0].split(",")[0] in view.hints.value
    assert view.button.description == "Show hint 2 of 3"
    view.click(), view.click()
    assert view.button.disabled and view.button.description == "all 3 hints shown"
    static = view._repr_mimebundle_()["text/html"]
    assert static.count("<details>") == 3     # a committed notebook keeps hints folded


def test_progress_widget_refreshes_after_a_check():
    view = exercises.progress_widget()
    assert "0 of" in view.table.value
    path = exercises.load("gemm/v2")
    path.write_text(source.render("kernels.gemm.v2_triton_tile"))
    exercises.check("gemm/v2")
    assert "1 of" in view.refresh()


def test_a_wrong_tile_verdict_shows_the_error_heat_map(tmp_path):
    exercise = exercises.get("gemm/v2")
    path = tmp_path / "wrong_scale.py"
    path.write_text(source.render(exercise.module, {"masks": '''
a = tl.load(a_ptrs, mask=(rows[:, None] < M) & (ks[None, :] + k0 < K), other=0.0) * 2.0
b = tl.load(b_ptrs, mask=(ks[:, None] + k0 < K) & (cols[None, :] < N), other=0.0)
'''}))
    verdict = exercises.check("gemm/v2", path=path)
    assert not verdict.passed and "over the error bound" in verdict.message
    assert "<img" in verdict._repr_html_()     # the heat map, drawn


def _answer_exercise():
    return AnswerExercise(key="test/answer", title="t", question="q?", answer=lambda: 6.0,
                          hints=("a", "b", "c"), wrong=(7,), tolerance=0.05)


def test_answers_compare_numbers_within_tolerance_strings_and_sequences():
    from workbench.learn.exercises.grading import grade_answer
    exercise = _answer_exercise()
    assert grade_answer(exercise, 6.2).passed and not grade_answer(exercise, 6.4).passed
    assert not grade_answer(exercise, None).passed and not grade_answer(exercise, "6").passed
    named = AnswerExercise(key="t/n", title="t", question="q", answer=lambda: "v_mfma_f32_32x32x8_f16",
                           hints=("a", "b", "c"), wrong=("v_mfma_f32_16x16x16_f16",))
    assert grade_answer(named, "  V_MFMA_F32_32x32x8_F16 ").passed
    pair = AnswerExercise(key="t/p", title="t", question="q", answer=lambda: (2, 3),
                          hints=("a", "b", "c"), wrong=((3, 2),))
    assert grade_answer(pair, [2, 3]).passed and not grade_answer(pair, (3, 2)).passed


def test_an_exercise_needs_three_hints_and_a_wrong_answer():
    with pytest.raises(ValueError, match="three hints"):
        AnswerExercise(key="k", title="t", question="q", answer=lambda: 1, hints=("a",), wrong=(2,))
    with pytest.raises(ValueError, match="wrong answer"):
        KernelExercise(key="k", module="m", title="t", task="t", todo={}, hints=("a", "b", "c"),
                       wrong={}, op="gemm", rung="v2")


def test_a_pass_counts_its_checks_in_the_singular_and_plural():
    exercise = exercises.get("gemm/v0")     # one shape, one dtype
    assert len(exercise.shapes) * len(exercise.dtypes) == 1
    exercises.load("gemm/v0").write_text(source.render(exercise.module))
    verdict = exercises.check("gemm/v0")
    assert verdict.passed and verdict.message.startswith("1 check ((19, 21, 37); float32) passed")
    two = exercises.get("gemm_fp8/v0")      # one shape at two seeds
    exercises.load(two.key).write_text(source.render(two.module))
    assert exercises.check(two.key).message.startswith("2 checks (")


def test_unknown_exercise_lists_the_known_ones():
    with pytest.raises(KeyError, match="gemm/v2"):
        exercises.get("gemm/v99")


# ---- the guards, on kernels of their own ----------------------------------------------

def test_triton_bounds_names_program_lane_tensor_and_index():
    import triton
    import triton.language as tl

    @triton.jit
    def copy_one_too_many(src, dst, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(dst + offsets, tl.load(src + offsets, mask=offsets <= n), mask=offsets < n)

    src, dst = torch.randn(10), torch.empty(10)
    with guards.triton_bounds(), pytest.raises(Exception) as caught:
        copy_one_too_many[(3,)](src, dst, 10, BLOCK=4)
    cause = caught.value
    while cause.__cause__ is not None:
        cause = cause.__cause__
    assert isinstance(cause, guards.OutOfBounds)
    assert "program (2, 0, 0) loads out of bounds: lane [2]" in str(cause)
    assert "element 10 of `src`, which has 10" in str(cause)
    copy_one_too_many[(3,)](src, dst, 9, BLOCK=4)      # outside the guard: the patch is gone
    from workbench.learn.exercises.races import triton_store_races
    with guards.triton_bounds():
        with triton_store_races():
            pass
        with pytest.raises(Exception, match="out of bounds"):   # the inner guard left the outer in place
            copy_one_too_many[(3,)](src, dst, 10, BLOCK=4)


@simt.jit
def _reverse_without_barrier(x, out):
    tile = simt.shared.array(shape=(8,), dtype=float32)
    i = simt.threadIdx.x
    tile[i] = x[i]
    out[i] = tile[7 - i]


@simt.jit
def _reverse(x, out):
    tile = simt.shared.array(shape=(8,), dtype=float32)
    i = simt.threadIdx.x
    tile[i] = x[i]
    simt.syncthreads()
    out[i] = tile[7 - i]


def test_shared_races_name_both_threads_and_the_element():
    x, out = torch.randn(8), torch.empty(8)
    with guards.shared_races(), pytest.raises(guards.SharedMemoryRace, match=r"`tile`.*element \[\d\].*no syncthreads"):
        _reverse_without_barrier[1, 8](as_simt_array(x), as_simt_array(out))


def test_shared_races_accept_a_barrier_between():
    x, out = torch.randn(8), torch.empty(8)
    with guards.shared_races():
        _reverse[1, 8](as_simt_array(x), as_simt_array(out))
    assert torch.equal(out, x.flip(0))


@simt.jit
def _shift(x, out, by):
    i = simt.threadIdx.x
    out[i] = x[i + by]


@pytest.mark.parametrize("by, index, why", [(1, 8, "is past the last, 7"), (-1, -1, "is negative")])
def test_simt_bounds_name_the_array_the_index_and_the_line(by, index, why):
    x, out = torch.randn(8), torch.empty(8)
    with guards.simt_bounds(), pytest.raises(guards.OutOfBounds) as caught:
        _shift[1, 8](as_simt_array(x), as_simt_array(out), by)
    assert (f"reads `x` at [{index}] out of bounds: its shape is (8,), and index {index} on axis 0 "
            f"{why}; at line") in str(caught.value)
    assert str(caught.value).endswith("of test_exercises.py: `out[i] = x[i + by]`")
    _shift[1, 7](as_simt_array(x), as_simt_array(out), 1)     # in bounds: no complaint
    x, out = torch.randn(9), torch.empty(9)          # a ninth thread for an 8-element tile
    with guards.cpu_guards("simt"), pytest.raises(guards.OutOfBounds, match=r"writes shared array `tile` "
                                                                           r"\(line \d+ of test_exercises.py\) at "
                                                                           r"\[8\].*`tile\[i\] = x\[i\]`"):
        _reverse[1, 9](as_simt_array(x), as_simt_array(out))


def test_an_out_of_bounds_exercise_names_the_array_and_its_line(tmp_path):
    exercise = exercises.get("gemm/v0")
    path = tmp_path / "gemm_v0.py"
    path.write_text(source.render(exercise.module, exercise.wrong["off-by-one bound check"]))
    message = exercises.check("gemm/v0", path=path).message
    assert "OutOfBounds" in message and "reads `a` at [19, " in message and "its shape is (19, 37)" in message
    assert "of gemm_v0.py: `acc += float32(a[row, k]) * float32(b[k, col])`" in message


# ---- the CLI -------------------------------------------------------------------------

def test_cli_load_check_hint_and_list(capsys):
    assert main(["exercise", "load", "gemm/v2"]) == 0
    assert "exercise check gemm/v2" in capsys.readouterr().out
    assert main(["exercise", "check", "gemm/v2"]) == 1
    assert "FAIL" in capsys.readouterr().out
    hints = exercises.get("gemm/v2").hints
    for i, hint in enumerate(hints, 1):
        assert main(["exercise", "hint", "gemm/v2"]) == 0
        assert capsys.readouterr().out == f"hint {i} of 3: {hint}\n"
    assert main(["exercise", "hint", "gemm/v2"]) == 0
    assert capsys.readouterr().out == "no more hints for gemm/v2: all 3 have been shown\n"
    assert main(["exercise", "list"]) == 0
    assert "gemm/v2" in capsys.readouterr().out
    assert main(["exercise", "check"]) == 2


@pytest.mark.gpu
def test_on_a_gpu_the_package_rung_meets_the_speed_target_against_the_previous_rung():
    exercise = exercises.get("gemm/v2")
    path = learner.default_path(exercise)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source.render(exercise.module))
    verdict = exercises.check("gemm/v2")
    assert verdict.passed, verdict
    assert "x v1 simt_lds_tiled" in verdict.speed and "target >=" in verdict.speed
