"""The MoE, collective and FP8 quantize exercises fail with messages that teach: a deadlock says
so (instead of hanging), a race names the two programs, a skipped chunking names the pieces, a
wrong quantization scale names its group (an all-zero one when that is the slip).
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
def test_a_wrong_ring_neighbour_is_a_deadlock_not_a_hang(tmp_path, short_deadlocks):
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


def test_an_unguarded_zero_group_is_named_with_its_scale(tmp_path):
    message = _message("gemm_fp8/quantize", "no guard for an all-zero group", tmp_path)
    assert "scale differs in 1 of" in message and "yours 0, expected 1 (an all-zero group)" in message


def test_a_multiplying_scale_has_the_right_scales_and_the_wrong_values(tmp_path):
    message = _message("gemm_fp8/quantize", "the scale multiplies instead of dividing", tmp_path)
    assert message.split(": ", 1)[1].startswith("q differs") and message.endswith("(scale, scale_t right)")


def test_an_unclamped_e8m0_exponent_wraps_on_the_all_zero_groups(tmp_path):
    message = _message("gemm_fp8/mx-scale", "no clamp to e8m0's range", tmp_path)
    assert "yours byte 248" in message and "expected byte 0 (2^-127) (an all-zero group)" in message


@pytest.mark.parametrize("wrong, off_by", [("rounded up a binade (no saturation)", 1),
                                           ("EMAX left out (amax lands on 1)", 8)])
def test_a_wrong_e8m0_rule_shows_bytes_off_by_its_binades(wrong, off_by, tmp_path):
    message = _message("gemm_fp8/mx-scale", wrong, tmp_path)
    yours, expected = (int(part.split("byte ")[1].split(" ")[0]) for part in message.split("expected"))
    assert yours - expected == off_by   # e4m3fn: EMAX = 8
