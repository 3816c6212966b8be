"""Every cast to the FP8 gradient format, recorded, for the delayed-scaling tests of the
output gradients (Float8MoE's and the expert-parallel owner's): a gradient's casts must take
its history's scale."""
from __future__ import annotations

import torch

from kernels.moe.grouped_gemm_fp8 import quantize

# The casts a gradient can go through, and where the FP8 format is among the positional
# arguments after the tensor (the scale follows it): one operand's or both's.
CASTS = {"tokens": 1,            # (t, recipe, fp8, scale)
         "wgrad_operand": 2,     # (t, offsets, recipe, fp8, scale)
         "token_operands": 2}    # (t, offsets, recipe, fp8, scale)


class GradientCasts(list):
    """(tensor, scale, amax=) of each cast to ``grad_format`` while the test runs."""

    def __init__(self, monkeypatch, grad_format: torch.dtype):
        super().__init__()
        for name, at in CASTS.items():
            monkeypatch.setattr(quantize, name, self._spy(getattr(quantize, name), at, grad_format))

    def _spy(self, cast, at: int, grad_format: torch.dtype):
        def call(t, *args, **kwargs):
            if args[at] == grad_format:
                self.append((t.detach().clone(), args[at + 1].clone(), kwargs.get("amax", False)))
            return cast(t, *args, **kwargs)
        return call

    def of(self, dy: torch.Tensor) -> list[tuple[torch.Tensor, bool]]:
        """(scale, amax=) of the casts of the gradient ``dy``."""
        return [(scale, amax) for t, scale, amax in self if t.shape == dy.shape and torch.equal(t, dy)]
