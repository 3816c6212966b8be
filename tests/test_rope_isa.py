"""The rotary-embedding kernel (:mod:`kernels.rotary.kernel`) as gfx942 and gfx950 compile it,
ahead of time in a fresh subprocess (:mod:`fresh_compiles`; not a rung, so not the
inspector's), at the launch :func:`kernels.rotary.kernel.aot` describes: bf16, the training
step's (B, S, H, D) memory, D = 64 (the presets' head dim) and 128. Backs what the kernel's
docstring says of its accesses, spills and occupancy; that this launch is the one a call
runs: tests/test_aot_matches_calls.py."""
from __future__ import annotations

import pytest

from fresh_compiles import results
from layer_ladder_isa import ARCHS, accesses

COMPILE = """
import torch
from kernels.rotary.kernel import aot
from workbench.isa import compile as isa_compile


def result(job):
    arch, head_dim, inverse = job
    return summary(isa_compile.compile_aot(aot(torch.bfloat16, head_dim, inverse), ("hip", arch, 64)))
"""
HEAD_DIMS = (64, 128)
JOBS = tuple((arch, head_dim, inverse) for arch in ARCHS for head_dim in HEAD_DIMS for inverse in (False, True))


@pytest.mark.slow   # eight AOT compiles in a fresh process
@pytest.mark.parametrize("inverse", [False, True], ids=["forward", "backward"])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("arch", ARCHS)
def test_x_cos_sin_and_y_move_16_bytes_a_thread_and_nothing_spills(arch, head_dim, inverse):
    """A thread reads its 8 contiguous bf16 of x (4 interleaved pairs, split in registers) as
    one 16-byte load, the 4 fp32 cos and the 4 fp32 sin of those pairs as one 16-byte load
    each, and writes its 8 bf16 of y as one 16-byte store; nothing narrower, no LDS (the pairs
    never leave the thread), no VGPR or SGPR spills, no scratch, 8 waves per SIMD
    (:func:`layer_ladder_isa.accesses` asserts the last four)."""
    kernel = results(COMPILE, JOBS)[arch, head_dim, inverse]
    assert accesses(kernel) == dict(wide_loads=3, wide_stores=1, narrow_loads=0, narrow_stores=0,
                                     lds_writes=0, lds_reads=0), kernel["ops"]
