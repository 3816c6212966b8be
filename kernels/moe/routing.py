"""Routing: which experts each token goes to, with what weight, and how evenly.

:func:`route` is softmax-then-top-k, the router of Switch, GShard, Mixtral and
Qwen3-MoE. It computes in float32 (float64 for float64 logits), whatever the logits'
dtype: a top-k on bf16 probabilities would pick different experts than the same
router in fp32 whenever two probabilities round to one bf16 value, which happens
every few hundred tokens. Ties are broken deterministically (lowest expert id first),
so a routing never depends on the sort algorithm or the device.

:func:`aux_loss` is the load-balancing loss of Switch Transformers and GShard,
:func:`z_loss` ST-MoE's penalty on large router logits, and :func:`expert_counts` the
tokens per expert that they (and a dashboard) read. A ``bias`` passed to :func:`route`
steers which experts are chosen without changing their weights: the auxiliary-loss-free
balancing of DeepSeek-V3 (:mod:`.routing_bias` updates it).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import autocast, validate

_FLOATS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def checked_top_k(top_k, num_experts: int) -> int:
    """``top_k``, refused unless an int in [1, num_experts] (every router and layer checks it)."""
    if isinstance(top_k, bool) or not isinstance(top_k, int):
        raise TypeError(f"top_k must be an int, got {type(top_k).__name__}")
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"top_k={top_k} must be between 1 and the number of experts "
                         f"({num_experts})")
    return top_k


def router_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32, or float64 for float64 logits (so gradcheck can run on the router)."""
    return torch.promote_types(dtype, torch.float32)


def router_logits(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x @ weightᵀ`` (T, E) in :func:`router_dtype` of x's dtype (float32; float64 for float64
    x), also inside a ``torch.autocast`` region, where the matmul would otherwise run in the
    region's bf16 or fp16 whatever its operands' dtype: the router's precision is a choice the
    layers make (the module docstring says why), not the region's. Differentiable in both; their
    gradients come in their own dtypes."""
    if autocast.active() and autocast.region_dtype(x.device.type) is not None:
        with torch.autocast(x.device.type, enabled=False):
            return router_logits(x, weight)
    acc = torch.promote_types(x.dtype, torch.float32)   # router_dtype's, inline: a call less per layer call
    return F.linear(x.to(acc), weight.to(acc))


def route(logits: torch.Tensor, top_k: int, normalize: bool = True,
          bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Router logits ``(T, E)`` -> (weights ``(T, top_k)`` float32, expert ids ``(T, top_k)``
    int32), each token's experts in order of decreasing probability.

    The weights are the softmax probabilities of the chosen experts, divided by their sum
    when ``normalize`` (Mixtral, Qwen3-MoE's ``norm_topk_prob``), else the raw probabilities
    (Switch). Ties: among equal probabilities the lowest expert id is chosen (and comes
    first), because the selection is a stable descending sort. Differentiable in the
    logits through the weights; the ids are integers.

    ``bias`` ``(E,)``: added to the probabilities for the selection only (the ids, and their
    order, follow probability + bias); the weights stay the chosen experts' unbiased
    probabilities, so the bias moves load without entering the output or the gradient.
    That is DeepSeek-V3's auxiliary-loss-free balancing (arXiv:2412.19437, §2.1.2), whose
    router adds the bias to sigmoid affinities; here it is added to the softmax
    probabilities this router selects by.
    """
    validate.tensor("logits", logits, ndim=2, dtypes=_FLOATS, allow_empty=True)
    top_k = checked_top_k(top_k, logits.shape[1])
    probs = logits.to(router_dtype(logits.dtype)).softmax(dim=-1)
    scores = probs if bias is None else probs + _checked_bias(bias, logits).to(probs.dtype)
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices[:, :top_k]
    weights, ids = probs.gather(1, order), order.to(torch.int32)
    if normalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


def _checked_bias(bias, logits: torch.Tensor) -> torch.Tensor:
    validate.tensor("bias", bias, ndim=1, dtypes=_FLOATS, allow_empty=True)
    if bias.shape[0] != logits.shape[1]:
        raise ValueError(f"bias has {bias.shape[0]} experts but logits has {logits.shape[1]}")
    validate.same_device(logits=logits, bias=bias)
    return bias


def expert_counts(ids: torch.Tensor, num_experts: int, *, checked: bool = False) -> torch.Tensor:
    """Token-slots per expert, int64 ``(num_experts,)``, from ids ``(T, top_k)``.

    Integer sums, so the counts are exact and the same on every run (a scatter-add of
    integers has no rounding order to depend on). Ids are trusted here: :func:`route`
    made them; :func:`kernels.moe.permute` checks ids from elsewhere. ``checked=True``: the
    ids are :func:`route`'s, whose layout needs no second look (a layer's every call).
    """
    if not checked:
        validate.tensor("ids", ids, ndim=2, dtypes=(torch.int32, torch.int64), allow_empty=True)
    flat = ids.reshape(-1).long()
    return torch.zeros(num_experts, dtype=torch.int64, device=ids.device).scatter_add_(
        0, flat, torch.ones_like(flat))


def aux_loss(logits: torch.Tensor, ids: torch.Tensor, counts: torch.Tensor | None = None, *,
             checked: bool = False) -> torch.Tensor:
    """The auxiliary load-balancing loss ``E · Σ_e f_e · P_e`` (a float32 scalar).

    ``f_e`` is the fraction of the ``T · top_k`` token-slots routed to expert e, ``P_e``
    the mean over tokens of the router's softmax probability for e. This is the loss of
    Fedus, Zoph and Shazeer, "Switch Transformers" (arXiv:2101.03961, eq. 4), which
    simplifies the one of Lepikhin et al., "GShard" (arXiv:2006.16668), extended to
    top-k by counting slots. It is 1 for a perfectly even routing. A token's k slots go
    to k distinct experts, so no ``f_e`` exceeds 1/k and the loss peaks at E/k (E for
    top-1): every token's slots on the same k experts, one of which takes all the
    probability. Only ``P`` carries
    a gradient (the counts are discrete): the loss pushes probability away from
    overloaded experts. Multiply by a small coefficient (Switch: 1e-2) before adding it
    to the training loss. ``counts``: :func:`expert_counts` of ``ids``, if the caller has them.
    ``checked=True``: ``ids`` are :func:`route`'s of these ``logits``, which it checked (a layer's
    every call), so neither is checked again.
    """
    if not checked:
        validate.tensor("logits", logits, ndim=2, dtypes=_FLOATS, allow_empty=True)
        if ids.shape[0] != logits.shape[0]:
            raise ValueError(f"ids has {ids.shape[0]} tokens but logits has {logits.shape[0]}")
    num_experts = logits.shape[1]
    probs = logits.to(router_dtype(logits.dtype)).softmax(dim=-1)
    counts = expert_counts(ids, num_experts, checked=checked) if counts is None else counts
    fraction = counts.to(probs.dtype) / max(ids.numel(), 1)
    mean_prob = probs.sum(dim=0) / max(logits.shape[0], 1)   # 0, not NaN, for no tokens
    return num_experts * (fraction * mean_prob).sum()


def z_loss(logits: torch.Tensor) -> torch.Tensor:
    """The router z-loss ``mean over tokens of logsumexp(logits)²`` (a float32 scalar).

    Zoph et al., "ST-MoE" (arXiv:2202.08906): it penalizes large router logits, whose
    roundoff (in bfloat16 above all) the softmax's exponent amplifies; the paper weights it
    1e-3. It does not change which expert wins: shifting a token's logits by a constant
    leaves its softmax, and so the routing, as it was and moves its logsumexp, so the loss
    pulls the logits toward logsumexp 0. Zero tokens give 0, not NaN.
    """
    validate.tensor("logits", logits, ndim=2, dtypes=_FLOATS, allow_empty=True)
    lse = logits.to(router_dtype(logits.dtype)).logsumexp(dim=-1)
    return lse.square().sum() / max(logits.shape[0], 1)
