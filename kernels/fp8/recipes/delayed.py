"""delayed: per-tensor scales from the amax of earlier steps (an amax history): of x, w and dy
in a Linear, of the forward's operands and the three grouped GEMMs' output gradients in
``Float8MoE`` and in the expert-parallel FP8 MoE layer.

The scale of this step is known before the tensor is read: ``max(history) / fp8_max``
over the last :data:`HISTORY` steps' amaxes (Transformer Engine's ``DelayedScaling``,
``amax_compute_algo="max"``), fp8_max of the tensor's own format (e5m2's for dy under the
"hybrid" gradient format). So the cast need not wait for an amax: the fused cast
with the given scale (:func:`kernels.gemm_fp8.quantize.quantize_checked` with ``scale=`` and
``amax=True``) writes each tile's max |x| as it casts, and the max of those tile maxima,
reduced by the record's launch itself, is what enters the history (:func:`push_amax`): each
tensor is read once per step, and no torch pass reads it for its amax. While a history is
empty (the first step, or :data:`HISTORY` all-zero steps) the current amax is taken instead;
it comes from the dense op's amax pass (:func:`kernels.gemm_fp8.quantize.amax_partials_checked`),
which every step launches but which reads the tensor only when the device finds the
history empty, and whose partial maxima the scale's launch reduces with the history (no host
sync decides it, no torch op reduces either: :func:`history_scale`). The price: a tensor whose
amax grows past the history's saturates at +-fp8_max. A step in which the largest value
lands beyond ``fp8_max`` plus half a unit in the last place there (what round-to-nearest
would have rounded down to the max anyway, :func:`saturates_above`) is counted per layer
(``fp8_saturated``) and reported by :func:`kernels.fp8.warn_saturation`, never a NaN
(:func:`kernels.gemm_fp8.quantize_fp8` clamps before the cast).

Where each history is written:

* :class:`kernels.fp8.Float8Linear` (``kernels::fp8_linear``): x and w in the forward
  (:meth:`Delayed.scales` before the op, :meth:`Delayed.record` after it, from the amaxes
  the op returns); the output gradient dy in the backward, whose amax is known only there:
  the layer hands dy's history and, in training mode, its counts to the op
  (:meth:`Delayed.grad_state`), and the op's backward takes dy's scale from that history
  on the device, casts dy with it and records the amax the cast found
  (:meth:`Delayed.backward`), as Transformer Engine's ``DelayedScaling`` does for the
  gradient; those in-place writes survive ``torch.compile`` (the backward graph holds them;
  tested under ``aot_eager``).
* :class:`kernels.moe.fp8_layer.Float8MoE` keeps one history per operand of its three
  grouped GEMMs' forward (the routed rows x, SwiGLU's output, the three expert weights)
  through :func:`history_state`, :func:`cast_scales` and :func:`record_amax`, the same rule,
  and one per GEMM's output gradient (``dy_down``: the down GEMM's dy; ``dy_gate`` and
  ``dy_up``: dg and du from SwiGLU's derivative) written in the backward as a Linear's dy
  is: the layer hands each GEMM's history and, in training mode, its counts and index to the
  grouped training op (``grouped_gemm_fp8_train(..., history_dy=, counts=, count_index=)``),
  whose backward takes the gradient's scale from the history on the device
  (:func:`history_scale`), casts it twice with that one scale (dgrad's token operand,
  wgrad's grouped operand) and records the amax the first cast found (:func:`push_amax`,
  :func:`kernels.moe.grouped_gemm_fp8.training.gradients`); kept under ``torch.compile``
  too (tested under ``aot_eager``). The expert-parallel layer (:mod:`kernels.moe.ep_fp8_layer`), which casts its forward
  operands in chunks, records the largest of its chunks' amaxes once a step
  (:func:`record_parts`), and keeps the same three gradient histories: its owner's merged
  backward (all chunks' rows at once) hands each GEMM's history, and when the forward ran in
  training mode its counts, to ``gradients``, so each gradient takes one history scale for
  all of the owner's rows and records the amax of those rows once a step (capacity padding
  rows are 0 there, as the module says), which the amax sync's MAX over the ranks makes the
  whole batch's.

Activation checkpointing: :func:`kernels.fp8.checkpoint` (non-reentrant
``torch.utils.checkpoint`` with :mod:`kernels.fp8.recompute`'s context) records, per
checkpointed call, every scale its delayed casts take, in order, and that call's recompute
replays them and records nothing: the recomputed FP8 operands are the forward's bits, and the
histories, the counts and every gradient are those of the same steps without checkpointing,
under any schedule: a layer run twice in one call, several micro-batches' forwards before
their backwards (1F1B), the expert-parallel layer's chunks in the first step (each its own
amax), eval mode set between a forward and its backward (tests/test_fp8_recompute.py). A plain
``torch.utils.checkpoint`` (reentrant or not) is recognised from the layer alone
(:func:`recomputing`): a training-mode forward inside a backward casts with the scales the
layer's last forward took (kept on the layer, :func:`cast_scales`) and records nothing, exact
where each layer's backward follows its one forward (a Float8Linear block and a Float8MoE
layer, tested); the cases above recompute with other scales there, silently, and a forward
inside a double backward (``create_graph=True``) is taken for a recompute too. Under
``torch.compile`` the layer's Python is traced, not rerun, and the compiler recomputes from the
graph: torch's checkpoint there recomputes the scales from the updated histories (wrong for a
Float8Linear block, tested), :func:`kernels.fp8.checkpoint` keeps the forward's (it saves the
history reductions; tested for a Float8Linear block and Float8MoE under ``aot_eager``, two plain
steps).

The histories and counts are buffers of the layer, so ``state_dict`` saves and loads
them: ``fp8_amax_history_<tensor>`` per tensor and one ``fp8_saturated`` count per
tensor, in the order of the layer's ``fp8_tensors`` (x, w, dy for a Linear:
:data:`kernels.fp8.saturation.TENSORS`; an FP8 MoE layer's five forward operands, then
``dy_gate``, ``dy_up``, ``dy_down``). A checkpoint from before the output gradients'
histories (a Linear's x's and w's only, two counts; an FP8 MoE layer's five, five counts) loads
with those histories empty and their counts 0 (:meth:`Delayed.upgrade_state`). Under
``torch.distributed`` the ranks share them: one MAX all-reduce of every layer's histories,
the output gradients' included, per training step (:mod:`kernels.fp8.amax_sync`, installed
by ``convert``; an output gradient's amax recorded in step t's backward is reduced before
step t + 1's forward, so the ranks agree on its scale from the second step on). A layer updates them in training mode only (in eval mode an output gradient's
history still gives its scale, but nothing is recorded); the first step (an empty history)
takes the current amax.
"""
from __future__ import annotations

import math

import torch

from ... import eager
from ...gemm_fp8.formats import E5M2_OF
from ...gemm_fp8.quantize import amax_partials_checked
from .. import history_ops
from .. import recompute as fp8_recompute
from ..recipe import register
from ..saturation import TENSORS
from ..scaled_gemm import PerTensorRecipe

HISTORY = 16
PREFIX = "fp8_amax_history_"


def _ulp_at_max(fp8: torch.dtype) -> float:
    """The spacing of ``fp8``'s values in its top binade: 3 mantissa bits for e4m3, 2 for e5m2
    (``finfo.eps`` would say 2^-3 for e5m2fnuz)."""
    fmax = torch.finfo(fp8).max
    return 2.0 ** (math.floor(math.log2(fmax)) - (2 if fp8 in E5M2_OF.values() else 3))


def saturates_above(fp8: torch.dtype) -> float:
    """The max of ``fp8`` plus half its ulp there: 464 for e4m3fn, 248 for e4m3fnuz, 61440 for
    e5m2 and e5m2fnuz."""
    return torch.finfo(fp8).max + _ulp_at_max(fp8) / 2


def _saturation(fp8: torch.dtype) -> tuple[float, bool]:
    """(:func:`saturates_above`, whether a value on it saturates too): that tie rounds away from
    the max where the max's last mantissa bit is 1 (e4m3fnuz's 240, e5m2's 57344; e4m3fn's 448
    ends in 0, and its tie rounds down to it)."""
    return saturates_above(fp8), bool(round(torch.finfo(fp8).max / _ulp_at_max(fp8)) % 2)


# per FP8 format, worked out once (a dict, which torch.compile reads as it is)
_SATURATION = {fp8: _saturation(fp8) for fp8 in (*E5M2_OF, *E5M2_OF.values())}


def saturated(values: torch.Tensor, scale, fp8: torch.dtype) -> torch.Tensor:
    """Where ``values`` cast with ``scale`` to ``fp8`` land past the max under round-to-nearest-even
    (and so are clamped): beyond :func:`saturates_above`, or on it where that tie rounds away
    from the max (:func:`_saturation`)."""
    above, at_limit = _SATURATION[fp8]
    limit = scale * above
    return values >= limit if at_limit else values > limit


def history_state(tensors: tuple[str, ...], device) -> dict[str, torch.Tensor]:
    """The buffers of a layer whose ``tensors`` take delayed scales: an empty amax history
    each and one saturation count each (``fp8_saturated``, in ``tensors``' order)."""
    return {**{PREFIX + name: torch.zeros(HISTORY, device=device) for name in tensors},
            "fp8_saturated": torch.zeros(len(tensors), dtype=torch.int64, device=device)}


def history_scale(history: torch.Tensor, t: torch.Tensor, fp8: torch.dtype,
                  direct: bool | None = None, keep_partials: bool = False):
    """The delayed scale of a 2-D ``t`` cast to ``fp8`` from its amax ``history``, on the device:
    max(history) / fp8's max, the current amax's while the history is empty, 1 for all-zero: two
    launches, the amax pass, which reads ``t`` only while every entry of the history is 0 (its
    ``unless``, :func:`kernels.gemm_fp8.quantize.amax_partials_checked`), and one that reduces the
    history and the pass's partial maxima and makes the scale (:func:`kernels.fp8.history_ops.scale`);
    no torch op. ``t`` as its caller checked it (a layer's checked input or own weight, an op's
    operand or gradient) and ``history`` a buffer of the same layer: no checks here. Detached: no
    graph, also in a backward that makes one (``create_graph=True``). ``direct``:
    :func:`kernels.eager.direct` of ``history`` and ``t`` detached, where the caller asked it once
    for several ops (None: asked here). ``keep_partials``: (scale, the pass's partial maxima), for
    a caller that joins them with other parts' (:func:`joined_scale`); with a history of no
    entries that scale is current scaling's (amax / fp8's max, 1 for all-zero or empty). One
    function, not a wrapper of another: the delayed Linear's host cost counts its Python calls
    (tests/test_host_overhead.py)."""
    t = t.detach()
    if direct is None:
        direct = eager.direct(history, t)
    partials = amax_partials_checked(t, history, direct)
    scale = history_ops.scale(history, partials, torch.finfo(fp8).max, direct)
    return (scale, partials) if keep_partials else scale


def joined_scale(history: torch.Tensor, parts: list[torch.Tensor],
                 fp8: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, maxima) of a tensor cast in parts, from each part's maxima (``parts``: tile maxima
    or amax partials, one tensor per part): the maxima joined into one vector (:func:`joined`) and
    :func:`kernels.fp8.history_ops.scale` of ``history`` and them, the scale one cast over the
    whole tensor would take (a max is exact in any order)."""
    maxima = joined(parts)
    return history_ops.scale(history, maxima, torch.finfo(fp8).max), maxima


def joined(parts: list[torch.Tensor]) -> torch.Tensor:
    """Parts' maxima as one vector: the one part's own, else one torch op joining them."""
    return parts[0] if len(parts) == 1 else torch.cat([part.reshape(-1) for part in parts])


def recomputing(layer) -> bool:   # asked outside no_grad: the grad mode is part of the answer
    """``layer`` runs its forward again inside a backward: a recompute of
    :func:`kernels.fp8.checkpoint` (its tape is being replayed), or one that looks
    like activation checkpointing's (``torch.utils.checkpoint``, reentrant or not, reruns the
    forward in training mode while autograd's engine executes the backward, with gradients on);
    not a forward a backward hook runs with gradients off, which casts and records as any
    forward. Never while compiling: the trace runs the layer's Python once."""
    if torch.compiler.is_compiling():
        return False
    return (fp8_recompute.open_tapes and fp8_recompute.replaying() is not None) or (
        layer.training and torch.is_grad_enabled() and torch._C._current_graph_task_id() != -1)


def _forward_scales(layer) -> dict[str, torch.Tensor]:
    """The scales the layer's last training-mode forward cast with, by tensor name: what its
    recompute casts with again (a plain attribute: within one step, never saved)."""
    return layer.__dict__.setdefault("_fp8_forward_scales", {})


def _kept_for_recompute(layer, scales: dict[str, torch.Tensor]) -> None:
    """``scales`` (by tensor name), kept as those a recompute of this forward takes: on the tapes
    of the :func:`kernels.fp8.checkpoint` calls being recorded, and (training mode, eager) on the
    layer, for a plain ``torch.utils.checkpoint``'s recompute. Nothing while compiling."""
    if torch.compiler.is_compiling():
        return
    if fp8_recompute.open_tapes:
        fp8_recompute.keep(layer, scales)
    if layer.training:
        _forward_scales(layer).update(scales)


def _forward_scale(layer, name: str) -> torch.Tensor | None:
    """The scale a recompute (:func:`recomputing`, so not while compiling) of ``layer``'s cast of
    ``name`` takes: its checkpoint call's tape's next (:func:`kernels.fp8.checkpoint`), else the
    layer's last forward's under a plain checkpoint's recompute (None before any forward kept one)."""
    tape = fp8_recompute.replaying() if fp8_recompute.open_tapes else None
    return _forward_scales(layer).get(name) if tape is None else tape.take(layer, name)


def cast_scales(layer, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The delayed scale of each of ``tensors`` by name (each 2-D, or an expert stack (G, K, N)
    read as G·K rows), for fused casts that return their amaxes to :func:`record_amax` after
    (:func:`history_scale` with the history of the name; the recompute question and
    :func:`kernels.eager.direct` asked once for all of them, the buffers read from the layer's
    dict, ``_buffers``: an attribute read is a Python call, Module.__getattr__). A recompute
    (:func:`recomputing`) takes the scales its forward took: the histories have the forward's
    amaxes by then, and other scales would cast the recomputed operands to other bits than the
    forward's."""
    scales, histories, rows = {}, {}, {}
    recompute, buffers = recomputing(layer), layer._buffers
    for name, t in tensors.items():
        kept = _forward_scale(layer, name) if recompute else None
        if kept is not None:
            scales[name] = kept
            continue
        histories[name] = buffers[PREFIX + name]
        rows[name] = t.detach().reshape(math.prod(t.shape[:-1]), t.shape[-1])   # a view of a contiguous t
    if rows:
        fp8, direct, fresh = layer.fp8_dtype, eager.direct(*histories.values(), *rows.values()), {}
        for name, t in rows.items():
            fresh[name] = history_scale(histories[name], t, fp8, direct)
        _kept_for_recompute(layer, fresh)
        scales.update(fresh)
    return scales


def push_amax(history: torch.Tensor, counts: torch.Tensor, index: int, maxima: torch.Tensor, scale: torch.Tensor,
              fp8: torch.dtype, direct: bool | None = None) -> None:
    """The amax, the max of ``maxima`` (a fused cast's tile maxima), enters ``history`` (newest
    first) and a step whose ``scale`` saturates it in ``fp8`` (:func:`saturated`) adds 1 to
    ``counts[index]``; in place, on the device, one launch that reduces the maxima too
    (:func:`kernels.fp8.history_ops.record`; ``direct`` as :func:`history_scale`'s)."""
    history_ops.record(history, counts, index, maxima, scale, *_SATURATION[fp8], direct)


def record_amax(layer, names: tuple[str, ...], maxima, scales, recompute: bool | None = None,
                direct: bool | None = None) -> None:
    """In training mode: the amax of each of ``maxima`` (one tensor per name in ``names``: the
    tile maxima the fused casts with ``scales``, in that order, wrote) enters the history of each
    name and a step whose scale saturates it is counted (:func:`push_amax`;
    :func:`kernels.eager.direct` asked once for all, the buffers read as :func:`cast_scales` reads
    them); not in a recompute, whose amaxes its forward recorded (:func:`recomputing`).
    ``recompute`` and ``direct``: those answers where the caller asked them already (None: asked
    here)."""
    if layer.training and not (recomputing(layer) if recompute is None else recompute):
        buffers, fp8, order = layer._buffers, layer.fp8_dtype, layer.fp8_tensors
        counts, histories = buffers["fp8_saturated"], []
        for name in names:
            histories.append(buffers[PREFIX + name])
        if direct is None:
            direct = eager.direct(*histories, counts, *maxima)
        for i, name in enumerate(names):
            push_amax(histories[i], counts, order.index(name), maxima[i], scales[i], fp8, direct)


def record_parts(layer, name: str, parts: list[torch.Tensor]) -> torch.Tensor:
    """For a layer that casts a tensor in parts (the expert-parallel layer's chunks), each with
    :func:`cast_scales`'s scale of its part: the largest of the tile maxima the parts' casts
    wrote (``parts``, one tensor per part) enters the history of ``name`` once a step
    (:func:`record_amax`), and the whole tensor's scale is returned: the history's, or while it
    was empty that amax's (:func:`kernels.fp8.history_ops.scale`, which reduces the maxima as the
    record does: the parts' maxima joined, :func:`joined`). The recompute question and
    :func:`kernels.eager.direct` are asked once, for the scale and the record (no maxima need a
    gradient: the casts mark them non-differentiable, so ``no_grad`` does not change the answer)."""
    whole, recompute = "whole " + name, recomputing(layer)
    kept = _forward_scale(layer, whole) if recompute else None
    if kept is not None:
        return kept
    with torch.no_grad():
        maxima = joined(parts)
        buffers = layer._buffers
        history = buffers[PREFIX + name]
        direct = eager.direct(history, buffers["fp8_saturated"], maxima)
        scale = history_ops.scale(history, maxima, torch.finfo(layer.fp8_dtype).max, direct)
    record_amax(layer, (name,), (maxima,), (scale,), recompute, direct)
    _kept_for_recompute(layer, {whole: scale})
    return scale


class Delayed(PerTensorRecipe):
    name = "delayed"
    summary = f"per-tensor scales of x, w and dy from the max amax of the last {HISTORY} steps"

    def state(self, device):
        return history_state(TENSORS, device)

    def reduced_buffers(self, layer):
        return [b for name, b in layer.named_buffers(recurse=False) if name.startswith(PREFIX)]

    def scales(self, layer, x, w):
        """:func:`cast_scales` of x and w (as fp8_linear checked them: kernels.fp8.linear._checked)."""
        scales = cast_scales(layer, {"x": x, "w": w})
        return scales["x"], scales["w"]

    def record(self, layer, scales, maxima):
        """:func:`record_amax` of x and w."""
        record_amax(layer, ("x", "w"), maxima, scales)

    def grad_state(self, layer):
        """dy's history, and the counts to record into in training mode only (None in eval mode)."""
        buffers = layer._buffers
        return buffers[PREFIX + "dy"], buffers["fp8_saturated"] if layer.training else None

    def backward(self, dy, saved, grad_fp8, dx_dtype, dw_dtype, need_dx=True, need_dw=True, history=None,
                 counts=None):
        """dy cast with ``history``'s scale (:func:`history_scale`), its amax, found by the cast
        (its tile maxima, which the record reduces), recorded when ``counts`` is given (training
        mode); without a ``history`` (no layer: :meth:`gemms`, the accuracy report) dy's current
        scale."""
        if history is None:
            return super().backward(dy, saved, grad_fp8, dx_dtype, dw_dtype, need_dx, need_dw)
        direct = eager.direct(history, dy.detach())   # asked once for the scale's two ops and the record
        scale = history_scale(history, dy, grad_fp8, direct)
        dx, dw, *found = super().backward(dy, saved, grad_fp8, dx_dtype, dw_dtype, need_dx, need_dw, scale,
                                          amax=counts is not None)   # an amax only where it is recorded
        if counts is not None:
            push_amax(history, counts, TENSORS.index("dy"), found[0], scale, grad_fp8, direct)
        return dx, dw

    def upgrade_state(self, layer, state_dict, prefix):
        """A checkpoint from before the output gradients' histories (the histories of the first
        of ``layer``'s ``fp8_tensors`` only, one count each: a Linear's x and w, an FP8 MoE
        layer's five forward operands) loads with the missing ones empty (their first step takes the
        current amax) and their counts 0."""
        counts = state_dict.get(prefix + "fp8_saturated")
        names = layer.fp8_tensors
        keys = [prefix + PREFIX + name for name in names]
        have = next((i for i, key in enumerate(keys) if key not in state_dict), len(keys))
        forward = sum(not (name == "dy" or name.startswith("dy_")) for name in names)   # the old layout's
        if (counts is None or have != forward or have == len(keys) or counts.numel() != have
                or any(key in state_dict for key in keys[have:])):
            return   # not the old layout: strict loading names what is missing
        for key in keys[have:]:
            state_dict[key] = torch.zeros_like(state_dict[keys[0]])
        state_dict[prefix + "fp8_saturated"] = torch.cat([counts, counts.new_zeros(len(keys) - have)])


register(Delayed())
