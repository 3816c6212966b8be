"""The contract a graded file meets: which callable, with which signature, solving which problem.

A file for a registered op defines the op's public callable (``matmul(a, b)`` for
``gemm``), called exactly as the ladder's rungs are: with the op's inputs
(``kernels.spec(op).make_inputs``), in order. A file for an op of the user's own comes
with ``--reference ref.py``, which defines ``make_inputs(shape, dtype)`` and
``reference(*inputs)`` (KernelBench's shape of a problem) and, optionally, ``shapes`` and
``dtypes`` to check at. Either way the grader sees a :class:`Problem`: the spec the
harness reads, the baseline it bounds the error by, and the rung to compare against.
"""
from __future__ import annotations

import dataclasses
import inspect
import math
from dataclasses import dataclass
from pathlib import Path

import torch

import kernels
from kernels.registry import OpSpec, Rung

from ..harness.check import other_memory_order
from ..learn.exercises.learner import LearnerError, import_file

# The public callable each op's file defines (``kernels.<name>`` is the package's own;
# the MoE layer's is a module, so its file defines a function of the layer's inputs).
ENTRY = {"gemm": "matmul", "gemm_fp8": "matmul_fp8", "gemm_mxfp4": "matmul_mxfp4",
         "attention": "flash_attention", "grouped_gemm": "grouped_gemm",
         "grouped_gemm_fp8": "grouped_gemm_fp8", "grouped_gemm_mxfp8": "grouped_gemm_mxfp8", "moe": "moe"}
CUSTOM_ENTRY = "kernel"
CUSTOM_DTYPES = (torch.float32,)


class ContractError(Exception):
    """The file cannot be graded as it is: no such callable, or not callable with the inputs."""


@dataclass(frozen=True)
class FileRung(Rung):
    """The graded file's callable, shaped as a rung so the harness judges it like one."""

    @property
    def label(self) -> str:
        return "yours"

    @property
    def title(self) -> str:
        return f"yours ({self.name})"


@dataclass(frozen=True)
class Problem:
    """What a file is graded on."""

    op: str
    spec: OpSpec
    baseline: Rung                 # the library (or the user's reference run in the dtype)
    registered: bool               # one of the workbench's ops (then it has a ladder)
    entry: str                     # the callable's default name

    @property
    def signature(self) -> str:
        return f"{self.entry}{inspect.signature(self.baseline.fn)}"


def registered_problem(op: str) -> Problem:
    if op not in ENTRY:
        raise ContractError(f"unknown op {op!r}; known ops: {', '.join(kernels.ops())}")
    return Problem(op, kernels.spec(op), kernels.registry.reference_rung(op), True, ENTRY[op])


def custom_problem(path: str | Path) -> Problem:
    """A problem from a reference file: ``make_inputs(shape, dtype)``, ``reference(*inputs)``,
    optional ``shapes`` (default: none, give ``--shape``) and ``dtypes`` (default float32)."""
    try:
        module, _ = import_file(Path(path), None)
    except LearnerError as error:
        raise ContractError(f"the reference file {error}") from None
    missing = [n for n in ("make_inputs", "reference") if not callable(getattr(module, n, None))]
    if missing:
        raise ContractError(f"the reference file {Path(path).name} defines no "
                            f"{' and no '.join(f'{n}()' for n in missing)}")
    name = f"custom:{Path(path).stem}"

    def make_inputs(shape, dtype=torch.float32, device="cpu", seed=0, layout="row"):
        torch.manual_seed(seed)
        made = module.make_inputs(tuple(shape), dtype)
        made = made if isinstance(made, tuple) else tuple(made) if isinstance(made, list) else (made,)
        made = tuple(t.to(device) if isinstance(t, torch.Tensor) else t for t in made)
        return made if layout == "row" else tuple(other_memory_order(t) for t in made)

    def reference64(*inputs):
        out = module.reference(*(t.double() if isinstance(t, torch.Tensor) and t.is_floating_point()
                                 else t for t in inputs))
        return out.cpu().double()   # the graph kept: gradients are judged against it

    dtypes = tuple(getattr(module, "dtypes", CUSTOM_DTYPES))
    spec = OpSpec(name=name, make_inputs=make_inputs, reference=reference64,
                  flops=lambda shape: math.nan, bytes_moved=lambda shape, dtype: math.nan,
                  smoke_shapes=tuple(tuple(s) for s in getattr(module, "shapes", ())),
                  bench_shapes={}, dtypes=dtypes, shape_names=())
    baseline = Rung(name, None, "reference", module.reference, frozenset(kernels.backend.BACKENDS),
                    dtypes, True, "library", module.__name__)
    return Problem(name, spec, baseline, False, CUSTOM_ENTRY)


def load_entry(path: str | Path, name: str, problem: Problem):
    """The file's callable ``name``, imported without registering anything it declares."""
    try:
        module, _ = import_file(Path(path), problem.op if problem.registered else None)
    except LearnerError as error:
        raise ContractError(str(error)) from None
    entry = getattr(module, name, None)
    if entry is None:
        found = sorted(n for n, v in vars(module).items()
                       if callable(v) and not n.startswith("_") and getattr(v, "__module__", None) == module.__name__)
        raise ContractError(f"{Path(path).name} defines no `{name}`: the {problem.op} contract is "
                            f"{problem.signature} (or name yours with --entry); it defines: "
                            f"{', '.join(found) or 'no public callable'}")
    if not callable(entry):
        raise ContractError(f"`{name}` in {Path(path).name} is a {type(entry).__name__}, not a callable")
    return module, entry


def check_callable(entry, name: str, inputs: tuple, problem: Problem) -> None:
    """Whether ``entry`` takes the op's inputs, said before anything runs."""
    try:
        inspect.signature(entry).bind(*inputs)
    except TypeError as error:
        raise ContractError(f"`{name}{inspect.signature(entry)}` cannot take the {problem.op} inputs "
                            f"({len(inputs)} arguments, as {problem.signature}): {error}") from None
    except ValueError:   # a builtin without a signature: let the call say
        pass


def file_rung(entry, name: str, problem: Problem, dtypes, backward: bool, module: str) -> FileRung:
    return FileRung(problem.op, None, name, entry, frozenset(kernels.backend.BACKENDS), tuple(dtypes),
                    True, "file", module, backward=backward)


def with_grad_inputs(problem: Problem, names: tuple[str, ...]) -> Problem:
    """The problem with gradients judged for ``names`` (an op without ``grad_inputs`` of its
    own: GEMM, or a problem of the user's); its float64 reference must keep autograd's graph."""
    if problem.spec.grad_inputs:
        return problem
    return dataclasses.replace(problem, spec=dataclasses.replace(problem.spec, grad_inputs=names))
