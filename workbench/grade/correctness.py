"""Correctness of a graded callable, exactly as a rung gets it: :func:`workbench.check.check_rung`.

Fresh inputs at the problem's shapes, both memory orders, every claimed dtype; the
float64 reference and the baseline-relative bound; gradients where the callable
supports autograd. Two things a file's callable needs that a rung has built in:

* poison: a rung allocates its output through :func:`kernels.outputs.new_output`; a
  file calls ``torch.empty`` (or ``empty_like``, ``new_empty``), so while it runs those
  hand out NaN-filled (integer: max-filled) memory, and an element never written fails;
* the CPU guards of the exercises (:mod:`workbench.learn.exercises.guards`), for Triton and
  SIMT code alike, so an out-of-bounds access names its program, lane and tensor
  instead of reading a neighbour's memory.
"""
from __future__ import annotations

import functools
import inspect
import itertools
from contextlib import ExitStack, contextmanager

import torch

from kernels.outputs import poison_value

from ..harness.check import check_rung
from ..learn.exercises.grading import _root_cause, dtype_name
from ..learn.exercises.guards import cpu_guards
from .contract import FileRung, Problem

LAYOUTS = ("row", "col")
_ALLOCATORS = ("empty", "empty_like", "empty_strided")


def _poisoned(allocate):
    @functools.wraps(allocate)
    def poisoned(*args, **kwargs):
        tensor = allocate(*args, **kwargs)
        try:
            tensor.fill_(poison_value(tensor.dtype))
        except (TypeError, RuntimeError):   # bool, packed fp4: no poison value, left as allocated
            pass
        return tensor
    return poisoned


@contextmanager
def poisoned_allocations():
    """``torch.empty``, ``empty_like``, ``empty_strided`` and ``Tensor.new_empty`` return
    poison inside the block (:func:`kernels.outputs.poison_value`)."""
    saved = {name: getattr(torch, name) for name in _ALLOCATORS}
    new_empty = torch.Tensor.new_empty
    try:
        for name, allocate in saved.items():
            setattr(torch, name, _poisoned(allocate))
        torch.Tensor.new_empty = _poisoned(new_empty)
        yield
    finally:
        for name, allocate in saved.items():
            setattr(torch, name, allocate)
        torch.Tensor.new_empty = new_empty


def poisoning(entry):
    """``entry`` whose every call allocates poison (the harness's baseline runs unpatched)."""
    @functools.wraps(entry)
    def call(*args, **kwargs):
        with poisoned_allocations():
            return entry(*args, **kwargs)
    return call


def guards():
    """Both CPU guards (a file may hold Triton and SIMT kernels); nothing on a GPU."""
    stack = ExitStack()
    stack.enter_context(cpu_guards("triton"))
    stack.enter_context(cpu_guards("simt"))
    return stack


def plan(shapes, dtypes, layouts=LAYOUTS) -> list[tuple]:
    """(dtype, shape, layout) cases in the order they run: a dtype's cases together."""
    return list(itertools.product(dtypes, shapes, layouts))


def case_name(shape, dtype, layout) -> str:
    return f"shape {'x'.join(map(str, shape))}, {dtype_name(dtype)}, {layout}-major"


def run_case(rung: FileRung, problem: Problem, shape, dtype, layout, seed=None) -> dict:
    """One check: the fields of its :class:`~workbench.check.CheckReport` (``report``,
    error map included), or the error the callable raised, named at its root cause."""
    base = dict(shape=tuple(shape), dtype=dtype_name(dtype), layout=layout)
    try:
        with guards():
            report = check_rung(rung, tuple(shape), dtype, seed=seed, layout=layout,
                                spec=problem.spec, baseline=problem.baseline)
    except Exception as error:   # the file's code broke: say how, and where
        cause = _root_cause(error)
        return {**base, "passed": False, "message": f"{type(cause).__name__}: {cause}", "report": None}
    return {**base, "passed": report.passed, "message": report.message, "report": report}


def supports_autograd(entry, inputs: tuple, names: tuple[str, ...]) -> bool:
    """Whether the callable's output carries a graph back to its ``names`` inputs."""
    if not names:
        return False
    leaves = tuple(t.detach().requires_grad_() if i < len(names) else t for i, t in enumerate(inputs))
    with poisoned_allocations():
        out = entry(*leaves)
    return isinstance(out, torch.Tensor) and out.grad_fn is not None


def gradient_names(problem: Problem, entry, inputs: tuple) -> tuple[str, ...]:
    """The op's ``grad_inputs``; for an op without (GEMM, a custom op), the callable's
    leading parameters that get floating-point tensors of a dtype autograd takes."""
    if problem.spec.grad_inputs:
        return problem.spec.grad_inputs
    params = list(inspect.signature(entry).parameters)
    names = []
    for name, value in zip(params, inputs):
        if not (isinstance(value, torch.Tensor) and value.dtype in (torch.float16, torch.bfloat16,
                                                                    torch.float32, torch.float64)):
            break
        names.append(name)
    return tuple(names)
