"""v1 fused_rows: one program per row block computes QKᵀ, softmax and PV in registers.

Idea:
    Fuse v0's three launches. A program takes BLOCK_M query rows of one head, loads
    the whole of that head's K (padded to a power of two) and computes the full
    BLOCK_M x S_k score block with one ``tl.dot``, takes an exact softmax across it
    (max, exp, sum), and multiplies by the whole of V. S and P exist only in the
    program's registers; nothing but O is written.

Why faster:
    No S or P round trip through HBM and one launch instead of 2·B·Hq + 1. But the
    score block is still materialized, all S_k columns of it at once, so the tile
    grows with the sequence: K and V are re-read for every row block (O(S·S_k·D/BLOCK_M)
    traffic), and the registers spill: at D = 128 already for S_k = 256 on gfx942
    (gfx950 still holds that row, in 188 VGPRs; ``tests/test_attention_isa.py``).

Expected bound:
    Memory: K/V re-reads, and scratch traffic from the spills: the motivation for
    v2's streamed tiles.

Limits:
    S_k <= 4096 (the whole key row in one program; larger is a clear ValueError),
    any S >= 1, D <= 128, any strides, fp32/fp16/bf16, int64 offsets.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import backend as _backend
from .. import validate
from ..outputs import new_output
from ..registry import rung
from ..triton_support import aot_launch, cdiv, interp_bf16, round_to_bf16
from .launch import aot_ints, head_block, strides
from .spec import DTYPES, MAX_HEAD_DIM

MAX_KEYS = 4096


@triton.jit
def _fused_rows_kernel(q_ptr, k_ptr, v_ptr, o_ptr, scale, S, SK, D, GROUP, HQ,
                       stride_qb, stride_qh, stride_qs, stride_qd,
                       stride_kb, stride_kh, stride_ks, stride_kd,
                       stride_vb, stride_vh, stride_vs, stride_vd,
                       stride_ob, stride_oh, stride_os, stride_od,
                       CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_SK: tl.constexpr,
                       BLOCK_D: tl.constexpr, INTERP_BF16: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // HQ).to(tl.int64)
    h = (bh % HQ).to(tl.int64)
    hk = h // GROUP
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_SK)
    ds = tl.arange(0, BLOCK_D)
    q = tl.load(q_ptr + b * stride_qb + h * stride_qh + rows.to(tl.int64)[:, None] * stride_qs
                + ds.to(tl.int64)[None, :] * stride_qd,
                mask=(rows[:, None] < S) & (ds[None, :] < D), other=0.0)
    kt = tl.load(k_ptr + b * stride_kb + hk * stride_kh + cols.to(tl.int64)[None, :] * stride_ks
                 + ds.to(tl.int64)[:, None] * stride_kd,
                 mask=(ds[:, None] < D) & (cols[None, :] < SK), other=0.0)
    v = tl.load(v_ptr + b * stride_vb + hk * stride_vh + cols.to(tl.int64)[:, None] * stride_vs
                + ds.to(tl.int64)[None, :] * stride_vd,
                mask=(cols[:, None] < SK) & (ds[None, :] < D), other=0.0)
    if INTERP_BF16:
        q = q.to(tl.float32)
        kt = kt.to(tl.float32)
        v = v.to(tl.float32)
    # exercise begin: fused
    s = tl.dot(q, kt, input_precision="ieee") * scale      # the whole score block
    visible = cols[None, :] < SK
    if CAUSAL:
        visible = visible & (cols[None, :] <= rows[:, None])   # SDPA: top-left aligned
    s = tl.where(visible, s, float("-inf"))
    e = tl.exp(s - tl.max(s, 1)[:, None])
    p = e / tl.sum(e, 1)[:, None]
    # exercise end
    if INTERP_BF16:
        p = round_to_bf16(p)
    acc = tl.dot(p.to(v.dtype), v, input_precision="ieee")
    if INTERP_BF16:
        acc = round_to_bf16(acc)
    tl.store(o_ptr + b * stride_ob + h * stride_oh + rows.to(tl.int64)[:, None] * stride_os
             + ds.to(tl.int64)[None, :] * stride_od, acc.to(o_ptr.dtype.element_ty),
             mask=(rows[:, None] < S) & (ds[None, :] < D))


def config(backend: str, d: int, sk: int) -> dict:
    """A 16-row block (the least ``tl.dot`` takes): the key row is the big dimension."""
    return dict(BLOCK_M=16, BLOCK_SK=max(16, triton.next_power_of_2(sk)), BLOCK_D=head_block(d),
                num_warps=4 if backend == "interpreter" else 8, num_stages=1)


def aot(dtype: torch.dtype, backend: str, arch: str) -> list:
    """Shown at S = S_k = 256: a longer key row takes the compiler minutes (and spills)."""
    return [aot_launch(_fused_rows_kernel, dtype, config(backend, 128, 256),
                       aot_ints(s=256, sk=256), constexprs={"CAUSAL": True, "INTERP_BF16": False})]


@rung(op="attention", rung=1, name="fused_rows", backends=("hip", "cuda", "interpreter"),
      dtypes=DTYPES, interpreter=True, kind="triton", aot=aot, max_bench_flops=2e12)
def attention_v1(q, k, v, causal=False, scale=None):
    scale = validate.attention_operands(q, k, v, scale, DTYPES, MAX_HEAD_DIM)
    (b, hq, s, d), (hkv, sk) = q.shape, k.shape[1:3]
    if sk > MAX_KEYS:
        raise ValueError(f"k has S_k={sk} keys; v1 holds a whole key row and takes at most {MAX_KEYS}")
    o = new_output(q.shape, q.dtype, q.device)
    cfg = config(_backend.current().name, d, sk)
    grid = (cdiv(s, cfg["BLOCK_M"]), b * hq)
    _fused_rows_kernel[grid](q, k, v, o, scale, s, sk, d, hq // hkv, hq,
                             *strides(q), *strides(k), *strides(v), *strides(o),
                             CAUSAL=bool(causal), INTERP_BF16=interp_bf16(q.dtype), **cfg)
    return o
