"""v4 amd_tuned: v3's kernel with tiles and AMD knobs chosen per target and head dim.

Idea:
    The kernel is v3's, unchanged; what changes is how it is launched. Per backend and
    head dim (64 or 128) a table picks BLOCK_M (the query rows a program keeps), the
    waves per program, ``num_stages=2`` (asks Triton's AMD stream pipeliner to
    double-buffer the K/V tiles in LDS, loading tile i+1 while tile i is multiplied) and
    ``waves_per_eu`` (the register cap the compiler aims for, to keep that many waves
    per SIMD). The choice is visible: :func:`chosen_config`. At D = 128 the key tile is
    32 wide: 128 x 64 with two stages spills on gfx942, 128 x 32 does not.

Why faster:
    128 query rows per program halve the K/V re-reads of v3's 64, and the second LDS
    stage (at D = 128 the LDS footprint grows past v3's) is there to hide global-load
    latency behind the MFMAs, with two waves per SIMD kept by ``waves_per_eu``. Not
    measured yet: no GPU timing exists in this repository.

Expected bound:
    Compute: the matrix cores, with exp2 and the rescaling on the vector unit competing
    for issue slots.

Limits:
    As v3. The table is pruned ahead of time, not timed: every listed config compiles
    for gfx942 and gfx950 without spilling (``tests/test_attention_isa.py`` compiles
    each), and no config is benchmarked here, since no GPU timing exists in this
    repository yet. Head dims other than 64 and 128 use the 128 entry.
"""
from __future__ import annotations

import torch

from .. import backend as _backend
from .. import validate
from ..tuning import with_overrides
from ..registry import rung
from ..triton_support import aot_launch
from . import v3_causal_lse
from .launch import aot_ints, head_block
from .spec import DTYPES, MAX_HEAD_DIM

# backend -> head dim -> launch settings (upper case: constexprs; the rest compile options)
CONFIGS = {
    "hip": {
        64: dict(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=2, waves_per_eu=2),
        128: dict(BLOCK_M=128, BLOCK_N=32, num_warps=8, num_stages=2, waves_per_eu=2),
    },
    "cuda": {
        64: dict(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=3),
        128: dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=2),
    },
    "interpreter": {
        64: dict(BLOCK_M=32, BLOCK_N=32, num_warps=4, num_stages=1),
        128: dict(BLOCK_M=32, BLOCK_N=32, num_warps=4, num_stages=1),
    },
}


def chosen_config(d: int, backend: str | None = None) -> dict:
    """The launch settings v4 uses for head dim ``d`` on ``backend`` (default: this one)."""
    table = CONFIGS[backend or _backend.current().name]
    return {**table[64 if d <= 64 else 128], "BLOCK_D": head_block(d)}


def aot(dtype: torch.dtype, backend: str, arch: str, overrides: dict | None = None) -> list:
    """Every head-dim entry, so the ISA tests see each config the table ships;
    ``overrides`` replaces settings of both (e.g. ``{"BLOCK_N": 64}``)."""
    return [aot_launch(v3_causal_lse._flash_fwd_lse_kernel, dtype,
                       with_overrides(chosen_config(d, backend), overrides),
                       aot_ints(d=d), constexprs={"CAUSAL": True, "INTERP_BF16": False},
                       pointers={"lse_ptr": "*fp32"}) for d in (128, 64)]


@rung(op="attention", rung=4, name="amd_tuned", backends=("hip", "cuda", "interpreter"),
      dtypes=DTYPES, interpreter=True, kind="triton", aot=aot)
def attention_v4(q, k, v, causal=False, scale=None):
    scale = validate.attention_operands(q, k, v, scale, DTYPES, MAX_HEAD_DIM)
    return v3_causal_lse.launch(q, k, v, causal, scale, chosen_config(q.shape[-1]))[0]
