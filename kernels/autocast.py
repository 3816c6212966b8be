"""Operands as ``torch.autocast`` would cast them for a matmul.

The package's ops are custom ops, and autocast casts only the ops it knows; a layer
built on them (``kernels.MoE``, the training step's linear and attention) casts its
operands itself, so under ``torch.autocast(dtype=torch.bfloat16)`` it runs in bf16 as
``nn.Linear`` would.
"""
from __future__ import annotations

import torch


def operands(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The tensors in the autocast dtype where autocast is on for their device, else as they are."""
    device = tensors[0].device.type
    if not (torch.amp.is_autocast_available(device) and torch.is_autocast_enabled(device)):
        return tensors
    dtype = torch.get_autocast_dtype(device)
    return tuple(t.to(dtype) for t in tensors)
