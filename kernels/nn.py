"""``kernels.nn.Linear``: ``torch.nn.Linear`` with its matmul done by :func:`kernels.matmul`.

A subclass, so parameters, initialization, ``state_dict`` keys and ``repr`` are
torch's own and a checkpoint loads either way; only ``forward`` differs. The bias is added in
the GEMM's epilogue, to the fp32 accumulator before the result's one rounding, as torch's
``addmm`` adds it (:mod:`kernels.gemm.linear`); under ``torch.autocast`` x, weight and bias are
cast to the autocast dtype (:mod:`kernels.autocast`) and the result is in it, as ``nn.Linear``'s is;
an fp32 weight there gets its gradient from the GEMM in fp32, not rounded to bf16 and cast back
(:mod:`kernels.gemm.wgrad`).
"""
from __future__ import annotations

import torch

from .gemm.linear import linear


class Linear(torch.nn.Linear):
    """``y = x @ weight.T + bias`` with ``weight`` stored (out_features, in_features)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)

    @classmethod
    def from_torch(cls, linear: torch.nn.Linear) -> "Linear":
        """A copy of ``linear`` (same weights, dtype, device) that runs on these kernels."""
        new = cls(linear.in_features, linear.out_features, bias=linear.bias is not None,
                  device=linear.weight.device, dtype=linear.weight.dtype)
        new.load_state_dict(linear.state_dict())
        return new
