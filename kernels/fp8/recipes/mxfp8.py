"""mxfp8: OCP microscaling, e4m3 elements with one e8m0 (power-of-two) scale per 32 along K.

Native on gfx950 (``tl.dot_scaled`` -> ``v_mfma_scale_f32_*_f8f6f4``) and Blackwell;
emulated elsewhere. Every GEMM quantizes both operands in groups of 32 along its own
reduction dimension, so each tensor needs one copy per orientation (x along K for the
forward and along M for wgrad; dy along N for dgrad and along M for wgrad; w along K
and along N): what ``quantize(..., transpose=True)`` writes in one pass. The forward
keeps x.T and w.T grouped along M and N (M K + N K bytes, one e8m0 byte per 32 of each)
for the backward, which quantizes only dy (one pass, both orientations). Gradients in
e4m3 (``grad_format``; see ``grad_dtype_note``). The kernels
are ``kernels.gemm_fp8.quantize(..., "mx32")`` and ``mx_matmul``; :attr:`needs` names
any of them an installation lacks. ``mx_matmul``'s B operand is passed as ``(K, N)``
with its scales as :func:`quantize` returns them for B's rows-as-groups layout
(``(N, K/32)``), the convention of ``kernels.matmul_mxfp4``. Where ``mx_matmul`` reads
pre-shuffled scales as they are (gfx950, and the interpreter that checks it), every quantize
writes its scales pre-shuffled (:func:`_preshuffled`, ``quantize(..., preshuffled=True)``),
so the GEMMs load no scale byte on its own and no shuffle runs between the quantize and its
GEMM (at K = 128 those were 12 of the backward's 16 device ops, measured at 679051d; now none,
``tests/test_host_overhead_fp8.py``). The forward asks the backend; the backward writes dy's scales
in the layout the forward saved x's and w's in, which their shape says
(:func:`kernels.gemm_mxfp4.operands.is_preshuffled`), so each of its GEMMs gets both operands'
scales in one layout and the backend is asked once per step.
The forward saves them so too: (ceil(K/32), 256 ceil(M/256)) bytes for x.T and likewise for
w.T, M K/32 + N K/32 where K is a multiple of 32 and M and N of 256, more where a partial
32-row stripe or 8-scale chunk is padded with zeros (at most 31 rows and 7 scales a row;
:meth:`MXFP8.saved_like`).

Scale rule: round-up by default (``"round_up"``, :func:`kernels.microscaling.round_up_exponent`),
not the OCP spec's floor rule. The floor rule, ``floor(log2 amax) - 8``, puts a block's largest
|x| in [256, 512) while e4m3fn stops at 448, so every block whose largest mantissa is above
1.75 saturates, and the forward GEMM's error on the accuracy report's tensors
(:mod:`workbench.harness.fp8_accuracy`) is larger than under rounding up (``tests/test_fp8_accuracy.py``
checks both). Rounding the scale up, to the smallest power of two with ``amax / scale <= 448``,
gives the floor rule's scale to every other block and twice it to those: nothing saturates
(0 overflows on the report's tensors, tested), for one binade
less of range in the blocks it moves (their smallest elements lose a bit, or reach the
subnormals sooner). It is what training stacks take (Transformer
Engine's MXFP8 recipe; torchao's ``ScaleCalculationMode.RCEIL``). Both rules give valid MX
data (the scale is an e8m0 byte either way), so the GEMMs do not change. Chosen per
conversion: ``kernels.fp8.convert(model, "mxfp8", scale_rule="ocp")`` for the spec's rule; the
converted layers keep it, the Linears and the MoE layers' MXFP8 operands alike
(:mod:`kernels.moe.grouped_gemm_mxfp8.training`), and quantize by ``get("mxfp8", rule)``, this
recipe's instance for that rule (:func:`kernels.fp8.recipe.get`), so models converted with
different rules coexist in one process.
"""
from __future__ import annotations

import torch

from ... import backend as _backend
from ... import gemm_fp8
from ...gemm_fp8.quantize import quantize_checked   # x, w and dy checked (kernels.fp8.scaled_gemm says where)
from ...gemm_mxfp4.launch import takes_preshuffled
from ...gemm_mxfp4.operands import is_preshuffled
from ...mx_preshuffle import preshuffled_shape
from ..recipe import Recipe, Saved, register


def _preshuffled() -> bool:
    """Whether ``mx_matmul`` reads pre-shuffled scales as they are on this backend
    (:func:`~kernels.gemm_mxfp4.launch.takes_preshuffled`), so the quantize writes them so;
    row-major elsewhere. Same bytes, same results (``tests/test_mx_preshuffle.py``)."""
    here = _backend.current()
    return takes_preshuffled(here.name, here.arch)


class MXFP8(Recipe):
    name = "mxfp8"
    summary = ("e4m3 with an e8m0 scale per 32 elements along each GEMM's reduction dim, "
               "rounded up so that nothing saturates")
    kernels = ("quantize", "mx_matmul")
    grad_formats = ("e4m3",)
    saved_layout = ((True, "mx32"), (True, "mx32"))   # x.T along M, w.T along N
    operand_groups = dict.fromkeys(("forward", "dgrad", "wgrad"), ("mx32", "mx32"))
    grad_dtype_note = ("e4m3 for gradients too: a group of 32 has its own scale (Transformer Engine's "
                        "MXFP8BlockScaling default), and mx_matmul takes one element format for A and B")
    scale_rules = ("round_up", "ocp")   # the default first: the module docstring says why

    def element_format(self, fp8=None):
        """OCP float8_e4m3fn on every GPU, gfx942 included: MX defines no fnuz form, and the
        recipe takes e4m3 only (another format asked for is refused, before any layer is built)."""
        if fp8 not in (None, torch.float8_e4m3fn):
            raise TypeError(f"the mxfp8 recipe's elements are float8_e4m3fn (OCP MX has no fnuz form, "
                            f"and the recipe takes e4m3 only), got {fp8}")
        return torch.float8_e4m3fn

    def saved_like(self, x, w, fp8):
        """The base layout's, with the scales pre-shuffled where the forward writes them so."""
        saved = super().saved_like(x, w, fp8)
        if not _preshuffled():
            return saved
        x_scale, w_scale = (s.new_empty(preshuffled_shape(*s.shape)) for s in (saved.x_scale, saved.w_scale))
        return saved._replace(x_scale=x_scale, w_scale=w_scale)

    def forward(self, x, w, fp8, out_dtype, scale_x=None, scale_w=None):
        # the op's implementation: runs eagerly (kernels.fp8.scaled_gemm)
        mx = dict(transpose=True, scale_rule=self.scale_rule, preshuffled=_preshuffled(), direct=True)
        x8, sx, xt8, sxt = quantize_checked(x, "mx32", fp8, **mx)   # xt8: x.T along M
        w8, sw, wt8, swt = quantize_checked(w, "mx32", fp8, **mx)   # wt8: w.T along N
        y = gemm_fp8.mx_matmul(x8, sx, w8.t(), sw, out_dtype)
        return y, Saved(xt8, sxt, wt8, swt)

    def backward(self, dy, saved, grad_fp8, dx_dtype, dw_dtype, need_dx=True, need_dw=True):
        # not direct: a backward is traced under torch.compile (kernels.fp8.scaled_gemm); the scales
        # in the forward's layout: w.T's (K, N) grouped along N, as dy's along N
        dy8, sdy, *dyt = quantize_checked(dy, "mx32", grad_fp8, transpose=need_dw, scale_rule=self.scale_rule,
                                          preshuffled=is_preshuffled(saved.w_scale, *saved.w.shape))   # along N, M
        # mx_matmul(a (M, R), its scales, b_t (N, R).T, its scales): both grouped by 32 along R
        dx = gemm_fp8.mx_matmul(dy8, sdy, saved.w.t(), saved.w_scale, dx_dtype) if need_dx else None
        dw = gemm_fp8.mx_matmul(dyt[0], dyt[1], saved.x.t(), saved.x_scale, dw_dtype) if need_dw else None
        return dx, dw


register(MXFP8())
