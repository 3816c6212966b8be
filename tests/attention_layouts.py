"""Attention operands laid out as models lay them out, with the values unchanged, and the
gradients a backward hands them (before autograd's accumulation into ``.grad`` copies one into
its tensor's layout), for the tests that check the gradients' layouts."""
from __future__ import annotations

import torch


def fused_heads(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """``tensors`` (..., H_i, D) as views of one (..., Σ H_i·D) tensor, a fused QKV
    projection's output split per operand and viewed by heads: dense, not contiguous."""
    x = torch.cat([t.flatten(-2) for t in tensors], -1)
    widths = [t.shape[-2] * t.shape[-1] for t in tensors]
    return [part.unflatten(-1, t.shape[-2:]) for part, t in zip(x.split(widths, -1), tensors)]


def fused_projection(q, k, v) -> list[torch.Tensor]:
    """(B, H, S, D) operands as a model's attention gets them: heads of one (B, S, (Hq+2·Hkv)·D)
    projection, viewed (B, S, H, D) and transposed (S must equal S_k)."""
    return [t.transpose(1, 2) for t in fused_heads(*(t.transpose(1, 2) for t in (q, k, v)))]


def heads_major(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """Packed (T, H, D) tensors stored head by head, an (H, T, D) tensor transposed: dense, not
    contiguous (a packed fused projection's heads are not dense: ``torch.empty_like`` gives
    their gradients the contiguous layout)."""
    return [t.transpose(0, 1).contiguous().transpose(0, 1) for t in tensors]


def reversed_dims(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """Each tensor stored with its dimensions in reverse order (D outermost): dense, so its
    gradient gets its strides, whose head-dim stride is not 1."""
    return [t.permute(*reversed(range(t.dim()))).contiguous().permute(*reversed(range(t.dim()))) for t in tensors]


def sliced_head_dim(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """Each tensor as the first D columns of a wider one whose 3 other columns hold NaN: not
    dense, so its gradient gets dense strides (``torch.empty_like``'s)."""
    return [torch.cat([t, torch.full_like(t[..., :3], float("nan"))], -1)[..., :t.shape[-1]] for t in tensors]


def batch_expanded(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """Each tensor's first batch row read for every row (stride 0): overlapping, so its
    gradient gets dense strides and a row per batch entry, which autograd sums."""
    return [t[:1].expand_as(t) for t in tensors]


def gradients(out: torch.Tensor, inputs, grad: torch.Tensor) -> list[torch.Tensor]:
    """The gradients ``out``'s backward gives ``inputs``, as it laid them out."""
    return list(torch.autograd.grad(out, inputs, grad))
