"""Float8MoE's combine kernels (:mod:`kernels.moe.combine_op`) as gfx942 and gfx950 compile
them, ahead of time in a fresh subprocess (tests/layer_ladder_isa.py, as
tests/test_moe_swiglu_isa.py does): the weighted gathering k-sum, permute's backward (the
k-sum gathering at weight 1) and the combine's backward. That these launches are the ones a
call runs: tests/test_aot_matches_calls.py."""
from __future__ import annotations

import pytest

from layer_ladder_isa import ARCHS, accesses, compiled as compiled_launches

SLOT_SUM = (dict(weighted=True), dict(weighted=False))
"""The combine's launch and permute's backward's."""


def compiled(module: str, arch: str) -> list[dict]:
    """The resources and op histograms of ``module``'s AOT launches for ``arch``, bf16; this
    file's four (module, arch) pairs compile together, in one fresh process."""
    return compiled_launches({"slot_sum": SLOT_SUM, "combine_backward": (dict(),)}, module, arch)


@pytest.mark.slow   # one AOT compile in a fresh process (with the file's others)
@pytest.mark.parametrize("arch", ARCHS)
def test_combine_backward_moves_bf16_rows_16_bytes_per_thread_and_nothing_spills(arch):
    """Per column block a thread reads y's row and the gathered token's dy row as one 16-byte
    load each and writes dy_sorted as one 16-byte store; once per program it loads the row's
    slot (int64, 8 bytes, in the tile's layout and in the dot product's) and weight (4 bytes)
    and stores dw (4 bytes), after one LDS write and read (the row sums' change of layout).
    No VGPR or SGPR spills, no scratch, 8 waves per SIMD."""
    (kernel,) = compiled("combine_backward", arch)
    assert accesses(kernel) == dict(wide_loads=2, wide_stores=1, narrow_loads=1, narrow_stores=1,
                                     lds_writes=1, lds_reads=1), kernel["ops"]
    assert kernel["ops"]["global_load"].get("buffer_load_dwordx2") == 2, kernel["ops"]


@pytest.mark.slow   # two AOT compiles in a fresh process (with the file's others)
@pytest.mark.parametrize("arch", ARCHS)
def test_gathering_slot_sum_moves_bf16_rows_16_bytes_per_thread_and_nothing_spills(arch):
    """The combine's launch (weighted) and permute's backward (weight 1): each slot's row is
    one 16-byte load per thread with its int64 row index (8 bytes) and, weighted, its float32
    weight (4 bytes), as many of each (the compiler unrolls the runtime k loop alike for all
    three); the token's sum is one 16-byte store per thread. Nothing else, no LDS, no VGPR or
    SGPR spills, no scratch, 8 waves per SIMD."""
    for kernel, launch in zip(compiled("slot_sum", arch), SLOT_SUM):
        loads = kernel["ops"]["global_load"]
        rows = loads["buffer_load_dwordx4"]
        assert loads == {"buffer_load_dwordx4": rows, "buffer_load_dwordx2": rows,
                         **({"buffer_load_dword": rows} if launch["weighted"] else {})}, kernel["ops"]
        assert accesses(kernel) == dict(wide_loads=rows, wide_stores=1, narrow_loads=rows if launch["weighted"] else 0,
                                         narrow_stores=0, lds_writes=0, lds_reads=0), kernel["ops"]
