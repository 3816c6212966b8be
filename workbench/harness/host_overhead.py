"""CPU host overhead, launch stubbed: what each public op costs the host per call, next to torch's.

A training step calls ``kernels.matmul`` and friends thousands of times; on a GPU each
call's Python (checks, rung and config lookup, argument packing, the custom-op and
autograd wrappers) runs on the CPU while the GPU waits for the next launch. This
benchmark isolates that Python path: every Triton launch is replaced by a no-op
(:func:`stubbed_launches`, which still receives the packed arguments and counts the
launches), so what is timed is everything our op does *except* Triton's own launcher
and the kernel. Outputs are still allocated, as the real path does.

What it is compared with: the same torch operation (``torch.matmul``, ``nn.Linear``,
SDPA, ``torch._grouped_mm``, ``torch._scaled_mm``, the reference MoE layer), or for the
training model's norm (alone and after a residual add), rotary embedding and loss the torch code
the op replaces there (``F.rms_norm``, ``x + branch`` then ``F.rms_norm``, ``apply_rope``,
``F.cross_entropy`` of bf16 logits cast to fp32), called on CPU
tensors of the same rank, dtypes and layout kind but the smallest sizes the op takes
(mostly 1), so its kernel does next to no work: what is left is torch's dispatch, its
checks and its output allocation, plus a one-element kernel. That makes torch's number an
upper bound on its dispatch, i.e. the ratio errs in our favour by the cost of a tiny kernel.
There is no varlen attention op in torch for CPU: varlen is compared with the same small SDPA
call as the dense op. The MoE layer is compared with :class:`kernels.moe.reference.MoEReference`
(torch ops, an expert loop) at one token. Beside them the report gives the floors under
every op: an op that only allocates its output, called as a plain Python function, as a
``torch.library.custom_op`` with a fake and an autograd formula (on inputs that need no
gradient, and on one that does) and as an ``autograd.Function`` of either kind,
``forward(ctx, ...)`` and ``forward`` with ``setup_context`` (:func:`floors_us`). A public op
called eagerly skips its custom op (:func:`kernels.eager.path`): on inputs that need no
gradient its floor is the plain function's; ``nn.Linear`` and ``MoE`` own weights that need
gradients, so as the case calls them they run their own ``forward(ctx, ...)`` Function and pay
its floor (the custom op's, three times higher, is paid only where something traces or
transforms), and the report also times every op under ``torch.no_grad``. Triton's own launcher (``JITFunction.run``: its
argument binding, cache lookup and the driver's launch) is stubbed out and not measured here.

The goal (issue 18) is our time within twice torch's (:data:`GOAL`); the report says per op
whether it is met.

``kernels.fp8.Float8Linear`` is measured per recipe (:data:`FP8_RECIPES`: each this installation runs), its forward and its
forward with the backward (``torch.autograd.grad`` of x, weight and bias), against
``torch.nn.Linear`` called the same way (issue 22: an FP8 step whose Linears' host time exceeds
their GEMMs' is host-bound). Every row also gives the device ops per call on each side: the
Triton launches and the torch ops that run a kernel, counted on the path an eager call takes
(:mod:`workbench.harness.device_ops`), each of which costs a GPU's host a launch.

The breakdown splits our time into validation, rung/config lookup (with the launch plan's key
and lookup, :mod:`kernels.plans`), argument packing (the rung bodies up to the launch), output
allocation, custom-op/autograd dispatch (with :func:`kernels.eager.path`, which decides it)
and the stubbed launch, by the shares of a cProfile run (each function's own time, a built-in's
charged to its caller's section) applied to the measured median. cProfile slows Python calls more than
C calls, so the shares are a guide, not a measurement. :func:`python_calls` counts the Python
calls our code makes per op call: the number a test bounds, since it does not depend on the CPU.

torch runs on one thread while measuring: on a GPU its CPU-side ops (the MoE routing) would
be launches, and on a loaded machine a second intra-op thread only adds waits (the MoE
layer's shared-expert SwiGLU, three matmuls of 32x64x128, took 48 ms with two threads and
40 µs with one on a two-core AMD EPYC shared with other work, 2026-12-02).

Never a GPU number: the label names the CPU, and the machine's load changes the numbers
(medians of several repetitions of thread CPU time). ``workbench bench overhead`` prints it.
"""
from __future__ import annotations

import cProfile
import functools
import json
import os
import platform
import pstats
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType
from typing import Callable

import torch
import torch.nn.functional as F

import kernels
import kernels.fp8
from kernels import eager

from kernels.rotary.reference import apply_rope, rope_tables
from . import device_ops, environment
from .device_ops import stubbed_launches   # where the launches are stubbed, for callers of this benchmark
from .table import format_table

LABEL = "CPU host overhead, launch stubbed"
SECTIONS = ("validation", "lookup", "packing", "allocation", "dispatch", "launch", "other")


@dataclass(frozen=True)
class Case:
    """One public op at one shape: ``ours()`` and ``torch()`` each build inputs and return the call;
    ``backward``: the call runs a backward too (not timed under ``torch.no_grad``)."""

    op: str
    shape: str
    ours: Callable[[], Callable[[], object]]
    torch_op: str
    torch: Callable[[], Callable[[], object]]
    backward: bool = False


def _device() -> str:
    return kernels.backend.current().device


def _randn(*shape, dtype=torch.float32, device=None) -> torch.Tensor:
    return torch.randn(*shape, dtype=dtype, device=device or _device())


def _matmul():
    a, b = _randn(64, 128), _randn(128, 96)
    return lambda: kernels.matmul(a, b)


def _torch_matmul():
    a, b = _randn(1, 1), _randn(1, 1)
    return lambda: torch.matmul(a, b)


def _linear(in_features=128, out_features=96, tokens=(4, 16)):
    layer = kernels.nn.Linear(in_features, out_features, device=_device())
    x = _randn(*tokens, in_features)
    return lambda: layer(x)


def _torch_linear():
    layer = torch.nn.Linear(1, 1, device=_device())
    x = _randn(1, 1, 1)
    return lambda: layer(x)


def _attention():
    q, k, v = _randn(1, 8, 64, 64), _randn(1, 2, 64, 64), _randn(1, 2, 64, 64)
    return lambda: kernels.flash_attention(q, k, v, causal=True)


def _torch_attention():
    q, k, v = _randn(1, 2, 1, 1), _randn(1, 1, 1, 1), _randn(1, 1, 1, 1)
    return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def _varlen():
    q, k, v = _randn(128, 8, 64), _randn(128, 2, 64), _randn(128, 2, 64)
    cu = torch.tensor([0, 50, 128], dtype=torch.int32, device=_device())
    return lambda: kernels.flash_attention_varlen(q, k, v, cu, cu, 78, 78, causal=True)


def _grouped_gemm():
    x, w = _randn(128, 64), _randn(4, 64, 96)
    offsets = torch.tensor([32, 64, 96, 128], dtype=torch.int32, device=_device())
    return lambda: kernels.grouped_gemm(x, w, offsets)


def _torch_grouped_gemm():
    # torch._grouped_mm takes bf16 with 16-byte aligned strides: 8 elements is its smallest K and N
    x = _randn(1, 8, dtype=torch.bfloat16)
    w = _randn(1, 8, 8, dtype=torch.bfloat16).transpose(1, 2)
    offsets = torch.tensor([1], dtype=torch.int32, device=_device())
    return lambda: torch._grouped_mm(x, w, offs=offsets)


def _fp8_operands(m, k, n):
    fp8 = kernels.gemm_fp8.fp8_dtype()
    a = _randn(m, k).to(fp8)
    b = _randn(n, k).to(fp8).t()   # K-contiguous, as torch._scaled_mm wants it
    return a, b, _randn(m, 1), _randn(1, n)


def _matmul_fp8():
    a, b, sa, sb = _fp8_operands(64, 128, 96)
    return lambda: kernels.matmul_fp8(a, b, sa, sb)


def _torch_matmul_fp8():
    a, b, sa, sb = _fp8_operands(16, 16, 16)   # torch._scaled_mm's smallest sizes
    return lambda: torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)


# every recipe of kernels.fp8 whose kernels this installation has (kernels.fp8.Recipe.needs)
FP8_RECIPES = tuple(r for r in kernels.fp8.names() if not kernels.fp8.get(r).needs)


def _fp8_linear(recipe: str, backward: bool):
    """A training-mode Float8Linear 128->96 on x (64, 128) fp32: its forward, or its forward and
    backward (``torch.autograd.grad`` of x, weight and bias, as a step without accumulated grads)."""
    layer = kernels.fp8.Float8Linear.from_linear(torch.nn.Linear(128, 96, device=_device()), recipe)
    return _forward_backward(layer, _randn(64, 128), _randn(64, 96), backward)


def _torch_linear_step():
    return _forward_backward(torch.nn.Linear(1, 1, device=_device()), _randn(1, 1), _randn(1, 1), True)


def _forward_backward(layer, x, dy, backward):
    if not backward:
        return lambda: layer(x)
    x.requires_grad_()
    inputs = (x, *layer.parameters())
    return lambda: torch.autograd.grad(layer(x), inputs, dy)


def _rms_norm():
    x, weight = _randn(4, 16, 64), _randn(64)
    return lambda: kernels.rms_norm(x, weight, 1e-6)


def _torch_rms_norm():
    # torch's own RMSNorm: on a CPU torch it decomposes into the six aten ops of the model's formula
    # (workbench.train.layers.RMSNorm, which this layer may not import), at less Python than a module call
    x, weight = _randn(1, 1, 1), _randn(1)
    return lambda: F.rms_norm(x, (1,), weight, 1e-6)


def _add_rms_norm():
    # the training step's: the fp32 residual stream, a block's bf16 branch, y in the region's bf16
    x, branch, weight = _randn(4, 16, 64), _randn(4, 16, 64, dtype=torch.bfloat16), _randn(64)
    return lambda: kernels.add_rms_norm(x, branch, weight, 1e-6, out_dtype=torch.bfloat16)


def _torch_add_rms_norm():
    x, branch, weight = _randn(1, 1, 1), _randn(1, 1, 1, dtype=torch.bfloat16), _randn(1)

    def call():
        h = x + branch
        return h, F.rms_norm(h, (1,), weight, 1e-6)
    return call


def _projection_heads(batch, seq, heads, head_dim):
    """q as the model lays it out: a (B, S, H, D) projection viewed as (B, H, S, D), no copy."""
    return _randn(batch, seq, heads, head_dim).transpose(1, 2)


def _rope():
    x, (cos, sin) = _projection_heads(1, 64, 8, 64), rope_tables(64, 64, 10000.0, _device())
    return lambda: kernels.rope(x, cos, sin)


def _torch_rope():
    x, (cos, sin) = _projection_heads(1, 1, 1, 2), rope_tables(1, 2, 10000.0, _device())
    return lambda: apply_rope(x, cos, sin)


# The loss's case is the training model's: bf16 logits (the lm_head's output under the step's
# bf16 autocast, workbench/train/model.py), which torch's side casts to fp32 before
# F.cross_entropy, a copy that is part of the code the op replaces, and which the op does not
# make (it reads the logits in their own dtype). With fp32 logits ``.float()`` returns its input
# and torch's side is the bare F.cross_entropy (2.8 µs against 4.1 µs for bf16 on this AMD EPYC,
# 2026-12-06): a case the step does not run.
def _cross_entropy():
    logits = _randn(64, 1000, dtype=torch.bfloat16)
    targets = torch.randint(1000, (64,), device=_device())
    return lambda: kernels.cross_entropy(logits, targets)


def _torch_cross_entropy():
    logits, targets = _randn(1, 1, dtype=torch.bfloat16), torch.zeros(1, dtype=torch.int64, device=_device())
    return lambda: F.cross_entropy(logits.float(), targets)


def _moe_layer(cls, dim, hidden, tokens):
    layer = cls(dim, hidden, 8, 2, 1, device=_device())
    x = _randn(*tokens, dim)
    return lambda: layer(x)


def cases() -> list[Case]:
    """Every public op at a small realistic shape (the sizes matter little: no kernel runs)."""
    from kernels.moe.reference import MoEReference

    return [
        Case("matmul", "64x128 @ 128x96 fp32", _matmul, "torch.matmul 1x1 @ 1x1", _torch_matmul),
        Case("nn.Linear", "128->96, x (4, 16, 128) fp32", _linear, "torch.nn.Linear 1->1", _torch_linear),
        Case("flash_attention", "q (1, 8, 64, 64), kv (1, 2, 64, 64) causal", _attention,
             "SDPA q (1, 2, 1, 1) kv (1, 1, 1, 1) causal GQA", _torch_attention),
        Case("flash_attention_varlen", "q (128, 8, 64), kv (128, 2, 64), 2 sequences causal", _varlen,
             "SDPA q (1, 2, 1, 1) kv (1, 1, 1, 1) causal GQA", _torch_attention),
        Case("grouped_gemm", "x (128, 64), w (4, 64, 96) fp32", _grouped_gemm,
             "torch._grouped_mm x (1, 8), w (1, 8, 8) bf16", _torch_grouped_gemm),
        Case("matmul_fp8", "64x128 @ 128x96 fp8, row/col scales", _matmul_fp8,
             "torch._scaled_mm 16x16 @ 16x16", _torch_matmul_fp8),
        Case("MoE", "dim 64, hidden 128, 8 experts top-2, 1 shared, x (2, 16, 64)",
             lambda: _moe_layer(kernels.MoE, 64, 128, (2, 16)),
             "MoEReference dim 1, hidden 1, 8 experts top-2, 1 shared, x (1, 1, 1)",
             lambda: _moe_layer(MoEReference, 1, 1, (1, 1))),
        Case("rms_norm", "x (4, 16, 64), weight (64,) fp32", _rms_norm,
             "F.rms_norm x (1, 1, 1), weight (1,)", _torch_rms_norm),
        Case("add_rms_norm", "x (4, 16, 64) fp32 + branch bf16, weight (64,) fp32, y bf16", _add_rms_norm,
             "x + branch, F.rms_norm x (1, 1, 1), weight (1,)", _torch_add_rms_norm),
        Case("rope", "x (1, 8, 64, 64) transposed from (1, 64, 8, 64), cos/sin (64, 32) fp32", _rope,
             "apply_rope x (1, 1, 1, 2) transposed, cos/sin (1, 1)", _torch_rope),
        Case("cross_entropy", "logits (64, 1000) bf16, int64 targets", _cross_entropy,
             "F.cross_entropy(logits.float(), targets) logits (1, 1) bf16", _torch_cross_entropy),
        *(Case(f"Float8Linear {recipe}{' fwd+bwd' * backward}", "128->96, x (64, 128) fp32",
               functools.partial(_fp8_linear, recipe, backward),
               "torch.nn.Linear 1->1" + " fwd+bwd" * backward, _torch_linear_step if backward else _torch_linear,
               backward)
          for recipe in FP8_RECIPES for backward in (False, True)),
    ]


def per_call_us(call: Callable[[], object], calls: int, repeats: int) -> float:
    """Median over ``repeats`` of the mean µs per call over ``calls`` back-to-back calls, in
    the CPU time of this thread (``time.thread_time_ns``), not wall-clock: on a loaded
    machine a long loop is descheduled more often than a short one, and wall-clock would
    charge our slower op for the time it waited for a core."""
    for _ in range(3):   # warm-up: first-call caches, lazy imports
        call()
    samples = []
    for _ in range(repeats):
        start = time.thread_time_ns()
        for _ in range(calls):
            call()
        samples.append((time.thread_time_ns() - start) / calls / 1e3)
    return statistics.median(samples)


_OURS = str(Path(kernels.__file__).parent) + os.sep


def calls_where(call: Callable[[], object], counted: Callable[[FrameType], bool]) -> int:
    """Python function calls made in one ``call()`` whose frame ``counted`` accepts."""
    count = 0

    def profile(frame, event, arg):
        nonlocal count
        if event == "call" and counted(frame):
            count += 1

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(previous)
    return count


def _ours(frame: FrameType) -> bool:
    """A call made by or into the ``kernels`` package."""
    return (frame.f_code.co_filename.startswith(_OURS)
            or frame.f_back is not None and frame.f_back.f_code.co_filename.startswith(_OURS))


def python_calls(call: Callable[[], object]) -> int:
    """Python function calls made by or into the ``kernels`` package in one ``call()``, after a
    warm-up call: a count that depends neither on the CPU's speed or load nor on torch's or
    Triton's insides (a call they make counts only when it enters ``kernels``), for a
    regression guard."""
    call()
    return calls_where(call, _ours)


# (path fragment, section) in order: the first fragment a function's file contains decides
_FILES = (
    ("kernels/validate.py", "validation"), ("kernels/gemm_fp8/operands.py", "validation"),
    ("kernels/moe/layer_ladder/checks.py", "validation"),
    ("kernels/registry.py", "lookup"), ("kernels/tuning.py", "lookup"), ("/configs.py", "lookup"),
    ("kernels/backend.py", "lookup"), ("kernels/xcd.py", "lookup"),
    ("kernels/plans.py", "lookup"), ("kernels/eager.py", "dispatch"),
    ("kernels/outputs.py", "allocation"),
    ("workbench/harness/host_overhead.py", "launch"), ("triton/", "launch"),
    ("kernels/", "packing"),
    ("torch/_library/", "dispatch"), ("torch/_ops.py", "dispatch"), ("torch/autograd/", "dispatch"),
    ("torch/_compile", "dispatch"), ("torch/_dynamo", "dispatch"), ("torch/utils/_python_dispatch", "dispatch"),
)
# functions of a rung or op module that decide rather than pack
_NAMES = {"check_metadata": "validation", "check_offsets": "validation", "best_rung": "lookup",
          "tuned": "lookup", "prior": "lookup", "choose": "lookup", "_pruned": "lookup",
          "config": "lookup", "_bucket": "lookup", "programs": "lookup", "schedule": "lookup"}


def _section(func: tuple[str, int, str]) -> str | None:
    """The section of a profiled function, or None for a built-in (charged to its caller)."""
    filename, _, name = func
    if filename == "~":
        return None
    path = filename.replace("\\", "/")
    if "kernels/" in path and name in _NAMES:
        return _NAMES[name]
    return next((section for fragment, section in _FILES if fragment in path), "other")


def breakdown(call: Callable[[], object], calls: int) -> dict[str, float]:
    """Each section's share of ``calls`` profiled calls (own time; a built-in's to its caller)."""
    profile = cProfile.Profile()
    profile.runcall(lambda: [call() for _ in range(calls)])
    shares = dict.fromkeys(SECTIONS, 0.0)
    for func, (_, _, own, _, callers) in pstats.Stats(profile).stats.items():
        section = _section(func)
        if section is not None:
            shares[section] += own
            continue
        for caller, (_, _, own_here, _) in callers.items():
            shares[_section(caller) or "other"] += own_here
    total = sum(shares.values()) or 1.0
    return {name: value / total for name, value in shares.items()}


GOAL = 2.0   # issue 18: our host time per call within twice torch's


@dataclass
class Row:
    op: str
    shape: str
    ours_us: float
    ours_no_grad_us: float | None
    torch_op: str
    torch_us: float
    ratio: float
    goal_met: bool
    launches_per_call: float
    device_ops: int
    torch_device_ops: int
    python_calls: int
    sections_us: dict[str, float]


def measure(case: Case, calls: int = 200, repeats: int = 7) -> Row:
    """One case: our median µs per call (launches stubbed) as the case calls it and, unless it
    runs a backward, under ``torch.no_grad`` (where an op whose case's tensors need a gradient runs
    no autograd.Function, :func:`kernels.eager.path`), torch's, our breakdown, and the device ops
    per call on each side (:func:`workbench.harness.device_ops.device_ops`)."""
    ours, theirs = case.ours(), case.torch()
    ops = device_ops.device_ops(ours)   # its Triton launches are the case's launches per call
    with stubbed_launches():
        ours_us = per_call_us(ours, calls, repeats)
        no_grad_us = None
        if not case.backward:
            with torch.no_grad():
                no_grad_us = per_call_us(ours, calls, repeats)
        shares = breakdown(ours, max(1, calls // 4))
        calls_per_call = python_calls(ours)
    torch_us = per_call_us(theirs, calls, repeats)
    return Row(case.op, case.shape, ours_us, no_grad_us, case.torch_op, torch_us, ours_us / torch_us,
               ours_us <= GOAL * torch_us, ops.triton, ops.total, device_ops.device_ops(theirs).total,
               calls_per_call,
               {name: share * ours_us for name, share in shares.items()})


def _allocate(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a.new_empty((a.shape[0], b.shape[1]))


_floor = torch.library.custom_op("workbench::host_overhead_floor", _allocate, mutates_args=())
_floor.register_fake(_allocate)
_floor.register_autograd(lambda ctx, grad: (None, None), setup_context=lambda ctx, inputs, output: None)


class _AllocateFunction(torch.autograd.Function):
    """What the public ops' own autograd wrapper (``forward(ctx, ...)``) costs around the same allocation."""

    @staticmethod
    def forward(ctx, a, b):
        return _allocate(a, b)

    @staticmethod
    def backward(ctx, grad):
        return None, None


_applied = eager.applier(_AllocateFunction, tensors=2)   # as the public ops call theirs


class _AllocateFunctionSetupContext(torch.autograd.Function):
    """The same with ``setup_context``, the kind functorch transforms take (and custom ops use)."""

    @staticmethod
    def forward(a, b):
        return _allocate(a, b)

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, grad):
        return None, None


def floors_us(calls: int, repeats: int) -> dict[str, float]:
    """µs per call of ops that only allocate their output, each wrapped one way: the structural
    floor under each public op's own work. "custom op" is a ``torch.library.custom_op`` registered
    as ours are (fake and autograd), called on inputs that need no gradient ("no grad") and on
    one that does ("grad"): what a traced or transformed call pays; "autograd.Function, grad" is
    a ``forward(ctx, ...)`` Function's ``apply``, "autograd.Function by eager.applier, grad" the
    same Function entered as an eager call that needs a gradient enters its op's
    (:func:`kernels.eager.applier`: ``nn.Linear`` and ``MoE``, whose weights need gradients),
    "autograd.Function with setup_context, grad" the kind a transform would need;
    "python function" is the allocation called as a plain function, what a direct eager call
    without gradients (:mod:`kernels.eager`) pays."""
    a, b = _randn(64, 128), _randn(128, 96)
    a_grad = a.clone().requires_grad_()
    return {"python function": per_call_us(lambda: _allocate(a, b), calls, repeats),
            "custom op, no grad": per_call_us(lambda: _floor(a, b), calls, repeats),
            "custom op, grad": per_call_us(lambda: _floor(a_grad, b), calls, repeats),
            "autograd.Function, grad": per_call_us(lambda: _AllocateFunction.apply(a_grad, b), calls, repeats),
            "autograd.Function by eager.applier, grad": per_call_us(lambda: _applied(a_grad, b), calls, repeats),
            "autograd.Function with setup_context, grad":
                per_call_us(lambda: _AllocateFunctionSetupContext.apply(a_grad, b), calls, repeats)}


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else what :mod:`platform` says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def run(ops: list[str] | None = None, calls: int = 200, repeats: int = 7) -> dict:
    """Every case (or those of ``ops``) measured; the report as one JSON-ready dict."""
    chosen = [c for c in cases() if not ops or c.op in ops]
    unknown = set(ops or ()) - {c.op for c in cases()}
    if unknown:
        raise ValueError(f"no host-overhead case for {sorted(unknown)}; "
                         f"known: {', '.join(c.op for c in cases())}")
    env = environment.describe()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        rows = [asdict(measure(case, calls, repeats)) for case in chosen]
        floors = floors_us(calls, repeats)
    finally:
        torch.set_num_threads(threads)
    return {"label": LABEL, "cpu": cpu_name(), "backend": env["backend"], "torch": env["torch"],
            "triton": env["triton"], "commit": env["commit"], "date": environment.now(),
            "calls": calls, "repeats": repeats, "goal": GOAL, "floors_us": floors,
            "rows": rows}


def table(report: dict) -> str:
    """The report as a terminal table under its label: µs per call, ratio, whether the goal is
    met, the breakdown, and the floors that no Python path below torch.library goes under."""
    goal = report["goal"]
    rows = [{"op": r["op"], "ours us": r["ours_us"], "no_grad us": r["ours_no_grad_us"],
             "torch us": r["torch_us"], "ratio": r["ratio"],
             f"within {goal:g}x": "yes" if r["goal_met"] else "no",
             "launches": r["launches_per_call"], "device ops": r["device_ops"],
             "torch's": r["torch_device_ops"], "py calls": r["python_calls"],
             **{s: r["sections_us"][s] for s in SECTIONS}} for r in report["rows"]]
    head = (f"{report['label']} ({report['cpu']}, backend {report['backend']}, torch {report['torch']}, "
            f"median of {report['repeats']} x {report['calls']} calls; sections from cProfile shares)")
    met = [r["op"] for r in report["rows"] if r["goal_met"]]
    verdict = (f"goal, within {goal:g}x torch's time: met by {', '.join(met) or 'no op'}; "
               f"not met by {', '.join(r['op'] for r in report['rows'] if not r['goal_met']) or 'no op'}")
    floors = "\n".join(f"  {name}: {us:.3g} us" for name, us in report["floors_us"].items())
    compared = "\n".join(f"  {r['op']}: {r['shape']}  vs  {r['torch_op']}" for r in report["rows"])
    return (f"{head}\n{format_table(rows)}\n{verdict}\n"
            f"floors, an op that only allocates its output, per way of calling it "
            f"(Triton's own launcher is stubbed here, unmeasured on a CPU):\n{floors}\nshapes:\n{compared}")


def save(report: dict, path: str | Path) -> None:
    Path(path).write_text(json.dumps(report, indent=1) + "\n")
