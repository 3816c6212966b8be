"""triton_store_races names two programs that store one element, and lets disjoint tiles,
masked-off lanes and separate launches be."""
from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from workbench.learn.exercises.races import ProgramRace, triton_store_races

pytestmark = pytest.mark.timeout(60)


@triton.jit
def _tiles(out_ptr, n, STEP: tl.constexpr, BLOCK: tl.constexpr):
    """Program p stores BLOCK elements from p * STEP: tiles overlap when STEP < BLOCK."""
    offs = tl.program_id(0) * STEP + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, offs.to(tl.float32), mask=offs < n)


def test_overlapping_tiles_name_both_programs_and_the_element():
    out = torch.zeros(20)
    with pytest.raises(Exception) as caught, triton_store_races():
        _tiles[(3,)](out, 20, STEP=7, BLOCK=8)
    race = caught.value
    while not isinstance(race, ProgramRace):   # the interpreter wraps it in its own error
        race = race.__cause__
    assert "programs (0, 0, 0) and (1, 0, 0) both store element 7 of `out_ptr`" in str(race)


def test_disjoint_tiles_masks_and_repeated_launches_pass():
    out = torch.zeros(20)
    with triton_store_races():
        _tiles[(3,)](out, 20, STEP=8, BLOCK=8)   # the last tile is half masked off
        _tiles[(3,)](out, 20, STEP=8, BLOCK=8)   # a second launch may store the same elements
    assert torch.equal(out, torch.arange(20, dtype=torch.float32))


def test_the_store_is_restored_afterwards():
    out = torch.zeros(20)
    with triton_store_races():
        pass
    _tiles[(3,)](out, 20, STEP=7, BLOCK=8)   # overlapping, but no longer checked
    assert torch.equal(out, torch.arange(20, dtype=torch.float32))
