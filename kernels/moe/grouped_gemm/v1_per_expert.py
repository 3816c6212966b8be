"""v1 per_expert: our own tiled GEMM kernel, launched once per expert.

Idea:
    Replace v0's vendor GEMM with the project's Triton GEMM (GEMM v4's kernel: MFMA
    tiles, a pipelined K loop through LDS, the AMD knobs) and keep v0's
    structure: read the offsets on the host, then launch the kernel once per
    non-empty expert on that expert's slice of x, its w[g] and its slice of the
    output (views, no copies). Many MoE kernels pad each expert's rows to a multiple
    of the block size so that no tile straddles two experts; here each launch sees
    only its own expert's rows and masks its last tile, so nothing is padded. The
    backward is the same pattern: dx[rows of g] = dy[rows of g] · w[g]ᵀ and
    dw[g] = x[rows of g]ᵀ · dy[rows of g], one launch each per expert (zeros for an
    empty expert's dw, no launch).

Why faster:
    The lesson is what it does *not* fix. Each launch is a well-tiled GEMM, but it
    is sized by one expert: with DeepSeek-V3's 32 local experts of 1024 rows x 7168
    columns in 128 x 128 tiles, every launch has 448 tiles, 1.47 waves on MI300X's
    304 CUs, and its second wave runs 47 % full; a skewed routing makes most launches
    a fraction of one wave. Between launches the GPU drains while Python issues the
    next one, and the host read of the offsets waits for all queued work first
    (reasoning and model, not measurements). Against v0 it saves one copy per
    expert (v0 writes each product into its slice of the output afterwards) and
    runs a kernel we can read and tune; the launches stay.

Expected bound:
    Launch and sync latency times G at small rows per expert; per-expert wave
    quantization at large ones. The single-launch v2 removes both (model).

Limits:
    The host sync of the offsets makes it unusable inside a CUDA/HIP graph or a
    ``torch.compile`` region without a graph break. 3·G launches per training step
    (forward, dx, dw). Any strides, as GEMM v4.
"""
from __future__ import annotations

import torch

from ... import backend as _backend
from ... import validate
from ...gemm import v4_lds_pipeline as gemm_v4
from ...gemm.spec import launch_ints
from ...outputs import new_output
from ...registry import AotKernel, rung
from ...triton_support import aot_launch, cdiv, interp_bf16
from ...xcd import num_xcds
from .grads import differentiable
from .launch import AOT_SHAPE
from .spec import DTYPES, group_bounds


def _gemm_into(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> None:
    """c = a @ b with GEMM v4's kernel, for views into the grouped operands."""
    (m, k), n = a.shape, b.shape[1]
    here = _backend.current()
    cfg = gemm_v4.config(here.name, here.arch, num_xcds(here))
    grid = (cdiv(m, cfg["BLOCK_M"]) * cdiv(n, cfg["BLOCK_N"]),)
    gemm_v4._gemm_pipelined_kernel[grid](a, b, c, m, n, k, *a.stride(), *b.stride(), *c.stride(),
                                         INTERP_BF16=interp_bf16(a.dtype), **cfg)


def grouped_mm(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """One launch per non-empty group; the offsets are read on the host (a sync)."""
    out = new_output((x.shape[0], w.shape[2]), x.dtype, x.device)
    # exercise begin: forward
    for g, (start, end) in enumerate(group_bounds(offsets)):
        if end > start:
            _gemm_into(x[start:end], w[g], out[start:end])
    # exercise end
    return out


def grouped_dw(x: torch.Tensor, dy: torch.Tensor, offsets: torch.Tensor, groups: int) -> torch.Tensor:
    """dw[g] = x_gᵀ · dy_g, one launch per non-empty group, zeros for the others."""
    dw = new_output((groups, x.shape[1], dy.shape[1]), x.dtype, x.device)
    # exercise begin: dw
    for g, (start, end) in enumerate(group_bounds(offsets)):
        if end > start:
            _gemm_into(x[start:end].t(), dy[start:end], dw[g])
        else:
            dw[g].zero_()
    # exercise end
    return dw


_differentiable = differentiable(grouped_mm, grouped_dw)


def aot(dtype: torch.dtype, backend: str, arch: str) -> list[AotKernel]:
    """One expert's launch of :data:`.launch.AOT_SHAPE` with balanced routing (T / G rows)."""
    t, k, n, g, _ = AOT_SHAPE
    return [aot_launch(gemm_v4._gemm_pipelined_kernel, dtype, gemm_v4.config(backend, arch),
                       launch_ints((t // g, n, k)), constexprs={"INTERP_BF16": False})]


@rung(op="grouped_gemm", rung=1, name="per_expert", backends=("hip", "cuda", "interpreter"),
      dtypes=DTYPES, interpreter=True, kind="triton", aot=aot, backward=True)
def grouped_gemm_v1(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor, *,
                    check_offsets: bool = True) -> torch.Tensor:
    """``check_offsets=False`` skips validating the offsets' values (the launches still
    read them on the host)."""
    offsets = validate.grouped_gemm_operands(x, w, offsets, DTYPES, check_values=check_offsets)
    return _differentiable(x, w, offsets)
