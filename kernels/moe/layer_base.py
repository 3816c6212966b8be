"""What :class:`kernels.MoE` and its expert-parallel form share, in a module of its own so
that neither layer imports the other's: ``kernels.MoE`` builds the expert-parallel layer
when given ``ep_group`` (:mod:`.layer` imports :mod:`.ep_layer`), and the expert-parallel
layer (:class:`~kernels.moe.ep_layer.ExpertParallelMoE`) stands on this base, not on
``kernels.MoE``.
"""
from __future__ import annotations

import torch

from .reference import MoEReference


class MoELayer(MoEReference):
    """The reference's parameters, initialization and ``state_dict`` keys (a checkpoint loads
    in any of the three layers), and what each call leaves behind: ``aux_loss``, the
    load-balancing loss of its routing, and ``expert_counts``, the token-slots per expert
    (both None before the first call)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.aux_loss: torch.Tensor | None = None
        self.expert_counts: torch.Tensor | None = None
