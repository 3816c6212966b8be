"""blockwise: DeepSeek-V3's fine-grained recipe, 1x128 tiles for x and dy, 128x128 blocks for w.

Scales vary along K, so they cannot wait for the epilogue: the GEMM
(``kernels.gemm_fp8.blockwise_matmul``) multiplies each K block's partial product by its
scales on the fp32 accumulator. Per GEMM (DeepSeek-V3 technical report, section 3.3.2):

* forward ``x @ w.T``: x in 1x128 tiles along K, w in 128x128 blocks;
* dgrad ``dy @ w``: dy in 1x128 tiles along N; w's 128x128 blocks are the forward's,
  transposed (a square block is its own transpose's block);
* wgrad ``dy.T @ x``: both along M, the tokens: dy.T in 1x128 tiles and x in 128x1
  columns per 128-token block, the transposed copies ``quantize(..., transpose=True)``
  writes in the same pass.

e4m3 for every tensor, gradients included (DeepSeek-V3's choice). The kernels are
``kernels.gemm_fp8.quantize`` and ``blockwise_matmul``; :attr:`needs` names them while
they are not installed.
"""
from __future__ import annotations

from ... import gemm_fp8
from ..recipe import Recipe, register


class Blockwise(Recipe):
    name = "blockwise"
    summary = "1x128 tiles of x and dy, 128x128 blocks of w; scales applied per K block in the GEMM"
    kernels = ("quantize", "blockwise_matmul")
    grad_dtype_note = "e4m3 everywhere, gradients included (DeepSeek-V3)"

    def forward(self, x, w, fp8, out_dtype, scale_x=None, scale_w=None):
        x8, sx = gemm_fp8.quantize(x, "block1x128", fp8)
        w8, sw = gemm_fp8.quantize(w, "block128x128", fp8)          # sw: (N/128, K/128)
        return gemm_fp8.blockwise_matmul(x8, sx, w8.t(), sw.t(), out_dtype)

    def dgrad(self, dy, w, fp8, out_dtype, scale_w=None):
        dy8, sdy = gemm_fp8.quantize(dy, "block1x128", fp8)          # along N
        w8, sw = gemm_fp8.quantize(w, "block128x128", fp8)          # (N/128, K/128): B = w (N, K)
        return gemm_fp8.blockwise_matmul(dy8, sdy, w8, sw, out_dtype)

    def wgrad(self, dy, x, fp8, out_dtype, scale_x=None):
        *_, dyt8, sdyt = gemm_fp8.quantize(dy, "block1x128", fp8, transpose=True)   # (N, M), along M
        *_, xt8, sxt = gemm_fp8.quantize(x, "block1x128", fp8, transpose=True)      # (K, M), along M
        return gemm_fp8.blockwise_matmul(dyt8, sdyt, xt8.t(), sxt.t(), out_dtype)   # B scales (M/128, K)


register(Blockwise())
