"""Benchmark rungs against the library baseline in the same run (GPU only).

For each shape and dtype the baseline ``ref`` is timed first, then every rung on the
same inputs; each row carries its ratio to ``ref``. Rows are
:class:`workbench.results.ResultRow` and go straight to a results file.
"""
from __future__ import annotations

from typing import Iterable

import torch

import kernels

from . import environment
from .results import ResultRow
from .timing import require_gpu, time_ms


def shape_label(shape: tuple) -> str:
    return "x".join(str(s) for s in shape)


def default_dtypes(spec) -> list[torch.dtype]:
    """Training dtypes first: bf16 and fp16 where the op takes them, else its own (e.g. fp8)."""
    return [d for d in (torch.bfloat16, torch.float16) if d in spec.dtypes] or list(spec.dtypes)


def bench(op: str, shapes: Iterable[tuple] | None = None, dtypes: Iterable[torch.dtype] | None = None,
          rungs: Iterable[int | str] | None = None, progress: bool = True) -> list[ResultRow]:
    """Time the chosen rungs (default: all that run on GPUs, plus ref) on the given shapes."""
    from tqdm.auto import tqdm  # disable=None: a bar on a terminal, none in logs

    require_gpu()
    spec = kernels.spec(op)
    here = kernels.backend.current()
    chosen = [kernels.get(op, r) for r in rungs] if rungs is not None else kernels.variants(op, include_ref=False)
    chosen = [r for r in chosen if r.rung is not None and here.name in r.backends]
    ref = kernels.registry.reference_rung(op)
    info = environment.describe()
    stamp = environment.now()
    rows = []
    plan = [(s, d) for s in (shapes or spec.bench_shapes.values())
            for d in (dtypes or default_dtypes(spec))]
    for shape, dtype in tqdm(plan, desc=f"bench {op}", disable=None if progress else True):
        inputs = spec.make_inputs(shape, dtype, device=here.device, seed=0)
        work = dict(flops=spec.flops(shape), bytes_moved=spec.bytes_moved(shape, dtype))
        fits = [r for r in chosen if dtype in r.dtypes
                and (r.max_bench_flops is None or work["flops"] <= r.max_bench_flops)]
        ref_timing = time_ms(lambda: ref(*inputs), **work)
        for r in [ref, *fits]:
            t = ref_timing if r is ref else time_ms(lambda r=r: r(*inputs), **work)
            rows.append(ResultRow(
                op=op, rung=r.label, name=r.name, shape=shape_label(shape),
                dtype=str(dtype).replace("torch.", ""), ms=t.median_ms, tflops=t.tflops, gbps=t.gbps,
                ratio_to_ref=ref_timing.median_ms / t.median_ms, gpu=here.device_name,
                backend=here.name, arch=here.arch,
                torch_version=info["torch"], triton_version=info["triton"], commit=info["commit"],
                timestamp=stamp))
    return rows
