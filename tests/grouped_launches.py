"""Count the grouped GEMM v4 launches a block makes, by kernel, with the weight operand each got.

Every forward launch (and dX, the forward kernel on a transposed weight) goes through
``LaunchPlan.launch``, kept launch plans included; every dW launch through ``dw.launch``.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch

from kernels.moe.grouped_gemm import v4_persistent


@contextlib.contextmanager
def grouped_launches() -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Within the block, a list of ("forward" | "dw", the launch's second operand)."""
    launches: list[tuple[str, torch.Tensor]] = []
    forward, dw = v4_persistent.LaunchPlan.launch, v4_persistent.dw.launch

    def counted_forward(self, x, w, offsets, out):
        launches.append(("forward", w))
        return forward(self, x, w, offsets, out)

    def counted_dw(a, b, *args):
        launches.append(("dw", b))
        return dw(a, b, *args)

    v4_persistent.LaunchPlan.launch, v4_persistent.dw.launch = counted_forward, counted_dw
    try:
        yield launches
    finally:
        v4_persistent.LaunchPlan.launch, v4_persistent.dw.launch = forward, dw
