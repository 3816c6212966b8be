"""The public attention: ``kernels.flash_attention`` and ``kernels.flash_attention_varlen``.

Which kernels run: v3's forward kernel (it keeps the log-sum-exp the backward needs)
launched with v4's tuned config, and v5's backward kernels. Not the registry's highest
rung as ``kernels.matmul`` picks: the forward must hand its LSE to the backward, which
only these functions agree on.

How it is wrapped: two PyTorch custom ops, ``kernels::flash_attention_fwd`` (returns O
and the LSE's two parts) and ``kernels::flash_attention_bwd`` (returns dQ, dK, dV), each with
a fake (meta) implementation, joined by ``register_autograd``, so
``torch.compile(fullgraph=True)`` sees two opaque nodes and no graph break, and the
backward runs as its own op.

Varlen: packed (total_tokens, H, D) tensors split by ``cu_seqlens`` (flash-attn's
layout: sequence i is rows cu_seqlens[i]:cu_seqlens[i+1], attending only within
itself). Causal is SDPA's top-left mask per sequence, like the dense op; flash-attn
2.1+ aligns its causal mask bottom-right instead, which differs only for sequences
whose query and key lengths differ. Each sequence is a
(1, H, S_i, D) stride view of the packed tensor, run through the op above, so
forward and backward are the same kernels; it costs one launch set per sequence
(a fused varlen grid is not done).
"""
from __future__ import annotations

import torch

from .. import validate
from . import v4_amd_tuned, v5_backward
from .spec import DTYPES, MAX_HEAD_DIM


@torch.library.custom_op("kernels::flash_attention_fwd", mutates_args=())
def _fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
         scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    return v4_amd_tuned.forward(q, k, v, causal, scale)


@_fwd.register_fake
def _(q, k, v, causal, scale):
    b, h, s, _ = q.shape
    return q.new_empty(q.shape), q.new_empty((b, h, 2, s), dtype=torch.float32)


@torch.library.custom_op("kernels::flash_attention_bwd", mutates_args=())
def _bwd(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
         lse: torch.Tensor, causal: bool, scale: float
         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return v5_backward.backward(q, k, v, o, lse, do, causal, scale)


@_bwd.register_fake
def _(do, q, k, v, o, lse, causal, scale):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _save(ctx, inputs, output):
    q, k, v, causal, scale = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.causal, ctx.scale = causal, scale


def _backward(ctx, do, _dlse):
    q, k, v, o, lse = ctx.saved_tensors
    dq, dk, dv = _bwd(do, q, k, v, o, lse, ctx.causal, ctx.scale)
    return dq, dk, dv, None, None


_fwd.register_autograd(_backward, setup_context=_save)


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                    scale: float | None = None) -> torch.Tensor:
    """softmax(q kᵀ · scale) v for q (B, Hq, S, D), k and v (B, Hkv, S_k, D); differentiable.

    Hq must be a multiple of Hkv (GQA/MQA). ``scale`` defaults to 1/sqrt(D); ``causal``
    is SDPA's ``is_causal`` (top-left aligned, also for S != S_k). fp32, fp16, bf16 with
    fp32 softmax statistics; any D <= 128, any lengths >= 1, any strides. The result is
    (B, Hq, S, D) in q's dtype. Errors name the argument at fault.
    """
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    scale = validate.attention_operands(q, k, v, scale, DTYPES, MAX_HEAD_DIM)
    return _fwd(q, k, v, causal, scale)[0]


def _check_cu_seqlens(name: str, cu: torch.Tensor, total: int, max_seqlen: int) -> list[int]:
    validate.tensor(name, cu, ndim=1, dtypes=(torch.int32,))
    bounds = cu.tolist()
    if len(bounds) < 2 or bounds[0] != 0:
        raise ValueError(f"{name} must start at 0 and hold batch + 1 offsets, got {bounds}")
    if any(b > a for a, b in zip(bounds[1:], bounds[:-1])):
        raise ValueError(f"{name} must be non-decreasing, got {bounds}")
    if bounds[-1] != total:
        raise ValueError(f"{name} ends at {bounds[-1]}, but the packed tensor has {total} tokens")
    longest = max(b - a for a, b in zip(bounds[:-1], bounds[1:]))
    if longest > max_seqlen:
        raise ValueError(f"{name} has a sequence of {longest} tokens, longer than its max_seqlen {max_seqlen}")
    return bounds


def flash_attention_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
                           max_seqlen_q: int, max_seqlen_k: int, causal: bool = False,
                           scale: float | None = None) -> torch.Tensor:
    """Attention over packed sequences: q (total_q, Hq, D), k and v (total_k, Hkv, D).

    Sequence i is q[cu_seqlens_q[i]:cu_seqlens_q[i+1]] against the same slice of k and v
    by ``cu_seqlens_k`` (int32, starting at 0, non-decreasing, ending at the token
    count). Returns (total_q, Hq, D) in q's dtype; differentiable. An empty sequence
    gives no rows.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        validate.tensor(name, t, ndim=3)
    bq = _check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q.shape[0], max_seqlen_q)
    bk = _check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, k.shape[0], max_seqlen_k)
    if len(bq) != len(bk):
        raise ValueError(f"cu_seqlens_q has {len(bq) - 1} sequences, cu_seqlens_k {len(bk) - 1}")
    if k.shape[0] != v.shape[0]:
        raise ValueError(f"k has {k.shape[0]} tokens, v {v.shape[0]}")
    outs = []
    for (q0, q1), (k0, k1) in zip(zip(bq[:-1], bq[1:]), zip(bk[:-1], bk[1:])):
        if q1 == q0:
            continue
        if k1 == k0:
            raise ValueError(f"a sequence has {q1 - q0} queries but no keys (cu_seqlens_k {bk})")
        views = (t[a:z].transpose(0, 1).unsqueeze(0) for t, a, z in
                 ((q, q0, q1), (k, k0, k1), (v, k0, k1)))
        outs.append(flash_attention(*views, causal=causal, scale=scale)[0].transpose(0, 1))
    return torch.cat(outs, dim=0)   # q has tokens (checked), so some sequence has rows
