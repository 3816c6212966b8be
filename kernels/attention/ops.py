"""The public attention: ``kernels.flash_attention`` and ``kernels.flash_attention_varlen``.

Which kernels run: v3's forward kernel (it keeps the log-sum-exp the backward needs)
launched with v4's tuned config, and v5's backward kernels. Not the registry's highest
rung as ``kernels.matmul`` picks: the forward must hand its LSE to the backward, which
only these functions agree on.

How it is wrapped: two PyTorch custom ops, ``kernels::flash_attention_fwd`` (returns O
and the LSE's two parts) and ``kernels::flash_attention_bwd`` (returns dQ, dK, dV), each with
a fake (meta) implementation, joined by ``register_autograd``, so
``torch.compile(fullgraph=True)`` sees two opaque nodes and no graph break, and the
backward runs as its own op. An eager call that nothing traces (:func:`kernels.eager.path`)
runs the forward's launch plan itself, through an ``autograd.Function`` with the same formula
when it needs a gradient; its backward then calls v5's plan without the backward custom op.

Varlen: packed (total_tokens, H, D) tensors split by ``cu_seqlens`` (flash-attn's
layout: sequence i is rows cu_seqlens[i]:cu_seqlens[i+1], attending only within
itself). Causal is SDPA's top-left mask per sequence, like the dense op; flash-attn
2.1+ aligns its causal mask bottom-right instead, which differs only for sequences
whose query and key lengths differ. The same kernels run with ``VARLEN=True`` over
the whole packed batch (:mod:`.varlen`): one forward launch and three backward
launches whatever the number of sequences, wrapped as ``kernels::flash_attention_varlen_fwd``
and ``_bwd`` like the dense op. The forward runs v4's tuned config of the longest
lengths' bucket, timed on the packed launch itself (:func:`.v4_amd_tuned.tuned`).
"""
from __future__ import annotations

import torch

from .. import autocast, eager, plans, validate
from . import v4_amd_tuned, v5_backward, varlen
from .spec import DTYPES, MAX_HEAD_DIM


def _no_work(q: torch.Tensor, k: torch.Tensor) -> bool:
    """Whether no query row meets a key: B, Hq or S is 0 (no rows), or S_k is 0."""
    return q.numel() == 0 or k.numel() == 0


def _keyless(q: torch.Tensor, lse_shape: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    """SDPA's result when :func:`_no_work`: O = 0 (empty, or rows that saw no key), and the
    log-sum-exp over no keys, -inf. No kernel is launched."""
    return q.new_zeros(q.shape), q.new_full(lse_shape, float("-inf"), dtype=torch.float32)


def _grads_like(q, k, v) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward ops' fake results: dQ, dK, dV laid out as v5's backward allocates them
    (:func:`kernels.outputs.new_output_like`), so a traced graph has the real strides."""
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _zero_grads(q, k, v) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward when :func:`_no_work`: O did not depend on any input."""
    return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)


def _fwd_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
              scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    if _no_work(q, k):
        b, h, s, _ = q.shape
        return _keyless(q, (b, h, 2, s))
    return v4_amd_tuned.forward(q, k, v, causal, scale)


_fwd = torch.library.custom_op("kernels::flash_attention_fwd", _fwd_impl, mutates_args=())


@_fwd.register_fake
def _(q, k, v, causal, scale):
    b, h, s, _ = q.shape
    return q.new_empty(q.shape), q.new_empty((b, h, 2, s), dtype=torch.float32)


def _bwd_impl(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
              lse: torch.Tensor, causal: bool, scale: float
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if _no_work(q, k):
        return _zero_grads(q, k, v)
    return v5_backward.backward(q, k, v, o, lse, do, causal, scale)


_bwd = torch.library.custom_op("kernels::flash_attention_bwd", _bwd_impl, mutates_args=())


@_bwd.register_fake
def _(do, q, k, v, o, lse, causal, scale):
    return _grads_like(q, k, v)


def _save(ctx, inputs, output):
    q, k, v, causal, scale = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.causal, ctx.scale = causal, scale


def _backward(ctx, do, _dlse):
    """The backward custom op, or its implementation where nothing watches (:func:`kernels.eager.direct`)."""
    q, k, v, o, lse = ctx.saved_tensors
    bwd = _bwd_impl if eager.direct(do, q, k, v, o, lse) else _bwd
    dq, dk, dv = bwd(do, q, k, v, o, lse, ctx.causal, ctx.scale)
    return dq, dk, dv, None, None


_fwd.register_autograd(_backward, setup_context=_save)
autocast.lower_precision("flash_attention_fwd")


class _Attention(torch.autograd.Function):
    """The custom op's autograd formula, for an eager call that needs a gradient and that nothing
    else watches (:data:`kernels.eager.AUTOGRAD`): ``forward`` runs the launch plan."""

    @staticmethod
    def forward(ctx, q, k, v, plan):
        o, lse = plan.call(q, k, v)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.scale = plan.causal, plan.scale
        return o

    @staticmethod
    def backward(ctx, do):
        return (*_backward(ctx, do, None)[:3], None)


_apply_attention = eager.applier(_Attention, tensors=3)


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                    scale: float | None = None) -> torch.Tensor:
    """softmax(q kᵀ · scale) v for q (B, Hq, S, D), k and v (B, Hkv, S_k, D); differentiable.

    Hq must be a multiple of Hkv (GQA/MQA). ``scale`` defaults to 1/sqrt(D) and may be any
    float, as in SDPA's math (0 averages the visible V, a negative one flips the order), taken
    as float32 as the kernels compute (one under float32's smallest normal is 0, one past its
    range is refused: :func:`kernels.validate.fp32_argument`); ``causal``
    is SDPA's ``is_causal`` (top-left aligned, also for S != S_k). fp32, fp16, bf16 with
    fp32 softmax statistics; any D <= 128, any strides. The result is (B, Hq, S, D) in q's
    dtype (under ``torch.autocast``, q, k and v are cast to its dtype, as for SDPA). The
    gradients are laid out as q, k and v (``torch.empty_like``'s layout: their strides where
    they are dense), so autograd takes one back through a projection's transposed view
    without a copy. As in
    SDPA, B, Hq (with Hkv), S or S_k may be 0: O is then empty, or 0 for rows without
    keys, and the gradients 0. Errors name the argument at fault.
    """
    if autocast.active():   # SDPA takes mixed dtypes there: cast before the checks
        q, k, v = autocast.operands(q, k, v)
    plan = _PLANS(plans.meta(q, k, v, extra=(causal, type(causal), scale, type(scale))), _Checked,
                  q, k, v, causal, scale)
    how = eager.path(known=plan.kind)
    if how == eager.PLAIN:
        return plan.call(q, k, v)[0]
    if how == eager.AUTOGRAD:
        return _apply_attention(q, k, v, plan)
    return _fwd(q, k, v, causal, plan.scale)[0]


_PLANS = plans.PlanCache()


class _Checked(plans.Checked):
    """:func:`flash_attention`'s checks for inputs of one metadata, ``causal`` and ``scale``
    (their types are in the key: ``True == 1``); ``scale`` the softmax scale they give, ``kind``
    the inputs' :func:`kernels.eager.kind`."""

    def __init__(self, q, k, v, causal, scale):
        if not isinstance(causal, bool):
            raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
        self.causal = causal
        self.scale = validate.attention_operands(q, k, v, scale, DTYPES, MAX_HEAD_DIM, allow_empty=True)
        self.kind = eager.kind(q, k, v)

    def bind(self, q, k, v):
        causal, scale = self.causal, self.scale
        if _no_work(q, k):
            return lambda q, k, v: _fwd_impl(q, k, v, causal, scale)
        return v4_amd_tuned.plan(q, k, v, causal, scale)


def _varlen_fwd_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor,
                     cu_k: torch.Tensor, max_q: int, max_k: int, causal: bool,
                     scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    if _no_work(q, k):
        return _keyless(q, (1, q.shape[1], 2, q.shape[0]))
    return v4_amd_tuned.forward(q, k, v, causal, scale, packing=varlen.Packing(cu_q, cu_k, max_q, max_k))


_varlen_fwd = torch.library.custom_op("kernels::flash_attention_varlen_fwd", _varlen_fwd_impl,
                                      mutates_args=())


@_varlen_fwd.register_fake
def _(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale):
    t, h, _ = q.shape
    return q.new_empty(q.shape), q.new_empty((1, h, 2, t), dtype=torch.float32)


def _varlen_bwd_impl(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     o: torch.Tensor, lse: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor,
                     max_q: int, max_k: int, causal: bool, scale: float
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if _no_work(q, k):
        return _zero_grads(q, k, v)
    return v5_backward.backward(q, k, v, o, lse, do, causal, scale,
                                varlen.Packing(cu_q, cu_k, max_q, max_k))


_varlen_bwd = torch.library.custom_op("kernels::flash_attention_varlen_bwd", _varlen_bwd_impl,
                                      mutates_args=())


@_varlen_bwd.register_fake
def _(do, q, k, v, o, lse, cu_q, cu_k, max_q, max_k, causal, scale):
    return _grads_like(q, k, v)


def _varlen_save(ctx, inputs, output):
    q, k, v, cu_q, cu_k, max_q, max_k, causal, scale = inputs
    ctx.save_for_backward(q, k, v, output[0], output[1], cu_q, cu_k)
    ctx.args = max_q, max_k, causal, scale


def _varlen_backward(ctx, do, _dlse):
    """The backward custom op, or its implementation where nothing watches (:func:`kernels.eager.direct`)."""
    saved = ctx.saved_tensors
    bwd = _varlen_bwd_impl if eager.direct(do, *saved) else _varlen_bwd
    dq, dk, dv = bwd(do, *saved, *ctx.args)
    return dq, dk, dv, None, None, None, None, None, None


_varlen_fwd.register_autograd(_varlen_backward, setup_context=_varlen_save)
autocast.lower_precision("flash_attention_varlen_fwd")


class _AttentionVarlen(torch.autograd.Function):
    """:class:`_Attention` for :func:`flash_attention_varlen`."""

    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, plan):
        o, lse = plan.call(q, k, v, cu_q, cu_k)
        ctx.save_for_backward(q, k, v, o, lse, cu_q, cu_k)
        ctx.args = (*plan.args, plan.scale)   # max_q, max_k, causal, scale
        return o

    @staticmethod
    def backward(ctx, do):
        return (*_varlen_backward(ctx, do, None)[:3], None, None, None)


_apply_attention_varlen = eager.applier(_AttentionVarlen, tensors=5)


def flash_attention_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
                           max_seqlen_q: int, max_seqlen_k: int, causal: bool = False,
                           scale: float | None = None, *, check_offsets: bool = False) -> torch.Tensor:
    """Attention over packed sequences: q (total_q, Hq, D), k and v (total_k, Hkv, D).

    Sequence i is q[cu_seqlens_q[i]:cu_seqlens_q[i+1]] against the same slice of k and v
    by ``cu_seqlens_k`` (int32, starting at 0, non-decreasing, ending at the token
    count; no sequence longer than its ``max_seqlen``). Returns (total_q, Hq, D) in q's
    dtype; differentiable, the gradients laid out as q, k and v (as in :func:`flash_attention`).
    A sequence without queries gives no rows (its keys get zero
    gradients), and a batch without query tokens an empty result. ``scale`` as in
    :func:`flash_attention` (float32).

    As in flash-attn, the offsets stay on the device and the call makes no host sync: the
    launches depend only on the max lengths, which the caller gives, and the sequence
    count. ``check_offsets=True`` reads them on the host once (one sync) and raises for
    offsets out of order or off the token counts, a sequence longer than its max_seqlen,
    or one with queries but no keys. Unchecked, wrong offsets give wrong rows, and the
    kernels stay inside the tensors: forward and backward clamp each sequence into the
    packed tokens (its rows past max_seqlen_q are not written).
    """
    # one set of offsets for queries and keys (self-attention's usual call) is keyed once
    same = cu_seqlens_k is cu_seqlens_q
    if autocast.active():   # as flash_attention
        q, k, v = autocast.operands(q, k, v)
    plan = _PLANS_VARLEN(plans.meta(q, k, v, cu_seqlens_q, *(() if same else (cu_seqlens_k,)),
                                    extra=(same, max_seqlen_q, type(max_seqlen_q), max_seqlen_k, type(max_seqlen_k),
                                           causal, type(causal), scale, type(scale))),
                         _CheckedVarlen, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale)
    if check_offsets:   # the values: read on every call that asks
        varlen.check_offsets(cu_seqlens_q, cu_seqlens_k, q.shape[0], k.shape[0], max_seqlen_q, max_seqlen_k)
    how = eager.path(known=plan.kind)
    if how == eager.PLAIN:
        return plan.call(q, k, v, cu_seqlens_q, cu_seqlens_k)[0]
    if how == eager.AUTOGRAD:
        return _apply_attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, plan)
    return _varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, plan.scale)[0]


_PLANS_VARLEN = plans.PlanCache()


class _CheckedVarlen(plans.Checked):
    """:func:`flash_attention_varlen`'s checks that read no offsets, for inputs of one
    metadata, max lengths, ``causal`` and ``scale``; ``kind`` the inputs' :func:`kernels.eager.kind`."""

    def __init__(self, q, k, v, cu_q, cu_k, max_q, max_k, causal, scale):
        if not isinstance(causal, bool):
            raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
        for name, t in (("q", q), ("k", k), ("v", v)):
            validate.tensor(name, t, ndim=3, allow_empty=True)
        self.scale = validate.attention_operands(
            q.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0),
            scale, DTYPES, MAX_HEAD_DIM, allow_empty=True)
        varlen.check_metadata(cu_q, cu_k, max_q, max_k)
        self.args = max_q, max_k, causal
        self.kind = eager.kind(q, k, v, cu_q, cu_k)

    def bind(self, q, k, v, cu_q, cu_k):
        (max_q, max_k, causal), scale = self.args, self.scale
        if _no_work(q, k):
            return lambda q, k, v, cu_q, cu_k: _varlen_fwd_impl(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale)
        tuned = v4_amd_tuned.plan(q, k, v, causal, scale, varlen.Packing(cu_q, cu_k, max_q, max_k))
        if cu_q.is_contiguous() and cu_k.is_contiguous():   # so are the next calls': strides are in the key
            return tuned
        # the offsets packed as Packing packs them (a copy only for a strided view)
        return lambda q, k, v, cu_q, cu_k: tuned(q, k, v, cu_q.contiguous(), cu_k.contiguous())
