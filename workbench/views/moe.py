"""Host-side views of the grouped GEMM for the MoE notebook (``notebooks/03_moe_ladder.ipynb``).

The one-launch rungs find their tiles on the device (:mod:`kernels.moe.grouped_gemm.schedule`),
which a reader cannot print; :func:`schedule` is the same mapping in plain Python, and a
test holds it to the device's. :func:`waves` is the wave-quantization model the notebook
applies per launch, and :func:`count_launches` counts what a call really launches and
reads back, so the notebook states launch counts it observed rather than typed.
"""
from __future__ import annotations

import contextlib
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kernels.triton_support import cdiv

HOST_READS = ("item", "tolist", "cpu", "numpy", "__int__", "__index__", "__float__", "__bool__")
"""Tensor methods that copy device data to the host (on a GPU: a sync), as the ladder tests trap them."""

LIBRARY_GEMMS = ("mm", "bmm", "addmm", "_grouped_mm")


def schedule(offsets, block_m: int) -> list[dict]:
    """One row per row tile of a one-launch grid, in program order: its group and rows.

    Group g's rows ``offsets[g-1]:offsets[g]`` make cdiv(rows, block_m) tiles (none when
    empty), numbered on from the groups before it: v2's program id along axis 0, and v4's
    work unit divided by the column tiles. Programs past the last tile have no row here
    (v2's surplus programs exit).
    """
    ends = [int(e) for e in offsets]
    rows = []
    for group, (start, end) in enumerate(zip([0, *ends[:-1]], ends)):
        for first in range(start, end, block_m):
            rows.append(dict(tile=len(rows), group=group, rows=f"{first}:{min(first + block_m, end)}"))
    return rows


def waves(tiles: int, cus: int) -> tuple[int, float]:
    """(waves, idle fraction) of one launch of ``tiles`` equal tiles on ``cus`` CUs, one tile
    per CU at a time: the CU slots of the last, partial wave that find no tile (model)."""
    count = cdiv(tiles, cus)
    return count, 1.0 - tiles / (count * cus) if count else 0.0


class _LibraryGemms(TorchDispatchMode):
    """Counts the vendor-GEMM calls (aten mm, bmm, addmm, _grouped_mm) under it."""

    def __init__(self, counts: Counter):
        super().__init__()
        self.counts = counts

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ in LIBRARY_GEMMS:
            self.counts["library GEMMs"] += 1
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def count_launches():
    """Counts, while open: Triton kernel launches, library GEMM calls and host reads of
    tensor data (outermost calls only: ``tolist`` calling ``__index__`` is one read).

    Triton launches are counted at ``run`` of the interpreter's and the compiler's kernel
    objects, which every ``kernel[grid](...)`` goes through.
    """
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    counts = Counter({"Triton launches": 0, "library GEMMs": 0, "host reads": 0})
    depth = [0]
    saved = {}

    def counted(owner, name, key):
        original = getattr(owner, name)
        saved[(owner, name)] = owner.__dict__.get(name)   # None: inherited, deleted again after

        def wrapper(*args, **kwargs):
            depth[0] += 1
            try:
                if depth[0] == 1 and not kwargs.get("warmup", False):
                    counts[key] += 1
                return original(*args, **kwargs)
            finally:
                depth[0] -= 1
        setattr(owner, name, wrapper)

    try:
        for cls in (InterpretedFunction, JITFunction):
            counted(cls, "run", "Triton launches")
        for name in HOST_READS:
            counted(torch.Tensor, name, "host reads")
        with _LibraryGemms(counts):
            yield counts
    finally:
        for (owner, name), original in saved.items():
            if original is None:
                delattr(owner, name)
            else:
                setattr(owner, name, original)
