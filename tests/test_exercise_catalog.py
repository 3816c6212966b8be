"""Every exercise's checker works: it fails as shipped, passes with the package's own rung
dropped in, and fails for each plausible wrong answer the exercise names."""
from __future__ import annotations

import re

import pytest

from workbench import exercises
from workbench.learn.exercises import learner, source
from workbench.learn.exercises.catalog import all_exercises
from workbench.learn.exercises.model import AnswerExercise, KernelExercise

CATALOG = all_exercises()
KERNEL = [e for e in CATALOG.values() if isinstance(e, KernelExercise)]
ANSWER = [e for e in CATALOG.values() if isinstance(e, AnswerExercise)]
WRONG_KERNELS = [(e, name) for e in KERNEL for name in e.wrong]
WRONG_ANSWERS = [(e, given) for e in ANSWER for given in e.wrong]


@pytest.fixture(autouse=True)
def _private_progress(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_PROGRESS", str(tmp_path / "progress.json"))
    monkeypatch.setenv("WORKBENCH_EXERCISES_DIR", str(tmp_path / "exercises"))


def _grade(exercise: KernelExercise, text: str, tmp_path):
    path = tmp_path / f"{exercise.key.replace('/', '_')}_attempt.py"
    path.write_text(text)
    return exercises.check(exercise.key, path=path)


def test_every_rung_of_every_ladder_has_an_exercise():
    import kernels
    for op in kernels.ops():
        for r in kernels.variants(op, include_ref=False):
            assert f"{op}/{r.label}" in CATALOG, f"{op} {r.title} has no exercise"
    from kernels.comm import ALL_TO_ALL_ALGORITHMS, RING_ALGORITHMS
    for algorithm in {*RING_ALGORITHMS, *ALL_TO_ALL_ALGORITHMS} - {"library"}:
        assert f"comm/{algorithm}" in CATALOG, f"the collective algorithm {algorithm!r} has no exercise"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("exercise", KERNEL, ids=lambda e: e.key)
def test_kernel_exercise_fails_as_shipped(exercise, tmp_path):
    text = learner.template(exercise)
    module = exercise.module
    package, stem = module.rpartition(".")[0], module.rpartition(".")[2]
    assert not re.search(rf"import {re.escape(module)}\b|from {re.escape(package)} import .*\b{stem}\b", text), \
        "the exercise imports the rung it teaches"
    marked = source.blocks(source.module_source(module))
    for name in exercise.todo:
        assert marked[name].text.strip() not in text, f"block {name!r}'s solution is still in the exercise"
    verdict = _grade(exercise, text, tmp_path)
    assert not verdict.passed, verdict.message


@pytest.mark.timeout(300)
@pytest.mark.parametrize("exercise", KERNEL, ids=lambda e: e.key)
def test_kernel_exercise_passes_with_the_package_rung(exercise, tmp_path):
    verdict = _grade(exercise, source.render(exercise.module), tmp_path)
    assert verdict.passed, verdict.message


@pytest.mark.timeout(300)
@pytest.mark.parametrize("exercise,wrong", WRONG_KERNELS, ids=lambda x: x if isinstance(x, str) else x.key)
def test_kernel_exercise_fails_for_a_plausible_wrong_answer(exercise, wrong, tmp_path, short_deadlocks):
    verdict = _grade(exercise, source.render(exercise.module, exercise.wrong[wrong]), tmp_path)
    assert not verdict.passed, f"{wrong!r} passed: {verdict.message}"


@pytest.mark.parametrize("exercise", ANSWER, ids=lambda e: e.key)
def test_answer_exercise_takes_the_computed_answer_only(exercise):
    assert not exercises.check(exercise.key).passed              # as shipped: no answer
    assert exercises.check(exercise.key, answer=exercise.answer()).passed


@pytest.mark.parametrize("exercise,given", WRONG_ANSWERS, ids=lambda x: x.key if hasattr(x, "key") else repr(x))
def test_answer_exercise_rejects_a_plausible_wrong_answer(exercise, given):
    assert not exercises.check(exercise.key, answer=given).passed
