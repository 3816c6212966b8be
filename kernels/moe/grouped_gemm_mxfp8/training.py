"""The ``"mxfp8"`` recipe of the FP8 grouped GEMM's training op: forward, dX and dW in MXFP8.

:func:`kernels.moe.grouped_gemm_fp8.grouped_gemm_fp8_train` with ``recipe="mxfp8"`` calls
:func:`forward` and :func:`gradients` (imported lazily there), so the training op, its
custom op ``kernels::grouped_gemm_fp8_train`` and ``Float8MoE`` are one for every recipe.
Per expert GEMM a step runs three grouped launches on operands quantized along each
GEMM's own reduction dimension (:mod:`.quantize`):

* forward: the MXFP8 grouped GEMM (``kernels::grouped_gemm_mxfp8``, its best rung);
* dx = dy @ w[g]ᵀ: the same kernel on w[g]ᵀ (a stride view of the dgrad copy of w);
* dw[g] = x_gᵀ · dy_g: :mod:`.dw` (``kernels::grouped_gemm_mxfp8_dw``) over each group's
  tokens padded to 32 (zero for an empty group).

Elements are OCP e4m3fn for the gradients too (MX has no fnuz form; e4m3 is Transformer
Engine's MXFP8 default for gradients as well, and the kernel takes one element format).
Every operand's e8m0 scales follow the e8m0 rule (``rule``: ``"round_up"`` or ``"ocp"``) the
layer was converted with, as the dense layers' do (:class:`kernels.fp8.recipes.mxfp8.MXFP8`:
round-up by default, so nothing saturates); the training op resolves it
(:func:`kernels.moe.grouped_gemm_fp8.training.grouped_gemm_fp8_train`'s ``scale_rule``).
"""
from __future__ import annotations

import torch

from . import dw as dw_kernel
from . import operands, quantize
from .ops import _grouped_gemm_mxfp8_impl


def tokens(x: torch.Tensor, fp8: torch.dtype, rule: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward's x (T, K) quantized by :func:`.quantize.tokens` with the e8m0 ``rule``
    (what the expert-parallel layer's senders dispatch, :mod:`kernels.moe.ep_fp8_layer`)."""
    return quantize.tokens(x, fp8, rule)


@torch.library.custom_op("kernels::grouped_gemm_mxfp8_dw", mutates_args=())
def _grouped_gemm_mxfp8_dw(xt: torch.Tensor, sxt: torch.Tensor, dyt: torch.Tensor, sdyt: torch.Tensor,
                           ends: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    if xt.numel() == 0 or dyt.numel() == 0 or ends.numel() == 0:
        return torch.zeros((ends.shape[0], xt.shape[0], dyt.shape[0]), dtype=out_dtype, device=xt.device)
    return dw_kernel.grouped_dw_mxfp8(xt, sxt, dyt, sdyt, ends.contiguous(), out_dtype)


@_grouped_gemm_mxfp8_dw.register_fake
def _(xt, sxt, dyt, sdyt, ends, out_dtype):
    return xt.new_empty((ends.shape[0], xt.shape[0], dyt.shape[0]), dtype=out_dtype)


def grouped_gemm_mxfp8_dw(xt: torch.Tensor, sxt: torch.Tensor, dyt: torch.Tensor, sdyt: torch.Tensor,
                          ends: torch.Tensor, out_dtype: torch.dtype = torch.float32, *,
                          check_ends: bool = True) -> torch.Tensor:
    """dw (G, K, N), dw[g] = dequant(xt[:, tokens of g]) @ dequant(dyt[:, tokens of g])ᵀ with fp32
    accumulation: the MXFP8 weight gradient of an expert GEMM (:mod:`.dw`).

    Operands as :func:`.quantize.wgrad_operand` writes them: float8_e4m3fn xt (K, R) and dyt
    (N, R), R a multiple of 32, uint8 e8m0 scales (K, R/32) and (N, R/32), int32 ``ends`` (G,)
    of padded group ends, multiples of 32 (:func:`.quantize.padded_ends`); group g's tokens are
    [ends[g-1], ends[g]). ``check_ends`` False skips the host read that validates them.
    """
    ends = operands.check_dw(xt, sxt, dyt, sdyt, ends, out_dtype)
    if check_ends:
        operands.check_ends(ends, xt.shape[1])
    return _grouped_gemm_mxfp8_dw(xt, sxt, dyt, sdyt, ends, out_dtype)


def forward(x8: torch.Tensor, sx: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor, fp8: torch.dtype,
            out_dtype: torch.dtype, rule: str) -> torch.Tensor:
    """``x_g @ w[g]`` in ``out_dtype`` of x quantized by :func:`.quantize.tokens`, w in MXFP8 along K
    by the e8m0 ``rule``."""
    w8, sw = quantize.forward_weight(w, fp8, rule)
    return _grouped_gemm_mxfp8_impl(x8, sx, w8, sw, offsets, out_dtype)


def gradients(x, w, offsets, dy, fp8: torch.dtype, needs, rule: str) -> tuple:
    """(dx, dw) of ``x_g @ w[g]`` for the output gradient dy, each None where ``needs`` says
    False: one MXFP8 grouped launch each, every operand by the e8m0 ``rule``."""
    dx = dw = None
    if needs[0]:
        dy8, sdy = quantize.tokens(dy, fp8, rule)
        wt8, swt = quantize.dgrad_weight(w, fp8, rule)
        dx = torch.ops.kernels.grouped_gemm_mxfp8(dy8, sdy, wt8, swt, offsets, x.dtype)
    if needs[1]:
        ends = quantize.padded_ends(offsets)
        xt8, sxt = quantize.wgrad_operand(x, offsets, ends, fp8, rule)
        dyt8, sdyt = quantize.wgrad_operand(dy, offsets, ends, fp8, rule)
        dw = torch.ops.kernels.grouped_gemm_mxfp8_dw(xt8, sxt, dyt8, sdyt, ends, w.dtype)
    return dx, dw
