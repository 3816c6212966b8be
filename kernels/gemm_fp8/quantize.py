"""The public FP8 quantize op: ``kernels.gemm_fp8.quantize(x, granularity, fp8_dtype, transpose=)``.

What an FP8 training recipe calls on every activation, gradient and weight before a scaled
GEMM (:func:`kernels.gemm_fp8.blockwise_matmul`, :func:`kernels.matmul_fp8`,
:func:`kernels.gemm_fp8.mx_matmul`). The kernels are :mod:`.quantize_kernel`; the
semantics, bit for bit, :mod:`.quantize_ref`. Wrapped as the custom op
``kernels::quantize_fp8`` with a fake implementation, so ``torch.compile(fullgraph=True)``
keeps it in the graph; an eager call that nothing traces runs the implementation itself
(:func:`kernels.eager.direct`). No autograd: quantization is not differentiated through
(a recipe's autograd function quantizes the gradient itself).
"""
from __future__ import annotations

import torch

from .. import eager, validate
from ..mx_preshuffle import preshuffled_shape
from . import quantize_kernel
from .quantize_ref import GRANULARITIES, MX_DTYPES, QUANT_DTYPES, check_scale_rule, scale_shape

X_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def check_scale(name: str, scale: torch.Tensor, x: torch.Tensor) -> None:
    """A given per-tensor scale: float32, one number, on x's device."""
    validate.tensor(name, scale, dtypes=(torch.float32,))
    if scale.numel() != 1:
        raise ValueError(f"{name} must hold one number (a per-tensor scale), got shape {tuple(scale.shape)}")
    validate.same_device(x=x, **{name: scale})


def _check(x, granularity, fp8_dtype, transpose, scale, amax, scale_rule, preshuffled):
    validate.tensor("x", x, ndim=2, dtypes=X_DTYPES, allow_empty=True)
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity must be one of {GRANULARITIES}, got {granularity!r}")
    check_scale_rule(granularity, scale_rule)
    if scale is not None:
        if granularity != "tensor":
            raise ValueError(f"a given scale is one per tensor: granularity 'tensor', got {granularity!r}")
        check_scale("scale", scale, x)
    if amax and scale is None:
        raise ValueError("amax=True comes with a given scale (the cast's by-product); without one "
                         "the tensor granularity's amax launch computes the scale")
    allowed = MX_DTYPES if granularity == "mx32" else QUANT_DTYPES
    if fp8_dtype not in allowed:
        names = ", ".join(str(d).removeprefix("torch.") for d in allowed)
        why = " (MXFP8 is defined on the OCP formats)" if granularity == "mx32" else ""
        raise TypeError(f"fp8_dtype for granularity {granularity!r} must be one of {names}{why}, "
                        f"got {fp8_dtype}")
    for name, flag in (("transpose", transpose), ("amax", amax), ("preshuffled", preshuffled)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")
    if preshuffled and granularity != "mx32":
        raise ValueError(f"preshuffled lays out e8m0 scales for the MX GEMM: granularity 'mx32', "
                         f"got {granularity!r}")


def _quantize_impl(x: torch.Tensor, granularity: str, fp8_dtype: torch.dtype, transpose: bool,
                   scale: torch.Tensor | None = None, amax: bool = False,
                   scale_rule: str = "ocp", preshuffled: bool = False) -> list[torch.Tensor]:
    return list(quantize_kernel.launch(x, granularity, fp8_dtype, transpose, scale, amax, scale_rule, preshuffled))


_quantize = torch.library.custom_op("kernels::quantize_fp8", _quantize_impl, mutates_args=())


@_quantize.register_fake
def _(x, granularity, fp8_dtype, transpose, scale=None, amax=False, scale_rule="ocp", preshuffled=False):
    m, k = x.shape
    scale_dtype = torch.uint8 if granularity == "mx32" else torch.float32
    given = scale is not None   # then the op returns no scales
    def scales(rows, cols):
        shape = scale_shape(granularity, rows, cols)
        return [] if given else [x.new_empty(preshuffled_shape(*shape) if preshuffled else shape, dtype=scale_dtype)]
    out = [x.new_empty((m, k), dtype=fp8_dtype)] + scales(m, k)
    if transpose:
        out += [x.new_empty((k, m), dtype=fp8_dtype)] + scales(k, m)
    return out + ([x.new_empty(quantize_kernel.tile_maxima_shape(m, k), dtype=torch.float32)] if amax else [])


def _amax_impl(x: torch.Tensor, unless: torch.Tensor | None = None) -> torch.Tensor:
    return quantize_kernel.tensor_amax(x, unless)


_amax = torch.library.custom_op("kernels::fp8_amax", _amax_impl, mutates_args=())


@_amax.register_fake
def _(x, unless=None):
    return x.new_empty((), dtype=torch.float32)


def _partials_impl(x: torch.Tensor, unless: torch.Tensor) -> torch.Tensor:
    return quantize_kernel.tensor_partials(x, unless)


_partials = torch.library.custom_op("kernels::fp8_amax_partials", _partials_impl, mutates_args=())


@_partials.register_fake
def _(x, unless):
    return x.new_empty((quantize_kernel.partial_count(*x.shape),), dtype=torch.float32)


def reduce_maxima(maxima: torch.Tensor) -> torch.Tensor:
    """The max of a cast's tile maxima (:func:`quantize_checked` with ``amax=True``) as a 0-d
    float32, 0 where there are none (an empty x): the amax the public ops return. A torch
    reduction, one device op (delayed scaling's record reduces the maxima in its own launch
    instead, :func:`kernels.fp8.history_ops.record`)."""
    return maxima.amax() if maxima.numel() else maxima.new_zeros(())


def amax(x: torch.Tensor, unless: torch.Tensor | None = None) -> torch.Tensor:
    """max |x| of a 2-D float32/float16/bfloat16 ``x`` (any strides) as a 0-d float32 on its
    device, 0 for an empty x, no host sync: the amax pass of ``tensor`` and one launch that
    reduces its partial maxima (no torch op), bitwise ``x.abs().amax().float()`` for an x without
    NaN (the kernels' max, ``tl.maximum`` without NaN propagation, ignores a NaN on the interpreter,
    tested, where torch's amax returns NaN; a GPU's is Triton's default, untested here; the cast
    still writes a NaN as NaN). ``unless`` (float32, one number, on x's device): where it is
    > 0 the launch reads nothing and returns 0 (delayed scaling needs the current amax only
    while its history is empty, which only the device knows). The custom op
    ``kernels::fp8_amax``, so ``torch.compile`` does not trace into the kernel."""
    validate.tensor("x", x, ndim=2, dtypes=X_DTYPES, allow_empty=True)
    if unless is not None:
        check_scale("unless", unless, x)
        unless = unless.reshape(())
    return (_amax_impl if eager.direct(x) else _amax)(x, unless)


def amax_partials_checked(x: torch.Tensor, unless: torch.Tensor, direct: bool) -> torch.Tensor:
    """The amax pass of :func:`amax` alone, on arguments its caller validated: its partial maxima
    (:func:`.quantize_kernel.tensor_partials`), for delayed scaling, whose ``x`` is a layer's
    checked input or own weight, an op's operand or gradient, whose ``unless`` is the layer's own
    amax history (x is read only while every entry is 0), and whose scale launch reduces the
    partials with the history (:func:`kernels.fp8.recipes.delayed.history_scale`). The custom op
    ``kernels::fp8_amax_partials``; ``direct``: :func:`kernels.eager.direct` of ``x`` and
    ``unless``, which the caller asked once for several ops."""
    return (_partials_impl if direct else _partials)(x, unless)


def quantize(x: torch.Tensor, granularity: str, fp8_dtype: torch.dtype, *,
             transpose: bool = False, scale: torch.Tensor | None = None,
             amax: bool = False, scale_rule: str = "ocp", preshuffled: bool = False) -> tuple[torch.Tensor, ...]:
    """Quantize a 2-D ``x`` (M, K) to ``fp8_dtype`` with one scale per group, in one fused pass.

    Returns ``(q, scale)``, or with ``transpose=True`` ``(q, scale, q_t, scale_t)`` where
    ``q_t`` (K, M) is ``x.T`` quantized with groups along its own rows (along M of x), as a
    wgrad GEMM takes it. ``granularity``:

    ============== ================================ =====================================
    granularity    scale (fp32 unless said)          scale_t
    ============== ================================ =====================================
    tensor         ()                                ()
    row            (M, 1)                            (K, 1)
    block1x128     (M, ceil(K/128))                  (K, ceil(M/128))
    block128x128   (ceil(M/128), ceil(K/128))        (ceil(K/128), ceil(M/128)) = scale.T
    mx32           (M, ceil(K/32)) uint8 e8m0        (K, ceil(M/32)) uint8 e8m0
    ============== ================================ =====================================

    ``x`` is float32, float16 or bfloat16 and finite, any strides; ``fp8_dtype`` one of
    e4m3fn, e4m3fnuz, e5m2, e5m2fnuz (``mx32``: the OCP e4m3fn or e5m2). fp32 scales are dequant
    scales (``x ~= q.float() * scale``): ``amax / fp8_max`` of the group, 1 where the amax
    is 0 (and for an empty x); ``q = saturate(x / scale)`` rounded to nearest even.
    ``mx32`` follows the OCP MX rule (:mod:`.quantize_ref`; an all-zero group gets byte 0),
    or with ``scale_rule="round_up"`` the round-up rule of training stacks
    (:func:`kernels.microscaling.round_up_exponent`: the smallest power of two that saturates
    nothing); ``scale_rule`` is for ``mx32`` only (another granularity takes ``"ocp"``, its
    default, which leaves it as it is). ``preshuffled=True`` (``mx32`` only) returns both scale
    tensors in the layout gfx950's scaled MFMAs read (:mod:`kernels.mx_preshuffle`:
    (ceil(rows/32), 256 ceil(blocks/8)) for (rows, blocks), zero bytes in a partial stripe
    or chunk), written so by the cast itself, bitwise ``preshuffle()`` of the row-major ones:
    what :func:`kernels.gemm_fp8.mx_matmul` takes there without a shuffle of its own.
    ``tensor`` and ``row`` read x twice (an amax pass, then the cast: no element can be cast
    before its group's amax is known); the block granularities and ``mx32`` read it once.
    The result is bit-identical to :func:`.quantize_ref.quantize_reference`.

    ``scale`` (``tensor`` only; float32, one number): a per-tensor scale given by the caller
    (delayed scaling's, from an amax history), cast with as it is: no amax pass, x read
    once, values beyond its range saturate at +-max, as
    :func:`kernels.gemm_fp8.quantize_fp8` with ``scale=`` (bit for bit); it is returned,
    as it came if 0-d, as scale and scale_t. ``amax=True`` (with ``scale`` only) appends
    x's amax, max |x| as a 0-d float32 on x's device (0 for an empty x), bitwise
    ``x.abs().amax().float()`` for an x without NaN (a NaN is ignored, as :func:`amax` says):
    each program of the cast writes its tile's max and one
    tiny reduction over the tiles follows (:func:`reduce_maxima`), with no host sync and no
    second read of x (delayed scaling records it in its amax history,
    :mod:`kernels.fp8.recipes.delayed`, from the tile maxima themselves: :func:`quantize_checked`).

    Saturation: none under the fp32 scales (each group's amax maps onto the format's max,
    so no count is kept); under ``mx32`` the OCP floor rule lets a group's largest values
    saturate by up to 12.5 % (e4m3: the amax scaled into [256, 512) against a max of 448),
    as the MX spec allows; the round-up rule saturates none.
    """
    _check(x, granularity, fp8_dtype, transpose, scale, amax, scale_rule, preshuffled)
    out = quantize_checked(x, granularity, fp8_dtype, transpose=transpose, scale=scale, amax=amax,
                           scale_rule=scale_rule, preshuffled=preshuffled)
    return out[:-1] + (reduce_maxima(out[-1]),) if amax else out


def quantize_checked(x: torch.Tensor, granularity: str, fp8_dtype: torch.dtype, *,
                     transpose: bool = False, scale: torch.Tensor | None = None,
                     amax: bool = False, scale_rule: str = "ocp", preshuffled: bool = False,
                     direct: bool | None = None) -> tuple[torch.Tensor, ...]:
    """:func:`quantize` on arguments its caller validated at its own public entry (the FP8
    grouped GEMM's operands, :mod:`kernels.moe.grouped_gemm_fp8.quantize`, whose training op
    checks x and a given scale once per call; the FP8 recipes', :mod:`kernels.fp8.scaled_gemm`):
    the same op and custom op, no checks, and the same results but for ``amax=True``'s last: the
    cast's tile maxima themselves (float32 (ceil(M/128), ceil(K/128)), none for an empty x), not
    their max, so that delayed scaling's record reduces them in its own launch
    (:func:`kernels.fp8.history_ops.record`) where a torch reduction would be a device op more.
    ``direct``: :func:`kernels.eager.direct` of ``x`` where the caller knows it (an op's
    implementation, which runs eagerly: True), else (None) asked here."""
    if direct is None:
        direct = eager.direct(x)
    impl = _quantize_impl if direct else _quantize
    if scale is None:
        return tuple(impl(x, granularity, fp8_dtype, transpose, None, False, scale_rule, preshuffled))
    scale = scale if scale.dim() == 0 else scale.reshape(())
    q, *rest = impl(x, granularity, fp8_dtype, transpose, scale, amax)
    return ((q, scale, rest[0], scale) if transpose else (q, scale)) + tuple(rest[transpose:])
