"""Launch configurations of the fused MoE rung (v3): the grouped GEMM's pruned space, pruned
again for v3's two kernels, and the tuner that picks one per problem.

v3's kernels are grouped GEMMs with more in them (kernel 1 a gather and two accumulators,
kernel 2 a weighted scatter), so they start from what the grouped GEMM already keeps
(:mod:`kernels.moe.grouped_gemm.configs`: its candidates that compile without spills for
its own kernels) and compile those once more, ahead of time, as v3's gate/up and down
kernels: a config that spills in either is dropped (kernel 1's two accumulators spill
in tiles the grouped GEMM's one accumulator fits, see :mod:`.v3_fused`'s Limits), and so is one
with 8- or 16-bit LDS ops where a config without any is kept (recorded per kernel as
``narrow_lds_ops`` on AMD: none of the space has any, 2026-12-04). The verdicts ship as
``tuned_space.json`` beside this file, written by
``python -m workbench.isa.tune_space --op moe --write``. Per problem, :func:`choose` prunes
that space with the grouped GEMM's :func:`~kernels.moe.grouped_gemm.configs.prune` and
times the survivors on the first call of a key and keeps the fastest
(:func:`kernels.tuning.choice`, for the process and on disk), as the grouped GEMM's v4 does; the interpreter has one config and times nothing.
"""
from __future__ import annotations

from pathlib import Path

import torch
import triton

from ... import tuning
from ...triton_support import next_power_of_2
from ..grouped_gemm import configs as grouped

TABLE = Path(__file__).with_name("tuned_space.json")
KERNELS = ("gate_up", "down")   # v3's aot() order

def candidates(target_name: str) -> list[triton.Config]:
    """What the grouped GEMM's shipped table keeps for ``target_name``."""
    return tuning.kept(grouped.TABLE, target_name, grouped.candidates(target_name))


def space(backend: str, arch: str = "gfx942", dtype: torch.dtype | None = None) -> list[triton.Config]:
    """The candidates v3's own table keeps for the device's target and ``dtype`` (float32 has a
    section of its own, :func:`kernels.tuning.section`)."""
    return tuning.space(TABLE, backend, arch, candidates, grouped.interpreter_configs(), dtype)


def pruned(backend: str, arch: str, rows: int, n: int, groups: int, dtype: torch.dtype | None = None) -> list[dict]:
    """The configs worth timing for ``rows`` sorted rows over ``groups`` experts and N = ``n``
    output columns, the prior first (the grouped GEMM's prune at the average rows per expert)."""
    return [tuning.as_dict(c) for c in grouped.prune(space(backend, arch, dtype), -(-rows // max(groups, 1)), n)]


def choose(kernel: str, backend: str, arch: str, rows: int, n: int, groups: int,
           dtype: torch.dtype, run, layer: tuple | None = None) -> dict:
    """The config for this launch: the fastest pruned candidate (``run(cfg)`` launches one),
    timed once per (kernel, power-of-two buckets of rows, N, G, dtype) and kept. ``layer``:
    the layer's (T, dim, hidden, E, top_k), what a ranker is asked about (balanced routing:
    the prune, too, takes the average rows per expert)."""
    key = (kernel, next_power_of_2(rows), next_power_of_2(n), next_power_of_2(groups), dtype)
    problem = None if layer is None else (lambda: tuning.Problem("moe", "v3", (*layer, 0), dtype, kernel))
    return tuning.choice("moe/v3", key, lambda: pruned(backend, arch, rows, n, groups, dtype), run, problem)
