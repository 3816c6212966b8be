"""What :class:`kernels.MoE` and its expert-parallel form share, in a module of its own so
that neither layer imports the other's: ``kernels.MoE`` builds the expert-parallel layer
when given ``ep_group`` (:mod:`.layer` imports :mod:`.ep_layer`), and the expert-parallel
layer (:class:`~kernels.moe.ep_layer.ExpertParallelMoE`) stands on this base, not on
``kernels.MoE``.
"""
from __future__ import annotations

import torch

from .reference import MoEReference, swiglu


class MoELayer(MoEReference):
    """The reference's parameters, initialization and ``state_dict`` keys (a checkpoint loads
    in any of the three layers), and what each call leaves behind: ``aux_loss``, the
    load-balancing loss of its routing, and ``expert_counts``, the token-slots per expert
    (both None before the first call)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.aux_loss: torch.Tensor | None = None
        self.expert_counts: torch.Tensor | None = None

    def shared_mlp(self, rows: torch.Tensor) -> torch.Tensor:
        """The shared experts' output (T, dim) for ``rows`` (T, dim), the routed experts' operand
        (in the autocast dtype where a region is open, so cast once for both: the reference's
        ``x @ gate`` and ``x @ up`` cast x once each, and autograd casts both gradients back).

        One SwiGLU MLP over their concatenated hidden units, as the reference computes it expert
        by expert, on torch's matmul: a dense GEMM, where :func:`kernels.matmul` would add host
        time and no kernel the step lacks. Measured on the CPU with launches stubbed (``workbench
        bench overhead``, the MoE case, AMD EPYC, 2026-12-06): with ``kernels.matmul`` and the
        fused SwiGLU the layer's forward made 120 Python calls instead of 55 and took 376 µs
        instead of 298 (each GEMM there is an ``autograd.Function``, torch's ``mm`` a C++ node);
        whether our GEMM beats the BLAS at these shapes is for a GPU to say."""
        return swiglu(rows, self.shared_gate, self.shared_up, self.shared_down)
