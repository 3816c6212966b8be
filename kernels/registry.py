"""The one registry of rungs: tests, CLI, widgets and notebooks enumerate it.

Each rung declares itself once, next to its kernel, with :func:`rung`. Each operator
declares its problem once (:class:`OpSpec`) with :func:`register_op`. Op packages are
imported lazily on first use, so ``import kernels`` stays cheap and the backend choice
(:mod:`kernels.backend`) is made before any kernel is defined.
"""
from __future__ import annotations

import importlib
import inspect
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from . import backend as _backend
from . import interpreter_patch_once, plans

# op -> the package that registers it, imported on first use. Mostly ``kernels.<op>``; the
# MoE ops live under ``kernels.moe``, since ``kernels.grouped_gemm`` is the public function.
PACKAGES = {
    "gemm": "kernels.gemm",
    "gemm_fp8": "kernels.gemm_fp8",
    "gemm_mxfp4": "kernels.gemm_mxfp4",
    "attention": "kernels.attention",
    "grouped_gemm": "kernels.moe.grouped_gemm",
    "grouped_gemm_fp8": "kernels.moe.grouped_gemm_fp8",
    "grouped_gemm_mxfp8": "kernels.moe.grouped_gemm_mxfp8",
    "moe": "kernels.moe.layer_ladder",
}
OPS = tuple(PACKAGES)


@dataclass(frozen=True)
class Rung:
    """One step of an operator's ladder, callable with the op's common signature."""

    op: str
    rung: int | None          # ladder position; None for the library baseline `ref`
    name: str                 # short name, e.g. "simt_naive"
    fn: Callable[..., Any]
    backends: frozenset[str]  # where it can run: subset of kernels.backend.BACKENDS
    dtypes: tuple[torch.dtype, ...]
    interpreter: bool         # runs under the CPU interpreter / simulator
    kind: str                 # "simt" | "triton" | "library"
    module: str               # module that defines it (for showing source and diffs)
    aot: Callable[..., Any] | None = field(default=None, compare=False)
    """For Triton rungs: ``aot(dtype, backend, arch)`` -> list of :class:`AotKernel` for the ISA inspector."""
    max_bench_flops: float | None = None
    """Benchmarks skip shapes with more work than this (the naive rungs would take minutes)."""
    prepare: Callable[..., Callable[[], Any]] | None = field(default=None, compare=False)
    """``prepare(*inputs)`` -> the rung's call on those inputs, with any operand copies
    (layout, padding, scale expansion) done once, up front. See :meth:`bind`."""
    unavailable: str | None = None
    """Why this installation cannot run the rung (an optional package is missing), else None.
    Such a rung stays on the ladder, so tables and notebooks list it, but never runs here."""
    backward: bool = False
    """Its output is differentiable through the rung's own backward kernels; the harness then
    also judges the gradients of the op's ``grad_inputs`` (:class:`OpSpec`)."""
    beside: bool = False
    """A teaching variant shown beside rung ``rung``, off the ladder: an alternative to
    that rung's idea rather than a step up from it (GEMM split-K beside v6's stream-K).
    :func:`get` finds it by name, so the harness and the ISA inspector take it like a
    rung; :func:`variants` (tables, the tour, benchmarks) leaves it out."""
    plan: Callable[..., Callable[..., Any]] | None = field(default=None, compare=False)
    """``plan(*inputs)`` -> a call that takes inputs of the same metadata and computes the rung's
    result with its checks and decisions already made, without autograd: what a public op's
    eager call that needs no gradient runs, and keeps (:mod:`kernels.plans`)."""

    @property
    def label(self) -> str:
        if self.beside:
            return self.name
        return "ref" if self.rung is None else f"v{self.rung}"

    @property
    def title(self) -> str:
        if self.beside:
            return f"{self.name} (beside v{self.rung})"
        return "ref" if self.rung is None else f"v{self.rung} {self.name}"

    @property
    def doc(self) -> str:
        return inspect.getdoc(importlib.import_module(self.module)) or ""

    def __call__(self, *args, **kwargs):
        if self.unavailable:
            raise ImportError(f"{self.op} {self.title} is {self.unavailable}")
        return self.fn(*args, **kwargs)

    def bind(self, *args, **kwargs) -> Callable[[], Any]:
        """A zero-argument call of this rung on these inputs, as a benchmark times it.

        The work a rung does to bring operands into the form its kernel or library
        wants happens here, not in the returned call, so a timer charges every rung
        (and ``ref``) for its kernel alone. The call returns what ``rung(*args)`` returns.
        """
        if self.prepare is not None:
            return self.prepare(*args, **kwargs)
        return lambda: self(*args, **kwargs)

    def supports(self, dtype: torch.dtype, backend: str | None = None) -> bool:
        name = backend or _backend.current().name
        return dtype in self.dtypes and name in self.backends

    def runs_here(self) -> bool:
        here = _backend.current()
        return (not self.unavailable and here.name in self.backends
                and (here.is_gpu or self.interpreter))


@dataclass(frozen=True)
class AotKernel:
    """What the ISA inspector needs to compile one Triton launch ahead of time."""

    jit_fn: Any                 # the @triton.jit function
    signature: dict[str, str]   # argument name -> Triton type ("*bf16", "i32", "constexpr")
    constexprs: dict[str, Any]
    options: dict[str, Any]     # num_warps, num_stages, and AMD knobs
    scalars: dict[str, Any] = field(default_factory=dict)
    """The int and float arguments' values at the launch shown: Triton's own specialization
    of them (divisibility) is what the ahead-of-time compile gets (:mod:`workbench.isa.compile`)."""


@dataclass(frozen=True)
class OpSpec:
    """The problem an op's rungs all solve: inputs, reference, work and traffic."""

    name: str
    make_inputs: Callable[..., tuple]
    reference: Callable[..., torch.Tensor]
    flops: Callable[[tuple], float]
    bytes_moved: Callable[[tuple, torch.dtype], float]
    smoke_shapes: Sequence[tuple]
    bench_shapes: dict[str, tuple]
    dtypes: tuple[torch.dtype, ...]
    shape_names: tuple[str, ...]      # e.g. ("M", "N", "K")
    quick_shapes: tuple[str, ...] = ()
    """Names in ``bench_shapes`` for ``workbench bench --suite quick`` (a few minutes per GPU)."""
    grad_inputs: tuple[str, ...] = ()
    """Names of the leading inputs that take gradients (attention: q, k, v), in input order.
    For a rung declared with ``backward=True`` the harness differentiates ``reference`` in
    float64 with torch's autograd, so ``reference`` must not detach its inputs."""
    backward_flops: Callable[[tuple], float] | None = None
    """The backward's work per call (gradients of ``grad_inputs`` given the output's), for
    the TFLOP/s of benchmarked backward passes; None where no rung has a backward."""


_RUNGS: dict[str, list[Rung]] = {}
_BESIDE: dict[str, list[Rung]] = {}   # op -> its teaching variants, off the ladder
_SPECS: dict[str, OpSpec] = {}
_loaded: set[str] = set()
_captures: dict[str, list[Rung]] = {}   # module name -> the rungs it declared, kept out of the ladder


@contextmanager
def capturing_rungs(module: str):
    """Rungs that ``module`` declares while inside go to the yielded list, not the ladder.

    A learner's copy of a rung (:mod:`workbench.exercises`) declares itself with the same
    op and number as the package's own; capturing it lets the harness check the copy as a
    rung without registering it twice or replacing the real one."""
    captured: list[Rung] = []
    _captures[module] = captured
    try:
        yield captured
    finally:
        del _captures[module]


def register_op(spec: OpSpec) -> OpSpec:
    if spec.name in _SPECS:
        raise ValueError(f"op {spec.name!r} is registered twice")
    _SPECS[spec.name] = spec
    return spec


def rung(*, op: str, rung: int | None, name: str, backends: Sequence[str],
         dtypes: Sequence[torch.dtype], interpreter: bool, kind: str,
         aot: Callable[..., Any] | None = None, max_bench_flops: float | None = None,
         prepare: Callable[..., Callable[[], Any]] | None = None, unavailable: str | None = None,
         backward: bool = False, beside: bool = False,
         plan: Callable[..., Callable[..., Any]] | None = None):
    """Decorator: declare the decorated function as a rung of ``op`` (``beside``: a teaching
    variant next to rung ``rung``, off the ladder; see :attr:`Rung.beside`)."""
    unknown = set(backends) - set(_backend.BACKENDS)
    if unknown:
        raise ValueError(f"unknown backends {sorted(unknown)}")

    def declare(fn):
        entry = Rung(op, rung, name, fn, frozenset(backends), tuple(dtypes), interpreter,
                     kind, fn.__module__, aot, max_bench_flops, prepare, unavailable, backward, beside,
                     plan)
        if fn.__module__ in _captures:
            _captures[fn.__module__].append(entry)
            return fn
        if beside:
            if any(r.name == name for r in _BESIDE.get(op, ())):
                raise ValueError(f"{op} variant {name!r} is registered twice")
            _BESIDE.setdefault(op, []).append(entry)
            return fn
        ladder = _RUNGS.setdefault(op, [])
        if any(r.rung == entry.rung for r in ladder):
            raise ValueError(f"{op} rung {entry.label} is registered twice")
        ladder.append(entry)
        plans.invalidate()   # the new rung may be the one a public op now picks
        return fn

    return declare


def _load(op: str) -> None:
    if op in _loaded:
        return
    if op not in OPS:
        raise KeyError(f"unknown op {op!r}; known ops: {', '.join(OPS)}")
    _backend.mark_kernels_loaded()
    if _backend.current().is_interpreter:
        interpreter_patch_once.install()
    importlib.import_module(PACKAGES[op])
    _loaded.add(op)


def ops() -> tuple[str, ...]:
    return OPS


def spec(op: str) -> OpSpec:
    _load(op)
    return _SPECS[op]


def variants(op: str, include_ref: bool = True) -> list[Rung]:
    """The rungs of ``op`` in ladder order (v0, v1, ...), then the baseline ``ref``."""
    _load(op)
    ladder = sorted((r for r in _RUNGS[op] if r.rung is not None), key=lambda r: r.rung)
    if include_ref:
        ladder += [r for r in _RUNGS[op] if r.rung is None]
    return ladder


def declared(op: str) -> list[Rung] | None:
    """The list ``op``'s rungs are declared into (None before its package is imported), as
    it is: a cache of an answer read from the ladder keeps it to notice a new or longer list."""
    return _RUNGS.get(op)


def beside(op: str) -> list[Rung]:
    """``op``'s teaching variants beside the ladder (:attr:`Rung.beside`), in declaration order."""
    _load(op)
    return list(_BESIDE.get(op, ()))


def get(op: str, which: int | str) -> Rung:
    """A rung by number (2), label ("v2", "ref") or short name ("triton_tile"); a variant
    beside the ladder by its name ("split_k")."""
    for r in variants(op):
        if which in (r.rung, r.label, r.name, r.title):
            return r
    for r in beside(op):
        if which in (r.label, r.title):
            return r
    known = ", ".join(r.title for r in variants(op) + beside(op))
    raise KeyError(f"{op} has no rung {which!r}; rungs: {known}")


def reference_rung(op: str) -> Rung:
    return get(op, "ref")
