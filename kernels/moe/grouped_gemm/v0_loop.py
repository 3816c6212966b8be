"""v0 loop: one ``torch.matmul`` per expert, launched from Python.

Idea:
    The obvious MoE code: read the offsets on the host, then for each expert with rows
    multiply its slice of x by its weight with the vendor GEMM (hipBLASLt / cuBLAS), and
    write the rows back. Autograd differentiates the loop, so the backward is two more
    loops (dx and dw per expert).

Why faster:
    It is the baseline of the ladder, not faster than anything. Reading the offsets is a device-to-host sync: the CPU waits for everything queued
    before it. Then come G launches (3·G in the backward), each sized by one expert:
    with 32 local experts and a skewed routing most are small GEMMs that fill a
    fraction of the CUs (a 256-row slice in 256x256 tiles is 28 tiles for a 7168-wide
    output, 9 % of MI300X's 304 CUs), and the GPU idles between launches while Python
    issues the next one. The work is right; the machine is mostly waiting.

Expected bound:
    Launch and sync latency at small per-expert row counts; the vendor GEMM's own
    efficiency per expert slice at large ones (model, not measured here).

Limits:
    The host sync also makes it unusable inside a CUDA/HIP graph. No kernel of ours: this
    rung is the baseline every later rung is measured against, with ``ref``.
"""
from __future__ import annotations

import torch

from ... import validate
from ...outputs import new_output
from ...registry import rung
from .spec import DTYPES, group_bounds


def loop(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """The grouped GEMM as a Python loop of matmuls (differentiable by autograd)."""
    out = new_output((x.shape[0], w.shape[2]), x.dtype, x.device)
    # exercise begin: loop
    for g, (start, end) in enumerate(group_bounds(offsets)):
        if end > start:
            out[start:end] = x[start:end] @ w[g]
    # exercise end
    return out


@rung(op="grouped_gemm", rung=0, name="loop", backends=("hip", "cuda", "interpreter"),
      dtypes=DTYPES, interpreter=True, kind="library", backward=True)
def grouped_gemm_v0(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    offsets = validate.grouped_gemm_operands(x, w, offsets, DTYPES)
    return loop(x, w, offsets)
