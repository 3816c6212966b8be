"""Launch plans: what a public op or rung decides per call, decided once per kind of input.

A call of ``kernels.matmul`` decides many things before its launch: the inputs are valid,
which rung runs, its tuned config, the grid, the split, the scalar arguments. All of them
follow from the inputs' metadata (sizes, strides, dtypes, devices, whether they need a
gradient) and the backend, never from the values, so a training step that repeats the
same shapes thousands of times can decide once and keep the result: a *plan*, a callable
that takes the same tensors and only allocates the outputs and launches. A repeated call
then costs one key build (:func:`meta`), one dict lookup, the allocation and the launch;
a new kind of input (a *miss*) runs every check and decision as before and keeps the plan
it built. ``workbench bench overhead`` measures the gain.

What a key holds: :func:`meta` of every tensor the decisions read, plus the backend and
any non-tensor argument the op takes (``causal``, ``scale``, ...); an op adds what else
its decisions read. A key that cannot be built (an argument that is not a tensor, a
symbolic size under tracing) is ``None``: the call then runs the checks, which raise the
usual error or decide without keeping a plan.

When plans are forgotten (:func:`invalidate`): the tuning choices change
(:func:`kernels.tuning.adopt`, :func:`kernels.tuning.forget`), or a rung is declared
(a new rung may now be the best). A plan built while a choice was not kept (frozen tuning
mode, CUDA-graph capture: the next call outside may still time) or while a tuning pass
records the keys it meets (:func:`kernels.tuning.recording`, which must see every call's
key) is used for that call only (:func:`unsettled`, :func:`paused`).

Bounded: a cache holds at most :data:`SIZE` plans and starts over when full (a workload
with more distinct shapes than that pays a miss per new shape, never unbounded memory).
Thread safety: lookups and stores are single dict operations under the GIL; two threads
that miss on one key both build it and one plan wins, each a whole plan, never a torn one.
"""
from __future__ import annotations

import weakref
from typing import Any, Callable

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch._subclasses.functional_tensor import FunctionalTensor

from . import backend as _backend

SIZE = 512
_TRACED = (FakeTensor, FunctionalTensor)   # tracing's tensors; a membership test, no call on the hot path

_caches: "weakref.WeakSet[PlanCache]" = weakref.WeakSet()   # a learner's module copy may be dropped
_unsettled = 0   # how many decisions were made and not kept (see unsettled())
_paused = 0      # > 0 while plans are neither used nor kept (see paused())


def meta(*tensors: torch.Tensor | None, extra: tuple = ()) -> tuple | None:
    """The metadata of ``tensors`` a plan depends on, as one hashable tuple: the backend, then
    per tensor its type, sizes, strides, dtype, device and ``requires_grad`` (``None``, an optional
    tensor left out, is its own type); None if one is not a tensor (no plan then; a symbolic size
    makes the key unhashable, with the same end) or is a traced call's (:data:`_TRACED`: fake and
    functional tensors, as ``torch.compile`` traces a backward with: a compiled frame guards on
    the caches it reads and cannot guard on keys that hold their types; any other tensor
    subclass is keyed by its type, a plan of its own); then ``extra``, the call's other
    arguments that the decisions read."""
    key = (_backend.current().key,)   # a tuple grown by +=: no list to build and copy at the end
    try:
        for t in tensors:
            if t is None:
                key += (None,)
            else:
                kind = type(t)
                if kind in _TRACED:   # a traced call's tensor: checked, never kept
                    return None
                key += (kind, t.shape, t.stride(), t.dtype, t.device, t.requires_grad)
    except (AttributeError, TypeError, RuntimeError):
        return None
    return key + extra


class PlanCache:
    """Plans of one op or rung by key: ``cache(key, build, *args)`` returns the kept plan
    of ``key``, or ``build(*args)`` (which runs every check and decision), kept if it may be."""

    def __init__(self) -> None:
        self._plans: dict[Any, Callable] = {}
        _caches.add(self)

    def __call__(self, key, build: Callable[..., Callable], *args) -> Callable:
        try:
            plan = self._plans.get(key)
        except TypeError:   # unhashable: a symbolic size under tracing
            plan, key = None, None
        if plan is not None and not _paused:
            return plan
        before = _unsettled
        plan = build(*args)
        # not kept while dynamo traces: a store there is a side effect that breaks the graph of
        # a region dynamo traces as one (a checkpointed one: tests/test_fp8_recompute.py)
        if key is not None and before == _unsettled and not _paused and not torch.compiler.is_compiling():
            if len(self._plans) >= SIZE:
                self._plans.clear()
            self._plans[key] = plan
        return plan

    def __len__(self) -> int:
        return len(self._plans)

    def clear(self) -> None:
        self._plans.clear()


class Checked:
    """A public op's verdict on inputs of one metadata: its checks passed, and what they
    derived (a subclass's attributes). :meth:`call` runs the op eagerly with the plan of the
    rung it picks, bound on the first eager call (:meth:`bind`), not when the checks run: a
    traced or fake call passes the same checks and must not run, nor tune, a rung."""

    def bind(self, *inputs) -> Callable:
        """The call that computes the op eagerly on inputs of this metadata."""
        raise NotImplementedError

    def call(self, *inputs):
        """The op on ``inputs``. The first call binds it and keeps the bound call as this
        instance's ``call``, which from then on shadows this method: a later call goes straight
        to the rung's plan, without a Python frame of its own here."""
        self.call = self.bind(*inputs)
        return self.call(*inputs)


def invalidate() -> None:
    """Forget every plan of every cache: a decision they hold may now come out differently."""
    for cache in _caches:
        cache.clear()


def unsettled() -> None:
    """Called where a decision is made for this call only (an untimed tuning choice that is
    not kept): a plan being built now is used once and not kept."""
    global _unsettled
    _unsettled += 1


class paused:
    """Within the block no plan is used or kept: every call runs its checks and decisions
    (a tuning pass records the keys they meet). Nestable."""

    def __enter__(self) -> None:
        global _paused
        _paused += 1

    def __exit__(self, *exc) -> None:
        global _paused
        _paused -= 1
