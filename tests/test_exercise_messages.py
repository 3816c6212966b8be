"""The MoE and collective exercises fail with messages that teach: a deadlock says so
(instead of hanging), a race names the two programs, a skipped chunking names the pieces.
(tests/test_exercise_catalog.py proves that they fail; this pins how.)"""
from __future__ import annotations

import pytest

from workbench import exercises
from workbench.learn.exercises import source


@pytest.fixture(autouse=True)
def _private_progress(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_PROGRESS", str(tmp_path / "progress.json"))


def _message(key: str, wrong: str, tmp_path) -> str:
    exercise = exercises.get(key)
    path = tmp_path / f"{key.replace('/', '_')}_attempt.py"
    path.write_text(source.render(exercise.module, exercise.wrong[wrong]))
    verdict = exercises.check(key, path=path)
    assert not verdict.passed
    return verdict.message


@pytest.mark.timeout(60)
def test_a_wrong_ring_neighbour_is_a_deadlock_not_a_hang(tmp_path):
    message = _message("comm/ring", "sends to the left, receives from the left", tmp_path)
    assert message.startswith("deadlock: ") and "matching receive" in message


@pytest.mark.timeout(60)
def test_an_unchunked_ring_names_the_pieces_it_sent(tmp_path):
    message = _message("comm/ring_chunked", "chunks read as the piece length", tmp_path)
    assert "sent pieces of [2, 2, 3, 3] elements" in message and "([2, 2, 1])" in message


@pytest.mark.timeout(120)
def test_a_persistent_loop_that_steps_by_one_names_two_programs(tmp_path):
    message = _message("grouped_gemm/v4", "every program steps by 1", tmp_path)
    assert "programs (0, 0, 0) and (1, 0, 0) both store element" in message
