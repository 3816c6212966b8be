"""The grouped GEMM problem, stated once: out[rows of g] = x[rows of g] @ w[g] for each group g.

x is (T, K) with its rows sorted by group (expert), w is (G, K, N), and ``offsets`` is
an int32 (G,) tensor of cumulative row ends, the semantics of ``torch._grouped_mm``'s
``offs``: group g owns rows ``offsets[g-1]:offsets[g]`` (``0:offsets[0]`` for g = 0),
so ``offsets[-1] == T`` and an empty group repeats the previous end. The output is
(T, N). This is the kernel of a mixture-of-experts layer once its tokens are permuted
so that each expert's rows are contiguous (:mod:`kernels.moe`).

A problem is the tuple (T, K, N, G, routing): ``routing`` indexes :data:`ROUTINGS`, how
the T rows are spread over the G groups, since the same T, K, N run very differently
when one expert gets everything. The CLI's ``--shape`` and every table name it so.
"""
from __future__ import annotations

import torch

from ...registry import OpSpec, register_op

DTYPES = (torch.float32, torch.float16, torch.bfloat16)

ROUTINGS = ("balanced", "skewed", "one_group", "sparse")
"""How rows spread over groups: equal shares; Zipf-like shares (a few hot experts, some
empty at small T); every row in one group; half the groups empty, the rest random."""

# (T, K, N, G, routing): odd sizes, one row, G = 1, every routing, empty groups.
SMOKE_SHAPES = (
    (1, 16, 8, 3, 0),
    (37, 24, 40, 4, 1),
    (65, 32, 17, 1, 0),
    (50, 48, 33, 8, 2),
    (70, 40, 24, 6, 3),
)

# Benchmark presets (GPU only): one GPU's slice of an expert-parallel MoE layer, 4096
# tokens per GPU routed top-k, with gate and up projections fused into one (2·hidden)
# GEMM. DeepSeek-V3-like: hidden 7168, expert 2048, 256 experts top-8, EP 8 (32 local
# experts). Mixtral-like: 4096 / 14336, 8 experts top-2, no EP. Qwen3-MoE-like (30B-A3B):
# 2048 / 768, 128 experts top-8, EP 4 (32 local).
BENCH_SHAPES = {
    "dsv3 gate+up (32 experts)": (32768, 7168, 4096, 32, 0),
    "dsv3 down (32 experts)": (32768, 2048, 7168, 32, 0),
    "dsv3 gate+up skewed": (32768, 7168, 4096, 32, 1),
    "mixtral gate+up (8 experts)": (8192, 4096, 28672, 8, 0),
    "mixtral down (8 experts)": (8192, 14336, 4096, 8, 0),
    "mixtral down skewed": (8192, 14336, 4096, 8, 1),
    "qwen3-moe gate+up (32 experts)": (32768, 2048, 1536, 32, 0),
    "qwen3-moe down (32 experts)": (32768, 768, 2048, 32, 0),
    "qwen3-moe down skewed": (32768, 768, 2048, 32, 1),
}


def group_sizes(t: int, g: int, routing: int, gen: torch.Generator) -> torch.Tensor:
    """Rows per group (int64, sums to ``t``) for one of :data:`ROUTINGS`."""
    name = ROUTINGS[routing]
    if name == "balanced":
        return torch.tensor([t // g + (i < t % g) for i in range(g)], dtype=torch.int64)
    if name == "one_group":
        sizes = torch.zeros(g, dtype=torch.int64)
        sizes[torch.randint(g, (), generator=gen)] = t
        return sizes
    if name == "skewed":
        weights = 1.0 / torch.arange(1, g + 1, dtype=torch.float64) ** 1.2
        weights = weights[torch.randperm(g, generator=gen)]
    else:  # sparse: half the groups (at least one) get rows
        weights = torch.zeros(g, dtype=torch.float64)
        weights[torch.randperm(g, generator=gen)[:max(1, g // 2)]] = 1.0
    if t == 0:
        return torch.zeros(g, dtype=torch.int64)
    picks = torch.multinomial(weights, t, replacement=True, generator=gen)
    return torch.bincount(picks, minlength=g)


def offsets_from_sizes(sizes: torch.Tensor, device="cpu") -> torch.Tensor:
    """The int32 cumulative row ends of per-group row counts."""
    return torch.cumsum(sizes, 0).to(device=device, dtype=torch.int32)


def make_inputs(shape, dtype=torch.float32, device="cpu", seed=0, layout="row"):
    """Fresh random x, w and the offsets of the shape's routing. ``layout`` "col" gives
    column-major x and w stored (G, N, K) seen as (G, K, N): how ``nn.Linear``-style
    expert weights arrive."""
    t, k, n, g, routing = shape
    gen = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(t, k, generator=gen)
    w = torch.randn(g, k, n, generator=gen)
    if layout == "col":
        x, w = x.t().contiguous().t(), w.transpose(1, 2).contiguous().transpose(1, 2)
    elif layout != "row":
        raise ValueError(f"layout must be 'row' or 'col', got {layout!r}")
    offsets = offsets_from_sizes(group_sizes(t, g, routing, gen), device)
    return x.to(device=device, dtype=dtype), w.to(device=device, dtype=dtype), offsets


def group_bounds(offsets: torch.Tensor) -> list[tuple[int, int]]:
    """(start, end) rows of each group, read on the host (one sync)."""
    ends = offsets.tolist()
    return list(zip([0, *ends[:-1]], ends))


def reference(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """float64 on the CPU, differentiable (the harness takes dx and dw from it)."""
    x, w = x.cpu().double(), w.cpu().double()
    parts = [x[s:e] @ w[g] for g, (s, e) in enumerate(group_bounds(offsets))]
    return torch.cat(parts) if parts else x.new_zeros((0, w.shape[2]))


def flops(shape) -> float:
    t, k, n, _, _ = shape
    return 2.0 * t * k * n


def backward_flops(shape) -> float:
    """dx (a grouped GEMM with wᵀ) and dw (per group xᵀ·dy): twice the forward."""
    return 2.0 * flops(shape)


def bytes_moved(shape, dtype: torch.dtype) -> float:
    """Minimum traffic: x and every expert's w read once, the output written once. With
    few rows per expert the weights dominate: that is when grouped GEMM is memory bound."""
    t, k, n, g, _ = shape
    return float((t * k + g * k * n + t * n) * torch.empty((), dtype=dtype).element_size())


SPEC = register_op(OpSpec(
    name="grouped_gemm",
    make_inputs=make_inputs,
    reference=reference,
    flops=flops,
    bytes_moved=bytes_moved,
    smoke_shapes=SMOKE_SHAPES,
    bench_shapes=BENCH_SHAPES,
    dtypes=DTYPES,
    shape_names=("T", "K", "N", "G", "routing"),
    quick_shapes=("dsv3 down (32 experts)", "mixtral down skewed"),
    grad_inputs=("x", "w"),
    backward_flops=backward_flops,
))
