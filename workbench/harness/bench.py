"""Benchmark rungs against the library baseline in the same run (GPU only).

For each shape and dtype the baseline ``ref`` is timed first, then every rung on the
same inputs; each row carries its ratio to ``ref``. Only dtypes that ``ref`` takes on
this backend are planned (the registry says which: e.g. the one FP8 format this GPU's
matrix cores and library take). Every rung is timed through ``Rung.bind``, so operand
copies a rung (or ``ref``) needs are made before the clock starts.

Passes: every rung's ``forward`` is timed. A rung declared with a backward
(``Rung.backward``, of an op whose spec names ``grad_inputs``) is also timed in two more
passes, each on the same inputs with a fixed random output gradient made beforehand:
``backward`` (the gradients of the ``grad_inputs`` alone: the forward and its autograd
graph are built once, before the clock starts, and every timed call walks that graph
again with ``torch.autograd.grad(..., retain_graph=True)``, so each call runs the same
backward kernels on the same saved tensors and returns fresh gradients; nothing
accumulates) and ``forward+backward`` (a forward and then the backward of that forward,
per call). Each row names its pass and its ratio to ``ref`` is to ``ref``'s time in the
same pass. A backward's work is the spec's ``backward_flops``; its traffic, at least the
``grad_inputs`` and the output and its gradient read and the gradients written.

A case that fails (inputs, a launch, the library refusing) becomes an error row with
the message, and the run goes on. Rows go to a :class:`workbench.results.Recorder` the
moment they exist, so a file given as ``out`` holds every row measured so far, even
after a crash or Ctrl-C. A :class:`Budget` stops a run from starting new cases once its
time is spent, and lists the cases it left out.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import torch

import kernels

from . import environment
from .results import PASSES, Recorder, ResultRow
from .table import dtype_label
from .timing import require_gpu, time_ms


def shape_label(shape: tuple) -> str:
    return "x".join(str(s) for s in shape)


def default_dtypes(spec) -> list[torch.dtype]:
    """Training dtypes first: bf16 and fp16 where the op takes them, else its own (e.g. fp8)."""
    return [d for d in (torch.bfloat16, torch.float16) if d in spec.dtypes] or list(spec.dtypes)


@dataclass
class Budget:
    """Wall-clock seconds for a run: once spent, no new case starts; those left are listed."""

    seconds: float
    started: float = field(default_factory=time.monotonic)
    skipped: list[str] = field(default_factory=list)

    def remaining(self) -> float:
        return self.seconds - (time.monotonic() - self.started)

    def spent(self) -> bool:
        return self.remaining() <= 0


def planned_dtypes(op: str, dtypes: Iterable[torch.dtype] | None = None) -> list[torch.dtype]:
    """The dtypes to time ``op`` in: those asked for (default: :func:`default_dtypes`)
    that the baseline takes on this backend. Asking for one it does not take is an error:
    a ratio to ``ref`` needs ``ref``."""
    ref = kernels.registry.reference_rung(op)
    if dtypes is None:
        return [d for d in default_dtypes(kernels.spec(op)) if ref.supports(d)]
    dtypes = list(dtypes)
    refused = [dtype_label(d) for d in dtypes if not ref.supports(d)]
    if refused:
        here = kernels.backend.current()
        raise ValueError(f"{op} ref does not take {', '.join(refused)} on {here.name} "
                         f"({here.arch}); it takes {', '.join(map(dtype_label, ref.dtypes))}")
    return dtypes


def error_message(exc: BaseException) -> str:
    """What an error row says: the exception type and its message."""
    return f"{type(exc).__name__}: {exc}".strip()


class RowMaker:
    """What every row of one run says about where and when it was measured. ``input_args``: the
    keyword arguments the op's ``make_inputs`` took beyond shape and dtype (e.g. gemm_fp8's
    ``granularity``), named in each row's ``name`` so two such cases of one rung differ."""

    def __init__(self, op: str, input_args: dict | None = None):
        here, info = kernels.backend.current(), environment.describe()
        self.op = op
        self.note = ", ".join(f"{k}={v}" for k, v in (input_args or {}).items())
        self.common = dict(gpu=here.device_name, backend=here.name, arch=here.arch,
                           torch_version=info["torch"], triton_version=info["triton"],
                           commit=info["commit"], timestamp=environment.now())

    def name(self, rung) -> str:
        return f"{rung.name} [{self.note}]" if self.note else rung.name

    def measured(self, rung, shape, dtype, t, ref_ms: float | None,
                 pass_name: str = "forward") -> ResultRow:
        return ResultRow(op=self.op, rung=rung.label, name=self.name(rung), shape=shape_label(shape),
                         dtype=dtype_label(dtype), ms=t.median_ms, tflops=t.tflops, gbps=t.gbps,
                         ratio_to_ref=None if ref_ms is None else ref_ms / t.median_ms,
                         pass_name=pass_name, **self.common)

    def error(self, rung, shape, dtype, message: str, pass_name: str = "forward") -> ResultRow:
        return ResultRow(op=self.op, rung=rung.label, name=self.name(rung), shape=shape_label(shape),
                         dtype=dtype_label(dtype), ms=None, tflops=None, gbps=None,
                         ratio_to_ref=None, status="error", error=message, pass_name=pass_name,
                         **self.common)


def rung_passes(rung, spec, wanted: Iterable[str] = PASSES) -> list[str]:
    """The passes of ``wanted`` that ``rung`` is timed in: ``forward`` for every rung, and
    ``backward`` and ``forward+backward`` for a rung with a backward (``Rung.backward``)
    of an op whose spec names ``grad_inputs``."""
    own = PASSES if rung.backward and spec.grad_inputs else PASSES[:1]
    return [p for p in own if p in wanted]


def _output_grad(out: torch.Tensor, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randn(out.shape, generator=gen).to(device=out.device, dtype=out.dtype)


def timed_pass(rung, spec, shape, dtype, inputs, pass_name: str = "forward"):
    """(the zero-argument call to time, its work as ``time_ms`` takes it) for one pass.

    ``forward``: ``rung.bind(*inputs)`` itself. ``backward`` and ``forward+backward``: the
    ``grad_inputs`` become fresh leaves that require grad and one forward runs here,
    outside the timed call (it builds the graph the ``backward`` call walks again and
    again, and gives the output's shape for the fixed output gradient).
    """
    flops, moved = spec.flops(shape), spec.bytes_moved(shape, dtype)
    if pass_name == "forward":
        return rung.bind(*inputs), dict(flops=flops, bytes_moved=moved)
    if pass_name not in PASSES:
        raise ValueError(f"unknown pass {pass_name!r}; passes: {', '.join(PASSES)}")
    if spec.backward_flops is None:
        raise ValueError(f"{spec.name}'s OpSpec gives no backward_flops, so a backward has no TFLOP/s")
    n = len(spec.grad_inputs)
    leaves = [t.detach().requires_grad_() for t in inputs[:n]]
    call = rung.bind(*leaves, *inputs[n:])
    out = call()
    if not out.requires_grad:
        raise RuntimeError(f"{spec.name} {rung.title}: its output does not require grad, "
                           "so it has no backward to time")
    grad_out = _output_grad(out)
    back_flops = spec.backward_flops(shape)
    back_moved = float(2 * sum(t.nbytes for t in leaves) + 2 * out.nbytes)
    if pass_name == "backward":
        return (lambda: torch.autograd.grad(out, leaves, grad_out, retain_graph=True),
                dict(flops=back_flops, bytes_moved=back_moved))
    # Every timed call builds and walks its own graph (no closure keeps ``out``'s).
    return (lambda: torch.autograd.grad(call(), leaves, grad_out),
            dict(flops=flops + back_flops, bytes_moved=moved + back_moved))


def bench(op: str, shapes: Iterable[tuple] | None = None, dtypes: Iterable[torch.dtype] | None = None,
          rungs: Iterable[int | str] | None = None, progress: bool = True,
          out: str | Path | Recorder | None = None, budget: Budget | None = None,
          not_timed: dict[str, str] | None = None,
          passes: Iterable[str] | None = None, input_args: dict | None = None) -> list[ResultRow]:
    """Time the chosen rungs (default: all that run on GPUs, plus ref) on the given shapes.

    ``passes``: which of ``forward``, ``backward``, ``forward+backward`` to time (default:
    all; a rung is timed only in those it has, see :func:`rung_passes`). Within a case
    rows come pass by pass, ``ref`` first in each.

    ``out``: a .json/.csv path or a :class:`Recorder` (to share one file between ops);
    rows are saved as they come. ``not_timed`` maps rung labels to why they must not be
    timed (a check that raised): each of their cases becomes an error row with that reason.
    ``input_args``: keyword arguments for the op's ``make_inputs`` beyond shape and dtype (e.g.
    ``{"granularity": "channel"}`` for gemm_fp8's per-row scales), named in each row's ``name``.
    Returns this call's rows, error rows included.
    """
    from tqdm.auto import tqdm  # disable=None: a bar on a terminal, none in logs

    require_gpu()
    spec = kernels.spec(op)
    here = kernels.backend.current()
    recorder = out if isinstance(out, Recorder) else Recorder(out)
    first = len(recorder.rows)
    chosen = [kernels.get(op, r) for r in rungs] if rungs is not None else kernels.variants(op, include_ref=False)
    chosen = [r for r in chosen if r.rung is not None and here.name in r.backends]
    ref = kernels.registry.reference_rung(op)
    not_timed = not_timed or {}
    make = RowMaker(op, input_args)
    passes = list(PASSES if passes is None else passes)
    unknown = [p for p in passes if p not in PASSES]
    if unknown:
        raise ValueError(f"unknown passes {unknown}; passes: {', '.join(PASSES)}")
    wanted = [p for p in PASSES if p in passes]
    plan = [(s, d) for s in (shapes or spec.bench_shapes.values()) for d in planned_dtypes(op, dtypes)]
    for shape, dtype in tqdm(plan, desc=f"bench {op}", disable=None if progress else True):
        if budget is not None and budget.spent():
            budget.skipped.append(f"{op} {shape_label(shape)} {dtype_label(dtype)}"
                                  + (f" [{make.note}]" if make.note else ""))
            continue
        flops = spec.flops(shape)
        fits = [r for r in chosen if dtype in r.dtypes
                and (r.max_bench_flops is None or flops <= r.max_bench_flops)]
        try:
            inputs = spec.make_inputs(shape, dtype, device=here.device, seed=0, **(input_args or {}))
        except Exception as exc:   # every rung of this case is lost, the run is not
            for p in wanted:
                for r in [ref, *fits]:
                    if p in rung_passes(r, spec, wanted):
                        recorder.add(make.error(r, shape, dtype,
                                                f"making inputs: {error_message(exc)}", p))
            continue
        for p in wanted:
            ref_ms = None
            for r in [ref, *fits]:
                if p not in rung_passes(r, spec, wanted):
                    continue
                if r.label in not_timed:
                    recorder.add(make.error(r, shape, dtype, not_timed[r.label], p))
                    continue
                try:
                    fn, work = timed_pass(r, spec, shape, dtype, inputs, p)
                    t = time_ms(fn, **work)
                except Exception as exc:
                    recorder.add(make.error(r, shape, dtype, error_message(exc), p))
                    continue
                finally:
                    fn = None   # frees a backward's graph and gradients before the next rung
                ref_ms = t.median_ms if r is ref else ref_ms
                recorder.add(make.measured(r, shape, dtype, t, ref_ms, p))
    return recorder.rows[first:]
