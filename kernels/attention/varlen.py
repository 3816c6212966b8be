"""Packed sequences (flash-attn's varlen layout) for v3's forward and v5's backward kernels.

A packed batch is q (T, Hq, D), k and v (T_k, Hkv, D) with int32 ``cu_seqlens``: sequence
b is rows cu[b]:cu[b+1]. The kernels take it with ``VARLEN=True`` and one launch for
the whole batch: the grid's second axis is (sequence, head) as the dense batch's is,
the first covers the longest sequence, and each program reads its sequence's first
row and length from ``cu_seqlens`` on the device (:func:`clamped_sequence`), moves its pointers
there and returns if its block starts past the sequence's end. No per-sequence value
reaches the host, so a launch costs the same whatever the lengths.

The kernels index every tensor as (B, H, S, D); :meth:`Packing.views` hands them the
packed tensors as (B, H, T, D) views with batch stride 0 (every sequence sees the whole
pack, then moves to its rows), so the kernels' index arithmetic stays the dense one.
The softmax statistics are packed along tokens too: the LSE is (1, Hq, 2, T) and the
backward's Δ (1, Hq, T), row t holding packed query t, the dense layout of the batch-1
view.
"""
from __future__ import annotations

from dataclasses import InitVar, dataclass

import torch
import triton
import triton.language as tl

from .. import validate


@triton.jit
def sequence(cu_ptr, b):
    """First packed row and length of sequence ``b``: rows cu[b]:cu[b+1], for offsets kept
    inside the packed rows (:meth:`Packing.clamped`)."""
    start = tl.load(cu_ptr + b)
    return start, tl.load(cu_ptr + b + 1) - start


@triton.jit
def clamped_sequence(cu_ptr, b, total):
    """:func:`sequence` kept inside the ``total`` packed rows: offsets nobody checked (the
    default, as in flash-attn) may be wrong, but never make a program read or write
    outside the tensors; a sequence past the end, or ending before it starts, is empty."""
    start = tl.minimum(tl.maximum(tl.load(cu_ptr + b), 0), total)
    end = tl.minimum(tl.maximum(tl.load(cu_ptr + b + 1), start), total)
    return start, end - start


@dataclass(frozen=True)
class Packing:
    """The device offsets of a packed batch and the longest lengths, which size the grids.

    The offsets are kept packed (:func:`kernels.validate.index`): :func:`sequence` reads
    them as a flat array, and the host checked their values through their strides.
    ``checked=False``: offsets this module made, int32 and packed already (:meth:`clamped`)."""

    cu_q: torch.Tensor
    cu_k: torch.Tensor
    max_q: int
    max_k: int
    checked: InitVar[bool] = True

    def __post_init__(self, checked: bool):
        if not checked:
            return
        for field, name in (("cu_q", "cu_seqlens_q"), ("cu_k", "cu_seqlens_k")):
            packed = validate.index(name, getattr(self, field), ndim=1, dtypes=(torch.int32,))
            object.__setattr__(self, field, packed)   # frozen: set once, here

    @property
    def batch(self) -> int:
        return self.cu_q.shape[0] - 1

    def clamped(self, total_q: int, total_k: int) -> Packing:
        """The batch with its offsets kept inside the packed rows, computed on the device (no
        host read): clamped into [0, total] and made non-decreasing, so :func:`sequence` on
        them never leaves the tensors whatever offsets nobody checked held (their rows are
        then wrong, not out of bounds). Valid offsets come back unchanged. The backward's
        kernels take these; the forward's clamp as they read (:func:`clamped_sequence`),
        which costs the registers of v5's fullest kernels. One set of offsets for queries and
        keys (self-attention's) is clamped once: three small launches per backward, not six."""
        def inside(cu: torch.Tensor, total: int) -> torch.Tensor:
            return torch.cummax(cu.clamp(0, total), 0).values.to(torch.int32)
        cu_q = inside(self.cu_q, total_q)
        cu_k = cu_q if self.cu_k is self.cu_q and total_k == total_q else inside(self.cu_k, total_k)
        return Packing(cu_q, cu_k, self.max_q, self.max_k, checked=False)

    def views(self, *packed: torch.Tensor) -> list[torch.Tensor]:
        """(T, H, D) tensors as the kernels' (B, H, T, D), batch stride 0."""
        return [t.transpose(0, 1).unsqueeze(0).expand(self.batch, -1, -1, -1) for t in packed]


def aot_args(overrides: dict | None) -> tuple[dict, dict]:
    """Constexprs and pointer types of an ahead-of-time compile: the dense launch (the
    offsets None, as :func:`cu_args` passes them), or with ``{"VARLEN": True}`` among
    ``overrides`` the packed one, its offsets int32 pointers."""
    if (overrides or {}).get("VARLEN"):
        return {"VARLEN": True}, {"cu_q_ptr": "*i32", "cu_k_ptr": "*i32"}
    return {"VARLEN": False, "cu_q_ptr": None, "cu_k_ptr": None}, {}


def cu_args(packing: Packing | None) -> tuple:
    """The kernels' ``cu_q_ptr, cu_k_ptr`` arguments: None (a constexpr) for a dense launch,
    so the dense kernel compiles to exactly what it was before varlen existed."""
    return (None, None) if packing is None else (packing.cu_q, packing.cu_k)


def _bounds(name: str, cu: torch.Tensor, total: int, max_seqlen: int) -> list[int]:
    bounds = cu.tolist()
    if not bounds or bounds[0] != 0:   # [0] alone is a batch of no sequences
        raise ValueError(f"{name} must start at 0 and hold batch + 1 offsets, got {bounds}")
    if any(b > a for a, b in zip(bounds[1:], bounds[:-1])):
        raise ValueError(f"{name} must be non-decreasing, got {bounds}")
    if bounds[-1] != total:
        raise ValueError(f"{name} ends at {bounds[-1]}, but the packed tensor has {total} tokens")
    longest = max((b - a for a, b in zip(bounds[:-1], bounds[1:])), default=0)
    if longest > max_seqlen:
        raise ValueError(f"{name} has a sequence of {longest} tokens, longer than its max_seqlen {max_seqlen}")
    return bounds


def check_offsets(cu_q: torch.Tensor, cu_k: torch.Tensor, total_q: int, total_k: int,
                  max_q: int, max_k: int) -> None:
    """The errors that need the offsets' values: one host read of each, not one per sequence.
    (Their dtype and rank are metadata, checked before the op by :func:`check_metadata`.)"""
    bq = _bounds("cu_seqlens_q", cu_q, total_q, max_q)
    bk = _bounds("cu_seqlens_k", cu_k, total_k, max_k)
    if len(bq) != len(bk):
        raise ValueError(f"cu_seqlens_q has {len(bq) - 1} sequences, cu_seqlens_k {len(bk) - 1}")
    for (q0, q1), (k0, k1) in zip(zip(bq[:-1], bq[1:]), zip(bk[:-1], bk[1:])):
        if q1 > q0 and k1 == k0:
            raise ValueError(f"a sequence has {q1 - q0} queries but no keys (cu_seqlens_k {bk})")


def check_metadata(cu_q: torch.Tensor, cu_k: torch.Tensor, max_q, max_k) -> None:
    """What can be checked without reading the offsets (so also while torch.compile traces)."""
    for name, cu in (("cu_seqlens_q", cu_q), ("cu_seqlens_k", cu_k)):
        validate.tensor(name, cu, ndim=1, dtypes=(torch.int32,))
    for name, n in (("max_seqlen_q", max_q), ("max_seqlen_k", max_k)):
        if isinstance(n, bool) or not isinstance(n, (int, torch.SymInt)) or n < 0:
            raise ValueError(f"{name} must be an int >= 0, got {n!r}")
