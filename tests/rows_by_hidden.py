"""Every aten op that reads or writes a tensor of one shape, for the MoE backwards' tests that
count torch passes and float32 temporaries over (T·k, hidden): v3's
(``tests/test_moe_swiglu_backward.py``) and the FP8 layers' (``tests/test_fp8_moe_swiglu_backward.py``).
A dispatch mode sees a custom op (``kernels.*``) as one op, not what runs inside it."""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class RowsByHidden(TorchDispatchMode):
    """``ops``: (name, [(dtype, shape) of each output tensor]) of every aten op that reads or
    writes a tensor of ``shape``."""

    def __init__(self, shape):
        super().__init__()
        self.shape, self.ops = tuple(shape), []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        outs = [t for t in (out if isinstance(out, (tuple, list)) else (out,)) if isinstance(t, torch.Tensor)]
        tensors = [t for t in (*args, *(kwargs or {}).values(), *outs) if isinstance(t, torch.Tensor)]
        if any(tuple(t.shape) == self.shape for t in tensors):
            self.ops.append((str(func.overloadpacket), [(t.dtype, tuple(t.shape)) for t in outs]))
        return out

    def float32_outputs(self) -> list:
        """The ops that wrote a float32 tensor of ``shape``."""
        return [(op, outs) for op, outs in self.ops if (torch.float32, self.shape) in outs]

    def torch_ops(self) -> set[str]:
        """The names of the ops seen that are not the project's custom ops (``kernels.*``)."""
        return {op for op, _ in self.ops if not op.startswith("kernels.")}
