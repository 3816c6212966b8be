"""When a public op may run its implementation itself instead of calling its custom op.

Every public op is a ``torch.library`` custom op, so that ``torch.compile``, ``torch.export``,
FakeTensor, dispatch modes (``make_fx``, ``FlopCounterMode``), autocast, functorch transforms
and autograd see one opaque node with a fake and an autograd formula. In a plain eager call none
of them but autograd is watching, and the custom op only adds its Python dispatch
(``workbench bench overhead`` measures it: the "custom op" floors, 8 µs per call without a
gradient and 14 µs with one on a two-core AMD EPYC (Zen 5), 2026-12-02, against 1.4 µs for a
plain Python function). :func:`path` says how the op may run instead:

- :data:`PLAIN`: nothing watches and no gradient is needed: the implementation runs as the
  custom op's own CPU/CUDA kernel would, with the same inputs.
- :data:`AUTOGRAD`: nothing watches but autograd, and a gradient is needed: the op's own
  ``torch.autograd.Function`` with a ``forward(ctx, ...)`` runs the same implementation and the
  same backward formula as the custom op's ``register_autograd``. That kind of Function costs
  4.7 µs per call where the custom op costs 14, because it supports no functorch transform
  (a Function with ``setup_context``, which does, costs as much as the custom op: both floors
  are in the benchmark); a transform, like every other watcher, takes the custom op. The op
  calls that Function through :func:`applier`, which skips ``Function.apply``'s Python preamble.
- :data:`CUSTOM_OP`: anything else.

:func:`direct` is the question of an op without such a Function: is the path :data:`PLAIN`.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch.autograd import forward_ad
from torch.autograd.function import _is_setup_context_defined

_PLAIN = (torch.Tensor, torch.nn.Parameter)   # no subclass with its own dispatch (FakeTensor, DTensor)

# torch's questions, looked up once: each ``torch._C...`` chain is dict lookups on every call
# (host time ``workbench bench overhead`` counts). The same function objects, so
# torch.compile, which traces path, still knows each of them.
_compiling = torch.compiler.is_compiling
_function_mode = torch._C._is_torch_function_mode_enabled
_dispatch_modes = torch._C._len_torch_dispatch_stack
_transform = torch._C._functorch.peek_interpreter_stack
_tracing = torch._C._get_tracing_state
_grad_enabled = torch.is_grad_enabled
unwrap = torch._C._functorch.unwrap_if_dead
"""A tensor left wrapped by a finished functorch transform, unwrapped (any other as it is)."""

CUSTOM_OP, PLAIN, AUTOGRAD = 0, 1, 2


def kind(*tensors: torch.Tensor) -> int:
    """What :func:`path` says of ``tensors`` when nothing watches and grad mode is on:
    :data:`CUSTOM_OP` if one is not a plain ``torch.Tensor`` or ``Parameter``, else
    :data:`AUTOGRAD` if one needs a gradient, else :data:`PLAIN`. It follows from their types
    and ``requires_grad``, which a launch plan's key holds (:func:`kernels.plans.meta`): a
    plan works it out once and passes it to :func:`path` as ``known``. (:func:`path` asks the
    same of unknown tensors in a loop of its own: a call of this function there is one more
    Python frame per op call; ``tests/test_eager.py`` checks that both agree.)"""
    if any(type(t) not in _PLAIN for t in tensors):
        return CUSTOM_OP
    return AUTOGRAD if any(t.requires_grad for t in tensors) else PLAIN


def path(*tensors: torch.Tensor, known: int | None = None) -> int:
    """How an eager call of a public op on ``tensors`` runs: :data:`CUSTOM_OP` when it is traced
    by ``torch.compile`` or ``torch.jit.trace``, a torch-function mode (e.g. ``with
    torch.device(...)``) or dispatch mode (FakeTensorMode, ``make_fx``, export) is active, a
    functorch transform (``vmap``, ``grad``) or a forward-mode AD level is open, or a tensor is
    not a plain ``torch.Tensor`` or ``Parameter``; else :data:`AUTOGRAD` if grad mode is on and a
    tensor needs a gradient, else :data:`PLAIN`. ``known`` is :func:`kind` of the op's tensors
    where a plan kept it (then no tensor need be passed). Autocast needs no custom op: the
    public ops cast their operands to the region's dtype themselves (:func:`.autocast.operands`)."""
    if (_compiling() or _function_mode() or _dispatch_modes() or forward_ad._current_level >= 0
            or _transform() is not None or _tracing() is not None):
        return CUSTOM_OP
    if known is None:
        known = PLAIN
        for t in tensors:
            if type(t) not in _PLAIN:
                return CUSTOM_OP
            if t.requires_grad:
                known = AUTOGRAD
    return known if known == CUSTOM_OP or _grad_enabled() else PLAIN


def direct(*tensors: torch.Tensor) -> bool:
    """Whether nothing but eager PyTorch sees this call and no gradient is needed, so an op
    without an ``autograd.Function`` of its own may call its implementation (:func:`path` is
    :data:`PLAIN`)."""
    return path(*tensors) == PLAIN


def function_apply(function: type[torch.autograd.Function]) -> Callable:
    """torch's C entry of ``function.apply`` (``_FunctionBase.apply``), for a ``forward(ctx, ...)``
    Function only: what :func:`applier` calls once it has unwrapped the tensors (:data:`unwrap`)."""
    if _is_setup_context_defined(function.setup_context):
        raise TypeError(f"{function.__name__} defines setup_context: call its apply, which binds defaults")
    return super(torch.autograd.Function, function).apply


def applier(function: type[torch.autograd.Function], tensors: int) -> Callable:
    """``function.apply`` for the :data:`AUTOGRAD` path: torch's C entry (:func:`function_apply`)
    with the one step of ``Function.apply``'s Python preamble that applies when no functorch
    transform is active (which :func:`path` has established): tensor arguments left wrapped by a
    finished transform are unwrapped (:data:`unwrap`). They are the first ``tensors`` arguments.
    The other steps (binding defaults for a ``setup_context`` Function, routing to functorch
    under a transform) do not apply to a ``forward(ctx, ...)`` Function outside transforms.
    Skipping the preamble is the difference between the benchmark's two ``autograd.Function``
    floors (``workbench bench overhead``). ``nn.Linear``, whose bias may be None, makes the same
    call inline (:func:`kernels.gemm.linear.linear`)."""
    apply = function_apply(function)

    def call(*args):
        return apply(*map(unwrap, args[:tensors]), *args[tensors:])
    return call
