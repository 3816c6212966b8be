"""SwiGLU's elementwise kernels over sorted rows, forward and backward, as gfx942 and gfx950
compile them (ahead of time; not rungs, so a fresh subprocess compiles them, as
tests/test_fp8_quantize_isa.py does). Backs what kernels/moe/layer_ladder/swiglu_forward.py
and swiglu_backward.py say of their loads, stores, spills and occupancy; that these
launches are the ones a call runs: tests/test_aot_matches_calls.py."""
from __future__ import annotations

import pytest

from layer_ladder_isa import ARCHS, accesses, compiled as compiled_launches

BACKWARD = (dict(weighted=True), dict(weighted=False), dict(fp8_owner=True))
"""v3's launch, the expert-parallel owner's (weight 1) and the FP8 expert-parallel owner's
(dg and du only, rows bounded by the capacity padding's start)."""
FORWARD = (dict(bounded=False), dict(bounded=True))
"""Float8MoE's launch and the FP8 expert-parallel owner's (rows bounded)."""


def compiled(module: str, arch: str) -> list[dict]:
    """The resources and op histograms of ``module``'s AOT launches (:data:`BACKWARD` or
    :data:`FORWARD`) for ``arch``, bf16; this file's four (module, arch) pairs compile together."""
    return compiled_launches({"swiglu_backward": BACKWARD, "swiglu_forward": FORWARD}, module, arch)


@pytest.mark.slow   # three AOT compiles in a fresh process (with the file's others)
@pytest.mark.parametrize("arch", ARCHS)
def test_backward_moves_bf16_rows_16_bytes_per_thread_and_nothing_spills(arch):
    """bf16, every output asked, with a routing weight and at weight 1 (the expert-parallel
    owner's launch): per column block a thread reads dh, g, u and h as one 16-byte load each
    and writes dg, du (and h·w) as one 16-byte store each; the only narrower accesses are
    the per-row routing weight's load and dw_rows' store (4 bytes, once per program). LDS
    only for the row sums' change of layout before that store (one 4-byte write and read).
    The FP8 owner's launch (dg and du, rows bounded): dh, g, u in and dg, du out 16 bytes
    each, nothing narrower (the bound is one scalar load), no LDS. No VGPR or SGPR spills,
    no scratch, 8 waves per SIMD."""
    for kernel, launch in zip(compiled("swiglu_backward", arch), BACKWARD):
        weighted, fp8_owner = launch.get("weighted", False), launch.get("fp8_owner", False)
        assert accesses(kernel) == dict(
            wide_loads=3 if fp8_owner else 4, wide_stores=3 if weighted else 2,
            narrow_loads=1 if weighted else 0,                                   # w, one row per thread
            narrow_stores=0 if fp8_owner else 1,                                 # dw_rows
            lds_writes=0 if fp8_owner else 1, lds_reads=0 if fp8_owner else 1), kernel["ops"]


@pytest.mark.slow   # two AOT compiles in a fresh process (with the file's others)
@pytest.mark.parametrize("arch", ARCHS)
def test_forward_moves_bf16_rows_16_bytes_per_thread_and_nothing_spills(arch):
    """bf16, unbounded (Float8MoE's) and bounded (the FP8 expert-parallel owner's): per
    column block a thread reads g and u as one 16-byte load each and writes h as one 16-byte
    store; nothing narrower (the bound is one scalar load), no LDS, no VGPR or SGPR spills,
    no scratch, 8 waves per SIMD."""
    for kernel in compiled("swiglu_forward", arch):
        assert accesses(kernel) == dict(wide_loads=2, wide_stores=1, narrow_loads=0, narrow_stores=0,
                                         lds_writes=0, lds_reads=0), kernel["ops"]
