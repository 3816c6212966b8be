"""v0 composed: S = Q Kᵀ through the GEMM ladder's kernel, a Triton row softmax, then P V.

Idea:
    Attention as the textbook writes it, one launch per step. For each (batch, head)
    the GEMM ladder's v2 kernel writes the raw scores S = Q Kᵀ (fp32, S x S_k) to HBM;
    one softmax launch reads every row, applies the scale and the causal mask and
    writes P in the input dtype; the v2 GEMM kernel then computes O = P V. GQA is a
    choice of which K/V head each query head's GEMMs read.

Why faster:
    It is the baseline of the ladder, not faster than anything: every score is
    written once and read once as S, written once and read once as P. That is
    O(B·Hq·S·S_k) bytes against O(B·H·S·D) for the inputs, so for S_k >> D the launch
    is bound by HBM, which the roofline shows.

Expected bound:
    Memory: the S and P round trips dominate; the GEMMs themselves are small per head
    and launched B·Hq times each.

Limits:
    Any S, S_k >= 1, D <= 128, any strides, fp32/fp16/bf16. Needs B·Hq·S·S_k·6 bytes
    of scratch (S in fp32, P in the input dtype). The softmax holds a whole key row in
    one program (S_k <= 65536). Under the CPU interpreter a bf16 QKᵀ is handed to the
    GEMM kernel as exact fp32 copies, the same upcast the kernels do per tile
    (``kernels/triton_support.py``), so that S stays fp32.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import backend as _backend
from .. import validate
from ..gemm.v2_triton_tile import _gemm_tile_kernel
from ..gemm.v2_triton_tile import config as gemm_config
from ..outputs import new_output
from ..registry import rung
from ..triton_support import aot_launch, cdiv, interp_bf16, round_to_bf16
from .launch import aot_ints
from .spec import DTYPES, MAX_HEAD_DIM

MAX_KEYS = 65536


@triton.jit
def _row_softmax_kernel(s_ptr, p_ptr, scale, S, SK, CAUSAL: tl.constexpr, BLOCK: tl.constexpr,
                        INTERP_BF16: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)       # over B·Hq·S rows of S_k scores
    cols = tl.arange(0, BLOCK)
    # exercise begin: softmax
    visible = cols < SK
    if CAUSAL:
        visible = visible & (cols <= row % S)   # SDPA: top-left aligned
    x = tl.load(s_ptr + row * SK + cols, mask=visible, other=0.0) * scale
    x = tl.where(visible, x, float("-inf"))   # masked after scaling: -inf · scale is NaN at 0, +inf below
    e = tl.exp(x - tl.max(x, 0))
    p = e / tl.sum(e, 0)
    # exercise end
    if INTERP_BF16:
        p = round_to_bf16(p)
    tl.store(p_ptr + row * SK + cols, p.to(p_ptr.dtype.element_ty), mask=cols < SK)


def _gemm(a, b, c, cfg):
    """c = a @ b (2-D views, any strides) with the GEMM ladder's v2 kernel."""
    (m, k), n = a.shape, b.shape[1]
    _gemm_tile_kernel[(cdiv(m, cfg["BLOCK_M"]), cdiv(n, cfg["BLOCK_N"]))](
        a, b, c, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0),
        c.stride(1), INTERP_BF16=interp_bf16(a.dtype), **cfg)


def aot(dtype: torch.dtype, backend: str, arch: str) -> list:
    ints = aot_ints()
    return [aot_launch(_row_softmax_kernel, dtype, dict(BLOCK=4096, num_warps=8),
                       dict(scale=ints["scale"], S=4096, SK=4096),
                       constexprs={"CAUSAL": True, "INTERP_BF16": False},
                       pointers={"s_ptr": "*fp32"})]


@rung(op="attention", rung=0, name="composed", backends=("hip", "cuda", "interpreter"),
      dtypes=DTYPES, interpreter=True, kind="triton", aot=aot, max_bench_flops=2e12)
def attention_v0(q, k, v, causal=False, scale=None):
    scale = validate.attention_operands(q, k, v, scale, DTYPES, MAX_HEAD_DIM)
    (b, hq, s, _), (hkv, sk) = q.shape, k.shape[1:3]
    if sk > MAX_KEYS:
        raise ValueError(f"k has S_k={sk} keys; v0's row softmax takes at most {MAX_KEYS}")
    cfg = gemm_config(_backend.current().name)
    scores = torch.empty((b, hq, s, sk), dtype=torch.float32, device=q.device)
    probs = torch.empty((b, hq, s, sk), dtype=q.dtype, device=q.device)
    o = new_output(q.shape, q.dtype, q.device)
    exact = torch.float32 if interp_bf16(q.dtype) else q.dtype   # see Limits
    for bi in range(b):
        for h in range(hq):
            _gemm(q[bi, h].to(exact), k[bi, h // (hq // hkv)].t().to(exact), scores[bi, h], cfg)
    _row_softmax_kernel[(b * hq * s,)](scores, probs, scale, s, sk, CAUSAL=bool(causal),
                                      BLOCK=triton.next_power_of_2(sk),
                                      INTERP_BF16=interp_bf16(q.dtype))
    for bi in range(b):
        for h in range(hq):
            _gemm(probs[bi, h], v[bi, h // (hq // hkv)], o[bi, h], cfg)
    return o
