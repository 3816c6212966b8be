"""Activation checkpointing that recomputes delayed-scaling FP8 layers with their own forward's scales.

A delayed-scaling cast takes its scale from the layer's amax history, which the forward has
updated by the time the backward recomputes it, so a recompute must be handed the scales its
forward took. Inferring that from the layer alone (:func:`kernels.fp8.recipes.delayed.recomputing`,
what a plain ``torch.utils.checkpoint`` gets) keeps one scale set per layer, the last forward's:
it is wrong wherever a layer runs again before the backward of its earlier run (a shared or
tied layer, a layer in a loop, pipeline schedules such as 1F1B that run several micro-batches'
forwards first) or the model leaves training mode before the backward.

:func:`checkpoint` (``torch.utils.checkpoint.checkpoint``, non-reentrant, with
:func:`context` as its ``context_fn``) ties the scales to the checkpointed call instead, as
Transformer Engine's own checkpoint does with its FP8 state: the forward records every scale
a delayed cast inside the call takes, in order, per layer and tensor (a :class:`Tape`), and
that call's recompute replays them in the same order and records no amax. Each call has its
own tape, so any schedule and any number of runs of a layer recompute with exactly their
forward's scales. A recompute run twice (``retain_graph=True``) replays the tape from its
start each time. Nested calls: a cast takes its scale from the innermost tape being replayed
(a recompute, at any depth, is one), and every tape being recorded keeps it.
Under ``torch.compile`` the layer's Python is traced once and no tape runs: the compiler
recomputes the region from its traced graph, which would recompute a delayed scale (the
history's max) from the history the forward has since updated in place, as it does under
torch's own checkpoint. There the call is selective checkpointing that saves the output of every
op that reduces a history (:func:`_keep_reductions`), so the recompute takes the forward's scales
(tests/test_fp8_recompute.py, ``aot_eager``).
"""
from __future__ import annotations

import threading
from collections import defaultdict

import torch
import torch.utils.checkpoint
from torch.utils.checkpoint import CheckpointPolicy


class Tape:
    """The scales one checkpointed call's delayed casts took, per (layer, tensor name), in call order."""

    def __init__(self):
        self.scales: dict[tuple[int, str], list[torch.Tensor]] = defaultdict(list)
        self.read: dict[tuple[int, str], int] = {}   # replay's cursor per key, reset at each recompute

    def keep(self, layer, scales: dict[str, torch.Tensor]) -> None:
        for name, scale in scales.items():
            self.scales[id(layer), name].append(scale)

    def take(self, layer, name: str) -> torch.Tensor:
        key = (id(layer), name)
        i = self.read.get(key, 0)
        kept = self.scales.get(key, [])
        if i >= len(kept):
            raise RuntimeError(f"kernels.fp8.checkpoint: the recompute cast {name!r} of "
                               f"{type(layer).__name__} more often than its forward did ({len(kept)}): "
                               "a checkpointed function must run the same layers in the same order each time")
        self.read[key] = i + 1
        return kept[i]


_LOCAL = threading.local()   # per thread: a GPU's backward (and so a recompute) runs on autograd's device thread
open_tapes = 0
"""Tapes entered and not yet left, in every thread: while 0 (no checkpointed call is running, the
usual forward) there is nothing to replay or keep, which the caller of :func:`replaying` and
:func:`keep` asks without a call (:mod:`kernels.fp8.recipes.delayed`), before they read this
thread's stack. Read after ``torch.compiler.is_compiling()``, so a compiled frame holds no guard on it."""
_open_lock = threading.Lock()


def _stack() -> list[tuple[Tape, bool]]:
    """This thread's active tapes, (tape, replaying), innermost last."""
    if not hasattr(_LOCAL, "stack"):
        _LOCAL.stack = []
    return _LOCAL.stack


class _Active:
    """``tape`` on the stack while the context is entered, recorded or replayed from its start;
    re-enterable: a retained graph's second backward recomputes with the same context."""

    def __init__(self, tape: Tape, replaying: bool):
        self.entry = (tape, replaying)

    def __enter__(self):
        global open_tapes
        tape, replaying = self.entry
        if replaying:
            tape.read.clear()
        _stack().append(self.entry)
        with _open_lock:
            open_tapes += 1

    def __exit__(self, *exc):
        global open_tapes
        _stack().remove(self.entry)
        with _open_lock:
            open_tapes -= 1


def context():
    """``context_fn`` for ``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``: the
    forward records the call's delayed scales on a new :class:`Tape`, its recompute replays them."""
    tape = Tape()
    return _Active(tape, False), _Active(tape, True)


def checkpoint(function, *args, **kwargs):
    """``torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=False,
    context_fn=...)`` with :func:`context`'s tapes (under torch.compile, selective
    checkpointing: :func:`_contexts`): a recompute casts every delayed-scaling layer with the
    scales its own forward took (module docstring)."""
    if kwargs.get("use_reentrant", False) or "context_fn" in kwargs:
        raise ValueError("kernels.fp8.checkpoint is the non-reentrant checkpoint with its own context_fn; "
                         "to combine contexts, call torch.utils.checkpoint.checkpoint with context_fn yourself")
    kwargs.pop("use_reentrant", None)
    return torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=False, context_fn=_contexts, **kwargs)


# the op that reduces an amax history to a scale (kernels.fp8.history_ops.scale); the amax pass that
# also reads it (as its unless) feeds only that scale, which is saved, so a recompute never needs it
_HISTORY_SCALE = "kernels::fp8_history_scale"


def _keep_reductions(ctx, op, *args, **kwargs):
    """Selective checkpointing's policy under torch.compile: the op that reduces an amax history
    is saved, not recomputed, so a delayed scale (max of the history, which the forward then
    updates in place) is the forward's in the recompute; an op that mutates its arguments (the
    history's record, ``kernels::fp8_record_amax``) is not run again either, or a recompute would
    count a step's saturation twice; everything else may be recomputed."""
    schema = getattr(op, "_schema", None)
    if schema is not None and (schema.name == _HISTORY_SCALE or schema.is_mutable):
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def _contexts():
    """:func:`context`'s tapes, or under torch.compile (asked when torch builds the contexts, so a
    call that dynamo traces into and then runs eagerly after a graph break gets the tapes)
    selective checkpointing by :func:`_keep_reductions`. Compiling is also a tracing context being
    open: torch 2.11's dynamo calls ``context_fn`` with ``is_compiling()`` False (2.13's, True), and
    its checkpoint refuses contexts that are not dispatch modes."""
    if torch.compiler.is_compiling() or torch._guards.TracingContext.try_get() is not None:
        return torch.utils.checkpoint.create_selective_checkpoint_contexts(_keep_reductions)
    return context()


def replaying() -> Tape | None:
    """The innermost tape being replayed (a recompute under :func:`checkpoint`), or None. Asked
    outside torch.compile only, where a tape is open (:data:`open_tapes`): its caller checks both."""
    return next((tape for tape, replay in reversed(_stack()) if replay), None)


def keep(layer, scales: dict[str, torch.Tensor]) -> None:
    """``scales`` (by tensor name), just taken by delayed casts of ``layer``, kept by every tape being
    recorded. Asked as :func:`replaying` is."""
    for tape, replay in _stack():
        if not replay:
            tape.keep(layer, scales)
