"""The b128 bank model against cases worked by hand from the documented rule (32 banks of 4
bytes, phases of 8 consecutive lanes), and the gemm/v4-banks exercise it grades."""
from __future__ import annotations

import pytest

from workbench import exercises
from workbench.isa import lds_banks

LANES = range(64)


def test_consecutive_16_byte_chunks_take_one_pass_per_phase():
    assert lds_banks.passes([16 * i for i in LANES]) == lds_banks.CONFLICT_FREE == 8


def test_one_address_for_every_lane_is_a_broadcast():
    assert lds_banks.passes([256] * 64) == 8


def test_a_row_stride_of_128_bytes_puts_a_phase_on_four_banks():
    # lanes 0-7 read bytes 0, 128, ..., 896: all on banks 0-3, 8 distinct dwords each
    assert lds_banks.passes([128 * i for i in LANES]) == 64


def test_a_64_byte_stride_is_a_4_way_conflict():
    # lanes 0-7 at 0, 64, ..., 448: banks 0-3 and 16-19, four lanes on each
    assert lds_banks.passes([64 * i for i in LANES]) == 32


def test_only_lanes_of_one_phase_conflict():
    # lanes 0-7 read contiguously; lane 8 repeats lane 0's banks but in the next phase
    assert lds_banks.passes([16 * (i % 8) + 128 * (i // 8) for i in LANES]) == 8


@pytest.mark.parametrize("layout, expected", [
    ({}, 64), ({"pad_bytes": 16}, 8), ({"xor_rows": 8}, 8), ({"xor_rows": 2}, 32), ({"pad_bytes": 64}, 32)])
def test_padding_and_xor_swizzle_against_the_plain_tile(layout, expected):
    rows, chunks = [i % 16 for i in LANES], [i // 16 for i in LANES]
    assert lds_banks.passes(lds_banks.tile_addresses(rows, chunks, row_bytes=128, **layout)) == expected


def test_the_swizzle_keeps_every_chunk_of_a_row_in_that_row():
    placed = lds_banks.tile_addresses([3] * 8, list(range(8)), row_bytes=128, xor_rows=8)
    assert sorted(placed) == [3 * 128 + 16 * c for c in range(8)]


@pytest.mark.parametrize("addresses, word", [([0] * 63, "one byte address per lane"),
                                             ([8] * 64, "16-byte aligned"), ([-16] * 64, "non-negative")])
def test_bad_addresses_are_named(addresses, word):
    with pytest.raises(ValueError, match=f"addresses must.*{word}"):
        lds_banks.passes(addresses)


def test_a_swizzle_that_does_not_divide_the_row_is_refused():
    with pytest.raises(ValueError, match="row_bytes"):
        lds_banks.tile_addresses([0], [0], row_bytes=48, xor_rows=2)


def test_the_exercise_is_graded_by_the_model(tmp_path):
    exercise = exercises.get("gemm/v4-banks")
    assert exercise.answer() == 64
    progress = tmp_path / "progress.json"
    assert exercises.check(exercise.key, answer=64, progress_file=progress).passed
    assert not any(exercises.check(exercise.key, answer=w, progress_file=progress).passed
                   for w in exercise.wrong)
    assert "1/8 more LDS" in exercise.explain
