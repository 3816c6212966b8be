"""The MoE layer in plain PyTorch, eagerly, one expert at a time: the statement of the
math that :class:`kernels.MoE` and every rung of the ``moe`` op are judged against.

:func:`moe_reference` is the routed part as a function of the weights (the op's float64
reference and its ``ref`` rung); :class:`MoEReference` is the layer: it owns the
parameters, and :class:`kernels.MoE` subclasses it, so both have the same parameter names
and shapes and a ``state_dict`` loads either way. It routes with ``torch.topk``, not
:func:`kernels.moe.route`, so the two implementations of routing check each other.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .routing import checked_top_k, router_dtype, router_logits


def swiglu(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor
           ) -> torch.Tensor:
    """One SwiGLU MLP: ``(silu(x @ gate) * (x @ up)) @ down``."""
    return (F.silu(x @ gate) * (x @ up)) @ down


def moe_reference(x: torch.Tensor, router: torch.Tensor, gate: torch.Tensor, up: torch.Tensor,
                  down: torch.Tensor, top_k: int, normalize: bool = True) -> torch.Tensor:
    """x ``(T, dim)``, router ``(E, dim)``, gate and up ``(E, dim, hidden)``, down
    ``(E, hidden, dim)`` -> ``(T, dim)``: ``Σ_j w[t, j] · SwiGLU_{e_j}(x_t)`` over each
    token's top_k experts.

    Router logits, softmax and top-k in float32 (float64 for float64 inputs), also under
    autocast (:func:`.routing.router_logits`); each
    expert's MLP in x's dtype; the weighted sum over a token's experts in float32 (a
    zero-initialized accumulator that each expert's rows are added into), cast to x's
    dtype at the end.
    """
    acc = router_dtype(x.dtype)
    probs = router_logits(x, router).softmax(dim=-1)
    weights, ids = probs.topk(checked_top_k(top_k, router.shape[0]), dim=-1)
    if normalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    out = torch.zeros(x.shape[0], down.shape[2], dtype=acc, device=x.device)
    for e in range(router.shape[0]):
        token, slot = (ids == e).nonzero(as_tuple=True)
        if token.numel():
            y = swiglu(x[token], gate[e], up[e], down[e])
            out = out.index_add(0, token, y.to(acc) * weights[token, slot].unsqueeze(-1))
    return out.to(x.dtype)


def _uniform(shape, fan_in: int, device, dtype) -> torch.nn.Parameter:
    """``nn.Linear``'s default init for a weight with this fan-in."""
    bound = 1.0 / math.sqrt(fan_in)
    return torch.nn.Parameter(torch.empty(shape, device=device, dtype=dtype).uniform_(-bound, bound))


class MoEReference(torch.nn.Module):
    """A mixture-of-experts layer: ``num_experts`` SwiGLU experts, each token routed to
    ``top_k`` of them, plus ``shared_experts`` always-on SwiGLU MLPs.

    Parameters: ``router.weight (E, dim)`` (an ``nn.Linear`` without bias); ``gate`` and
    ``up (E, dim, hidden)`` and ``down (E, hidden, dim)``, the experts stacked so that a
    grouped GEMM takes them as they are. S shared experts of hidden size h are stored as
    ``shared_gate`` and ``shared_up (dim, S·h)`` and ``shared_down (S·h, dim)``: the sum of
    S SwiGLU MLPs is one SwiGLU MLP over their concatenated hidden units, so a fast layer
    runs them as one MLP; this module runs them one by one. Their output is added with
    weight 1. Takes ``(..., dim)``, returns ``(..., dim)``.
    """

    def __init__(self, dim: int, hidden: int, num_experts: int, top_k: int,
                 shared_experts: int = 0, *, normalize: bool = True, device=None, dtype=None):
        super().__init__()
        for name, value, low in (("dim", dim, 1), ("hidden", hidden, 1),
                                 ("num_experts", num_experts, 1), ("shared_experts", shared_experts, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        self.dim, self.hidden, self.num_experts = dim, hidden, num_experts
        self.top_k = checked_top_k(top_k, num_experts)
        self.shared_experts, self.normalize = shared_experts, normalize
        self.router = torch.nn.Linear(dim, num_experts, bias=False, device=device, dtype=dtype)
        self.gate = _uniform((num_experts, dim, hidden), dim, device, dtype)
        self.up = _uniform((num_experts, dim, hidden), dim, device, dtype)
        self.down = _uniform((num_experts, hidden, dim), hidden, device, dtype)
        if shared_experts:
            width = shared_experts * hidden
            self.shared_gate = _uniform((dim, width), dim, device, dtype)
            self.shared_up = _uniform((dim, width), dim, device, dtype)
            self.shared_down = _uniform((width, dim), hidden, device, dtype)

    def router_logits(self, rows: torch.Tensor) -> torch.Tensor:
        """float32 logits (T, E): the router's weight in float32, or the router module itself
        on float32 rows when it is no plain Linear (an FP8 router of :func:`kernels.fp8.convert`)."""
        if type(self.router) is torch.nn.Linear:
            return router_logits(rows, self.router.weight)   # float32 under autocast too
        return self.router(rows.float()).float()

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, hidden={self.hidden}, num_experts={self.num_experts}, "
                f"top_k={self.top_k}, shared_experts={self.shared_experts}, "
                f"normalize={self.normalize}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.dim)
        out = moe_reference(flat, self.router.weight, self.gate, self.up, self.down,
                            self.top_k, self.normalize)
        h = self.hidden
        for s in range(self.shared_experts):
            cols = slice(s * h, (s + 1) * h)
            out = out + swiglu(flat, self.shared_gate[:, cols], self.shared_up[:, cols],
                               self.shared_down[cols])
        return out.reshape(x.shape)
