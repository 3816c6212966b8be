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
from . import quantize_kernel
from .quantize_ref import GRANULARITIES, MX_DTYPES, QUANT_DTYPES, scale_shape

X_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def check_scale(name: str, scale: torch.Tensor, x: torch.Tensor) -> None:
    """A given per-tensor scale: float32, one number, on x's device."""
    validate.tensor(name, scale, dtypes=(torch.float32,))
    if scale.numel() != 1:
        raise ValueError(f"{name} must hold one number (a per-tensor scale), got shape {tuple(scale.shape)}")
    validate.same_device(x=x, **{name: scale})


def _check(x, granularity, fp8_dtype, transpose, scale):
    validate.tensor("x", x, ndim=2, dtypes=X_DTYPES, allow_empty=True)
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity must be one of {GRANULARITIES}, got {granularity!r}")
    if scale is not None:
        if granularity != "tensor":
            raise ValueError(f"a given scale is one per tensor: granularity 'tensor', got {granularity!r}")
        check_scale("scale", scale, x)
    allowed = MX_DTYPES if granularity == "mx32" else QUANT_DTYPES
    if fp8_dtype not in allowed:
        names = ", ".join(str(d).removeprefix("torch.") for d in allowed)
        why = " (MXFP8 is defined on the OCP formats)" if granularity == "mx32" else ""
        raise TypeError(f"fp8_dtype for granularity {granularity!r} must be one of {names}{why}, "
                        f"got {fp8_dtype}")
    if not isinstance(transpose, bool):
        raise TypeError(f"transpose must be a bool, got {type(transpose).__name__}")


def _quantize_impl(x: torch.Tensor, granularity: str, fp8_dtype: torch.dtype,
                   transpose: bool, scale: torch.Tensor | None = None) -> list[torch.Tensor]:
    return list(quantize_kernel.launch(x, granularity, fp8_dtype, transpose, scale))


_quantize = torch.library.custom_op("kernels::quantize_fp8", _quantize_impl, mutates_args=())


@_quantize.register_fake
def _(x, granularity, fp8_dtype, transpose, scale=None):
    m, k = x.shape
    scale_dtype = torch.uint8 if granularity == "mx32" else torch.float32
    given = scale is not None   # then the op returns no scales
    out = [x.new_empty((m, k), dtype=fp8_dtype)]
    out += [] if given else [x.new_empty(scale_shape(granularity, m, k), dtype=scale_dtype)]
    if transpose:
        out += [x.new_empty((k, m), dtype=fp8_dtype)]
        out += [] if given else [x.new_empty(scale_shape(granularity, k, m), dtype=scale_dtype)]
    return out


def quantize(x: torch.Tensor, granularity: str, fp8_dtype: torch.dtype, *,
             transpose: bool = False, scale: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
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
    ``mx32`` follows the OCP MX rule (:mod:`.quantize_ref`; an all-zero group gets byte 0).
    ``tensor`` and ``row`` read x twice (an amax pass, then the cast: no element can be cast
    before its group's amax is known); the block granularities and ``mx32`` read it once.
    The result is bit-identical to :func:`.quantize_ref.quantize_reference`.

    ``scale`` (``tensor`` only; float32, one number): a per-tensor scale given by the caller
    (delayed scaling's, from an amax history), cast with as it is: no amax pass, x read
    once, values beyond its range saturate at +-max, as
    :func:`kernels.gemm_fp8.quantize_fp8` with ``scale=`` (bit for bit); it is returned,
    as it came if 0-d, as scale and scale_t.

    Saturation: none under the fp32 scales (each group's amax maps onto the format's max,
    so no count is kept); under ``mx32`` the floor rule lets a group's largest values
    saturate by up to 12.5 % (e4m3: the amax scaled into [256, 512) against a max of 448),
    as the MX spec allows.
    """
    _check(x, granularity, fp8_dtype, transpose, scale)
    impl = _quantize_impl if eager.direct(x) else _quantize
    if scale is None:
        return tuple(impl(x, granularity, fp8_dtype, transpose))
    scale = scale if scale.dim() == 0 else scale.reshape(())
    q, *q_t = impl(x, granularity, fp8_dtype, transpose, scale)
    return (q, scale, q_t[0], scale) if transpose else (q, scale)
