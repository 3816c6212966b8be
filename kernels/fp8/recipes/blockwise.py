"""blockwise: DeepSeek-V3's fine-grained recipe, 1x128 tiles for x and dy, 128x128 blocks for w.

Scales vary along K, so they cannot wait for the epilogue: the GEMM
(``kernels.gemm_fp8.blockwise_matmul``) multiplies each K block's partial product by its
scales on the fp32 accumulator. Per GEMM (DeepSeek-V3 technical report, section 3.3.2):

* forward ``x @ w.T``: x in 1x128 tiles along K, w in 128x128 blocks;
* dgrad ``dy @ w``: dy in 1x128 tiles along N; w's 128x128 blocks are the forward's,
  transposed (a square block is its own transpose's block);
* wgrad ``dy.T @ x``: both along M, the tokens: dy.T in 1x128 tiles and x in 128x1
  columns per 128-token block, the transposed copies ``quantize(..., transpose=True)``
  writes in the same pass as the forward's (x) and dgrad's (dy) operands.

The forward keeps x.T's 1x128 tiles (M K bytes, scales 4 K ceil(M/128)) and w's 128x128
blocks (N K bytes, scales 4 ceil(N/128) ceil(K/128)) for the backward, which quantizes
only dy (one pass, both orientations).

Gradients in e4m3 by default (``grad_format``), as DeepSeek-V3 (e4m3 on all tensors:
a 1x128 tile's own scale covers its range) and Transformer Engine's ``Float8BlockScaling``;
``"hybrid"`` takes e5m2 dy. The kernels are ``kernels.gemm_fp8.quantize`` and
``blockwise_matmul``; :attr:`needs` names any of them an installation lacks.
"""
from __future__ import annotations

from ... import gemm_fp8
from ...gemm_fp8.quantize import quantize_checked   # x, w and dy checked (kernels.fp8.scaled_gemm says where)
from ..recipe import Recipe, Saved, register


class Blockwise(Recipe):
    name = "blockwise"
    summary = "1x128 tiles of x and dy, 128x128 blocks of w; scales applied per K block in the GEMM"
    kernels = ("quantize", "blockwise_matmul")
    grad_dtype_note = "e4m3 everywhere, gradients included (DeepSeek-V3)"
    saved_layout = ((True, "block1x128"), (False, "block128x128"))   # x.T along M, w's blocks
    operand_groups = {"forward": ("block1x128", "block128x128"), "dgrad": ("block1x128", "block128x128"),
                      "wgrad": ("block1x128", "block1x128")}

    def forward(self, x, w, fp8, out_dtype, scale_x=None, scale_w=None):
        # the op's implementation: runs eagerly (kernels.fp8.scaled_gemm)
        x8, sx, xt8, sxt = quantize_checked(x, "block1x128", fp8, transpose=True, direct=True)   # xt8: x.T along M
        w8, sw = quantize_checked(w, "block128x128", fp8, direct=True)          # sw: (N/128, K/128)
        y = gemm_fp8.blockwise_matmul(x8, sx, w8.t(), sw.t(), out_dtype)
        return y, Saved(xt8, sxt, w8, sw)

    def backward(self, dy, saved, grad_fp8, dx_dtype, dw_dtype, need_dx=True, need_dw=True):
        # not direct: a backward is traced under torch.compile (kernels.fp8.scaled_gemm)
        dy8, sdy, *dyt = quantize_checked(dy, "block1x128", grad_fp8, transpose=need_dw)   # along N, M
        # dgrad: B = w (N, K) in the forward's 128x128 blocks; wgrad: B = x (M, K) per 128x1 along M
        dx = gemm_fp8.blockwise_matmul(dy8, sdy, saved.w, saved.w_scale, dx_dtype) if need_dx else None
        dw = (gemm_fp8.blockwise_matmul(dyt[0], dyt[1], saved.x.t(), saved.x_scale.t(), dw_dtype)
              if need_dw else None)
        return dx, dw


register(Blockwise())
