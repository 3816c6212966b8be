"""When a public op may run its implementation itself instead of calling its custom op.

Every public op is a ``torch.library`` custom op, so that ``torch.compile``, ``torch.export``,
FakeTensor, dispatch modes (``make_fx``, ``FlopCounterMode``), autocast and autograd see one
opaque node with a fake and an autograd formula. In a plain eager call under ``torch.no_grad``
(or on inputs that need no gradient) none of them is watching, and the custom op only adds its
Python dispatch (``workbench bench overhead`` measures it: the "custom op, no grad" floor, 11 to
15 µs per call on a busy two-core AMD EPYC, 2026-12-02, against under 2 µs for a plain Python
function). :func:`direct` says when the op may skip it: the implementation then runs as the
custom op's own CPU/CUDA kernel would, with the same inputs.

A call that needs a gradient still goes through the custom op: its autograd formula is the
one the backward runs, and a hand-made ``autograd.Function`` costs about as much as the
custom op's dispatch (both are floors the benchmark measures), so there is little to win there.
"""
from __future__ import annotations

import torch
from torch.autograd import forward_ad

_PLAIN = (torch.Tensor, torch.nn.Parameter)   # no subclass with its own dispatch (FakeTensor, DTensor)


def direct(*tensors: torch.Tensor, autocast: bool = False) -> bool:
    """Whether nothing but eager PyTorch sees this call, so the op may call its implementation:
    not traced by ``torch.compile`` or ``torch.jit.trace``; no torch-function mode (e.g.
    ``with torch.device(...)``) or dispatch mode (FakeTensorMode, ``make_fx``, export) active;
    no functorch transform (``vmap``, ``grad``) and no forward-mode AD level open; every tensor
    a plain ``torch.Tensor`` or ``Parameter``; no tensor that needs a gradient; and, for an op
    with an autocast rule (``autocast=True``), autocast off on the first tensor's device."""
    if (torch.compiler.is_compiling() or torch._C._is_torch_function_mode_enabled()
            or torch._C._len_torch_dispatch_stack() or forward_ad._current_level >= 0
            or torch._C._functorch.peek_interpreter_stack() is not None
            or torch._C._get_tracing_state() is not None):
        return False
    grad = torch.is_grad_enabled()
    for t in tensors:
        if type(t) not in _PLAIN or grad and t.requires_grad:
            return False
    return not (autocast and torch.is_autocast_enabled(tensors[0].device.type))
