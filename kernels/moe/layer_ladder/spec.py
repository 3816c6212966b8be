"""The MoE layer problem, stated once: route each token to its top-k SwiGLU experts and
sum their outputs, weighted (:func:`kernels.moe.reference.moe_reference`).

Inputs: x ``(T, dim)``, the router's weight ``(E, dim)``, gate and up ``(E, dim, hidden)``,
down ``(E, hidden, dim)``, and top_k (an int). Routing weights are renormalized over the
chosen experts; shared experts are not part of the op (they are a dense MLP beside it).
A problem is the tuple (T, dim, hidden, E, top_k, routing): ``routing`` indexes
:data:`ROUTINGS`, since the same sizes run very differently when a few experts get
most tokens.

How a routing is made: every token carries a component of size ``SHIFT`` along one random
unit direction u, and each router row has a component ``bias_e / SHIFT`` along u, so the
logits are the random ``x·w_e`` plus a per-expert bias (times a factor near 1). Balanced:
no bias. Skewed: Zipf-like biases ``-1.5·ln(rank)`` over a random ranking, a few hot
experts and, at small T, empty ones. One expert: a bias of +12 on one expert, which
every token chooses.

Near-ties: top-k is discontinuous. If a token's k-th and (k+1)-th logits were closer
than the rounding of the low-precision rungs, the float64 reference and a rung could
choose different experts and differ by a whole expert output. :func:`make_inputs`
therefore redraws every token whose gap there is below ``MIN_GAP`` (and, for "one
expert", every token that would not choose it), on the values rounded to the dtype, as
the rungs see them. The routers compute in float32 (:mod:`kernels.moe.routing`), whose
error on these logits is far below ``MIN_GAP``.
"""
from __future__ import annotations

import math

import torch

from ...registry import OpSpec, register_op
from ..reference import moe_reference

DTYPES = (torch.float32, torch.float16, torch.bfloat16)

ROUTINGS = ("balanced", "skewed", "one_expert")
SHIFT = 4.0        # size of every token's component along the routing direction u
MIN_GAP = 1e-3     # smallest k-th to (k+1)-th logit gap make_inputs lets through
_REDRAWS = 50

# (T, dim, hidden, E, top_k, routing): one token, top_k == E, E = 1, skewed (empty
# experts), every token to one expert; odd sizes, none a multiple of a block size.
SMOKE_SHAPES = (
    (1, 24, 16, 4, 2, 0),
    (37, 40, 24, 6, 6, 0),
    (29, 32, 20, 1, 1, 0),
    (45, 48, 33, 8, 2, 1),
    (33, 24, 17, 5, 2, 2),
)

# Benchmark presets (GPU only), 4096 tokens per GPU. DeepSeek-V3-like: dim 7168, expert
# hidden 2048, 256 experts top-8 under expert parallelism over 8 GPUs, modelled as one
# GPU's 32 local experts with top-8 among them (the same T·k = 32768 rows per GPU, the
# grouped GEMMs of the grouped_gemm op's dsv3 presets). Mixtral-like: 4096 / 14336,
# 8 experts top-2. Qwen3-MoE-like (30B-A3B): 2048 / 768, 128 experts top-8, on one GPU.
BENCH_SHAPES = {
    "dsv3 (32 local experts)": (4096, 7168, 2048, 32, 8, 0),
    "dsv3 skewed": (4096, 7168, 2048, 32, 8, 1),
    "mixtral (8 experts)": (4096, 4096, 14336, 8, 2, 0),
    "mixtral skewed": (4096, 4096, 14336, 8, 2, 1),
    "qwen3-moe (128 experts)": (4096, 2048, 768, 128, 8, 0),
    "qwen3-moe skewed": (4096, 2048, 768, 128, 8, 1),
}
AOT_SHAPE = BENCH_SHAPES["dsv3 (32 local experts)"]
"""The launch the ISA inspector shows for the fused rung's kernels."""


def expert_bias(e: int, routing: int, gen: torch.Generator) -> torch.Tensor:
    """The per-expert logit bias of one of :data:`ROUTINGS` (float64, (E,))."""
    name = ROUTINGS[routing]
    if name == "balanced":
        return torch.zeros(e, dtype=torch.float64)
    if name == "skewed":
        rank = torch.randperm(e, generator=gen).double() + 1
        return -1.5 * torch.log(rank)
    bias = torch.zeros(e, dtype=torch.float64)
    bias[torch.randint(e, (), generator=gen)] = 12.0
    return bias


def bad_tokens(x: torch.Tensor, router: torch.Tensor, top_k: int, hot: int | None) -> torch.Tensor:
    """Tokens (bool (T,)) whose routing a rung could get wrong: the k-th and (k+1)-th logits
    closer than MIN_GAP, or the expert ``hot`` not among the chosen."""
    logits = x.double() @ router.double().t()
    bad = torch.zeros(x.shape[0], dtype=torch.bool)
    if top_k < router.shape[0]:
        ranked = logits.sort(dim=-1, descending=True).values
        bad |= (ranked[:, top_k - 1] - ranked[:, top_k]) < MIN_GAP
    if hot is not None:
        bad |= ~(logits.topk(top_k, dim=-1).indices == hot).any(dim=-1)
    return bad


def make_inputs(shape, dtype=torch.float32, device="cpu", seed=0, layout="row"):
    """Fresh random x, router, gate, up, down (``nn.Linear``-like scales) and top_k, with
    the shape's routing and no near-ties (see the module docstring). ``layout`` "col"
    gives column-major x and router, and expert weights stored transposed
    (``(E, hidden, dim)`` seen as ``(E, dim, hidden)``): how ``nn.Linear``-style experts
    arrive."""
    t, dim, hidden, e, top_k, routing = shape
    gen = torch.Generator(device="cpu").manual_seed(seed)
    u = torch.randn(dim, generator=gen)
    u /= u.norm()
    bias = expert_bias(e, routing, gen)
    shift = SHIFT if ROUTINGS[routing] != "balanced" else 0.0
    router = torch.randn(e, dim, generator=gen) / math.sqrt(dim)
    router += (bias / SHIFT).float().unsqueeze(1) * u
    router = router.to(dtype).float()
    hot = int(bias.argmax()) if ROUTINGS[routing] == "one_expert" else None

    def draw(n: int) -> torch.Tensor:
        return (torch.randn(n, dim, generator=gen) + shift * u).to(dtype).float()

    x = draw(t)
    for _ in range(_REDRAWS):
        bad = bad_tokens(x, router, top_k, hot)
        if not bad.any():
            break
        x[bad] = draw(int(bad.sum()))
    else:
        raise RuntimeError(f"could not draw {shape} without near-ties in {_REDRAWS} tries")
    gate = torch.randn(e, dim, hidden, generator=gen) / math.sqrt(dim)
    up = torch.randn(e, dim, hidden, generator=gen) / math.sqrt(dim)
    down = torch.randn(e, hidden, dim, generator=gen) / math.sqrt(hidden)
    if layout == "col":
        x, router = x.t().contiguous().t(), router.t().contiguous().t()
        gate, up, down = (w.transpose(1, 2).contiguous().transpose(1, 2) for w in (gate, up, down))
    elif layout != "row":
        raise ValueError(f"layout must be 'row' or 'col', got {layout!r}")
    tensors = (v.to(device=device, dtype=dtype) for v in (x, router, gate, up, down))
    return (*tensors, top_k)


def reference(x, router, gate, up, down, top_k):
    """float64 on the CPU, differentiable (the harness takes the gradients from it)."""
    x, router, gate, up, down = (t.cpu().double() for t in (x, router, gate, up, down))
    return moe_reference(x, router, gate, up, down, top_k)


def flops(shape) -> float:
    """The router GEMM plus three expert GEMMs over the T·k routed rows."""
    t, dim, hidden, e, top_k, _ = shape
    return 2.0 * t * dim * e + 6.0 * t * top_k * dim * hidden


def backward_flops(shape) -> float:
    """Two GEMMs (input and weight gradients) per forward GEMM."""
    return 2.0 * flops(shape)


def bytes_moved(shape, dtype: torch.dtype) -> float:
    """Minimum traffic: x, the router and every expert's three matrices read once, the
    output written once. Permuted copies and the hidden activations are not counted:
    a layer that keeps them in HBM pays for them above this floor."""
    t, dim, hidden, e, _, _ = shape
    size = torch.empty((), dtype=dtype).element_size()
    return float((2 * t * dim + e * dim + 3 * e * dim * hidden) * size)


def modelled_bytes(shape, dtype: torch.dtype) -> dict[str, float]:
    """HBM bytes per call by rung (model, not measured): "floor" (:func:`bytes_moved`),
    "v2" and "v3". Each kernel reads its inputs and writes its outputs once; caches are
    ignored, so a token's row gathered once per slot counts k times. With R = T·k rows
    and S bytes per element, beside the floor's weights and router: v2's activations
    S·(2·T·dim + 5·R·dim + 6·R·hidden) (permute, gate, up, SwiGLU, down, unpermute),
    v3's S·(T·dim + 3·R·dim + 2·R·hidden), or S·(2·T·dim + 2·R·hidden) at top_k == 1
    (kernel 1 gathers x and writes h, kernel 2 reads h and writes the slots, the k-sum
    reads them and writes out; see :mod:`.v3_fused`)."""
    t, dim, hidden, e, top_k, _ = shape
    size = torch.empty((), dtype=dtype).element_size()
    rows = t * top_k
    params = (e * dim + 3 * e * dim * hidden) * size
    v3 = (2 * t * dim + 2 * rows * hidden if top_k == 1
          else t * dim + 3 * rows * dim + 2 * rows * hidden)
    return {"floor": bytes_moved(shape, dtype),
            "v2": float(params + (2 * t * dim + 5 * rows * dim + 6 * rows * hidden) * size),
            "v3": float(params + v3 * size)}


SPEC = register_op(OpSpec(
    name="moe",
    make_inputs=make_inputs,
    reference=reference,
    flops=flops,
    bytes_moved=bytes_moved,
    smoke_shapes=SMOKE_SHAPES,
    bench_shapes=BENCH_SHAPES,
    dtypes=DTYPES,
    shape_names=("T", "dim", "hidden", "E", "top_k", "routing"),
    quick_shapes=("mixtral skewed", "qwen3-moe (128 experts)"),
    grad_inputs=("x", "router", "gate", "up", "down"),
    backward_flops=backward_flops,
))
