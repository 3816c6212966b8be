"""The attention problem, stated once: O = softmax(Q Kᵀ · scale [+ causal mask]) V.

Shapes: q (B, Hq, S, D); k and v (B, Hkv, S_k, D) with Hq a multiple of Hkv (GQA; MQA
when Hkv = 1): query head h reads key/value head h // (Hq / Hkv). A problem is the
tuple (B, Hq, Hkv, S, S_k, D, causal) with causal 0 or 1, so the CLI's ``--shape``
and every table name it the same way.

Causal means exactly what ``torch.nn.functional.scaled_dot_product_attention(
is_causal=True)`` means: the mask ``ones(S, S_k).tril(diagonal=0)``, aligned at the
top left. Query i sees keys 0..i, also when S != S_k (for S > S_k the last rows see
every key; no row is ever fully masked, since key 0 is always visible).
"""
from __future__ import annotations

import math

import torch

from ..registry import OpSpec, register_op

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_HEAD_DIM = 128

# (B, Hq, Hkv, S, S_k, D, causal): odd lengths, S_k != S, MQA/GQA/MHA, every head dim.
SMOKE_SHAPES = (
    (1, 4, 1, 1, 1, 32, 0),
    (1, 4, 2, 17, 40, 128, 1),
    (1, 8, 8, 65, 65, 32, 1),
    (2, 4, 1, 33, 20, 64, 0),
)

# Benchmark presets (GPU only): Llama-3-8B attention (32 query heads, 8 KV heads, D 128)
# at 16K tokens per batch, S 1K..16K; D 64 for comparison.
BENCH_SHAPES = {
    "llama3-8b S=1K causal": (16, 32, 8, 1024, 1024, 128, 1),
    "llama3-8b S=2K causal": (8, 32, 8, 2048, 2048, 128, 1),
    "llama3-8b S=4K causal": (4, 32, 8, 4096, 4096, 128, 1),
    "llama3-8b S=8K causal": (2, 32, 8, 8192, 8192, 128, 1),
    "llama3-8b S=16K causal": (1, 32, 8, 16384, 16384, 128, 1),
    "llama3-8b S=4K": (4, 32, 8, 4096, 4096, 128, 0),
    "llama3-8b S=4K x8 (128K tok)": (32, 32, 8, 4096, 4096, 128, 1),
    "D=64 S=4K causal": (4, 32, 8, 4096, 4096, 64, 1),
    "D=64 S=4K": (4, 32, 8, 4096, 4096, 64, 0),
}


def make_inputs(shape, dtype=torch.float32, device="cpu", seed=0, layout="row"):
    """Fresh random q, k, v and the causal flag. ``layout`` "col" gives the (B, S, H, D)
    memory layout seen as (B, H, S, D): the transposed-stride views a model hands over."""
    b, hq, hkv, s, sk, d, causal = shape
    gen = torch.Generator(device="cpu").manual_seed(seed)
    sizes = ((b, hq, s, d), (b, hkv, sk, d), (b, hkv, sk, d))
    if layout == "row":
        q, k, v = (torch.randn(*z, generator=gen) for z in sizes)
    elif layout == "col":
        q, k, v = (torch.randn(z[0], z[2], z[1], z[3], generator=gen).transpose(1, 2) for z in sizes)
    else:
        raise ValueError(f"layout must be 'row' or 'col', got {layout!r}")
    return (*(t.to(device=device, dtype=dtype) for t in (q, k, v)), bool(causal))


def probabilities(q, k, causal=False, scale=None):
    """P = softmax(scale · Q Kᵀ), k with one head per query head; causal: query i sees keys 0..i
    (1/√D for a ``scale`` of None). The reference's, and what a test modelling a backward needs."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q @ k.transpose(-1, -2)) * scale
    if causal:
        visible = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).tril()
        scores = scores.masked_fill(~visible, float("-inf"))
    return torch.softmax(scores, dim=-1)


def reference(q, k, v, causal=False, scale=None):
    """float64 on the CPU, differentiable (the harness takes dQ, dK, dV from it)."""
    q, k, v = (t.cpu().double() for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    return probabilities(q, k, causal, scale) @ v


def visible_pairs(s: int, sk: int, causal) -> int:
    """(query, key) pairs the mask keeps: S·S_k, or Σ_i min(i + 1, S_k) when causal."""
    if not causal:
        return s * sk
    full = max(s - sk, 0) * sk                  # rows i >= S_k see every key
    tri = min(s, sk)
    return full + tri * (tri + 1) // 2


def flops(shape) -> float:
    """Forward: QKᵀ and PV, 2·D flops per visible (query, key) pair each."""
    b, hq, _, s, sk, d, causal = shape
    return 4.0 * b * hq * d * visible_pairs(s, sk, causal)


def backward_flops(shape) -> float:
    """Backward: 2.5x the forward (FlashAttention-2's count): five products of 2·D flops per
    visible pair, S = QKᵀ (recomputed), dP = dO Vᵀ, dV = Pᵀ dO, dK = dSᵀ Q, dQ = dS K.
    v5 computes S and dP twice (seven products) to avoid atomics; that is its overhead,
    not counted, so every rung and SDPA are rated on the same work."""
    return 2.5 * flops(shape)


def bytes_moved(shape, dtype: torch.dtype) -> float:
    """Minimum forward traffic: q, k, v read once, o written once. With GQA, k and v
    are Hq/Hkv times smaller than q, which is where GQA saves bytes."""
    b, hq, hkv, s, sk, d, _ = shape
    size = torch.empty((), dtype=dtype).element_size()
    return float((2 * b * hq * s * d + 2 * b * hkv * sk * d) * size)


SPEC = register_op(OpSpec(
    name="attention",
    make_inputs=make_inputs,
    reference=reference,
    flops=flops,
    bytes_moved=bytes_moved,
    smoke_shapes=SMOKE_SHAPES,
    bench_shapes=BENCH_SHAPES,
    dtypes=DTYPES,
    shape_names=("B", "Hq", "Hkv", "S", "Sk", "D", "causal"),
    quick_shapes=("llama3-8b S=4K causal", "llama3-8b S=4K"),
    grad_inputs=("q", "k", "v"),
    backward_flops=backward_flops,
))
