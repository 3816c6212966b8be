"""What an MXFP8 grouped GEMM accepts, checked once for every rung, the public op and dW.

Forward: x (T, K) and w (G, K, N) in float8_e4m3fn, offsets as for ``grouped_gemm``, and
uint8 e8m0 scales, one per 32 elements along K: sx (T, ceil(K/32)), sw (G, N, ceil(K/32)).
dW: xt (K, R) and dyt (N, R) token-contiguous with each group's tokens padded to a
multiple of 32 (:mod:`.quantize`), their scales (K, R/32) and (N, R/32), and int32 padded
group ends (G,). A kernel reads every tensor through its strides, so views are taken as
they are.
"""
from __future__ import annotations

import torch

from ... import validate
from ...gemm_fp8.operands import OUT_DTYPES
from ...microscaling import BLOCK
from .spec import DTYPES


def _scales(name: str, scales, shape: tuple[int, ...], what: str) -> None:
    validate.tensor(name, scales, dtypes=(torch.uint8,), allow_empty=True)
    if tuple(scales.shape) != shape:
        raise ValueError(f"{name} has shape {tuple(scales.shape)}; expected {shape}, one e8m0 scale "
                         f"per {BLOCK} elements {what}")


def out_dtype(dtype) -> None:
    if dtype not in OUT_DTYPES:
        allowed = ", ".join(str(d).replace("torch.", "") for d in OUT_DTYPES)
        raise TypeError(f"out_dtype must be one of {allowed}, got {dtype}")


def check(x, sx, w, sw, offsets, out, allow_empty: bool = False, check_values: bool = True) -> torch.Tensor:
    """Validate the forward's operands; return the offsets to launch with (packed);
    ``allow_empty`` and ``check_values`` as in :func:`kernels.validate.grouped_gemm_operands`."""
    validate.tensor("x", x, ndim=2, dtypes=DTYPES, allow_empty=allow_empty)
    validate.tensor("w", w, ndim=3, dtypes=DTYPES, allow_empty=allow_empty)
    offsets = validate.grouped_gemm_operands(x, w, offsets, DTYPES, allow_empty, check_values)
    (t, k), (g, _, n) = x.shape, w.shape
    blocks = -(-k // BLOCK)
    _scales("sx", sx, (t, blocks), "of a row of x along K")
    _scales("sw", sw, (g, n, blocks), "of a column of each w[g] along K")
    validate.same_device(x=x, sx=sx, w=w, sw=sw)
    out_dtype(out)
    return offsets


def check_dw(xt, sxt, dyt, sdyt, ends, out) -> torch.Tensor:
    """Validate dW's operands (see the module docstring); return the ends packed."""
    validate.tensor("xt", xt, ndim=2, dtypes=DTYPES, allow_empty=True)
    validate.tensor("dyt", dyt, ndim=2, dtypes=DTYPES, allow_empty=True)
    ends = validate.index("ends", ends, ndim=1, dtypes=(torch.int32,))
    (k, r), (n, r_dy) = xt.shape, dyt.shape
    if r != r_dy or r % BLOCK:
        raise ValueError(f"xt is {tuple(xt.shape)} (K, tokens) and dyt {tuple(dyt.shape)} (N, tokens): "
                         f"both need one token count, a multiple of {BLOCK}")
    _scales("sxt", sxt, (k, r // BLOCK), "of a row of xt along the tokens")
    _scales("sdyt", sdyt, (n, r // BLOCK), "of a row of dyt along the tokens")
    validate.same_device(xt=xt, sxt=sxt, dyt=dyt, sdyt=sdyt, ends=ends)
    out_dtype(out)
    return ends


def check_ends(ends: torch.Tensor, tokens: int) -> None:
    """Read the padded group ends on the host (one sync) and refuse ends that decrease, pass
    ``tokens`` or are not multiples of 32 (a 32-token MX block must not straddle groups)."""
    values = ends.tolist()
    if values != sorted(values) or any(v < 0 or v > tokens or v % BLOCK for v in values):
        raise ValueError(f"ends must be non-decreasing multiples of {BLOCK} in [0, {tokens}] (each group's "
                         f"tokens padded to whole {BLOCK}-token MX blocks), got {values[:16]}")
