"""v2 flash_forward: K/V tiles streamed past a resident Q block with an online softmax.

Idea:
    One program owns BLOCK_M query rows of one head and keeps them in registers. It
    walks the keys BLOCK_N at a time: S_tile = Q Kᵀ (``tl.dot``, fp32 accumulate), then
    the online softmax: a running row max m and row sum l, so each new tile rescales
    what was accumulated so far by exp(m_old - m_new) instead of needing the whole row
    first. P_tile V is added to an fp32 accumulator; O = acc / l at the end. S and P
    never leave the registers. GQA costs nothing: query head h reads K/V head
    h // (Hq / Hkv).

Why faster:
    Traffic falls from O(S·S_k) (v0, v1 write and read the scores) to reading Q, K, V
    and writing O, with K/V re-read once per query block from L2. Both products run on
    the matrix cores, and the tiles are the same size whatever S_k is, so any length
    fits and the kernel turns compute-bound for long sequences.

Expected bound:
    Compute for long sequences, but below the matrix-core peak: causal masking is
    applied to every tile (the fully masked half is still computed), and with one
    pipeline stage each tile's loads are waited for before its products.

Limits:
    Any S, S_k >= 1, D <= 128 (padded to a power of two, masked), any strides, fp32
    (IEEE dot), fp16 and bf16 with fp32 statistics. Offsets are int64. Forward only;
    the log-sum-exp that a backward needs is not kept (v3 keeps it).
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


@triton.jit
def _flash_fwd_kernel(q_ptr, k_ptr, v_ptr, o_ptr, scale, S, SK, D, GROUP, HQ,
                      stride_qb, stride_qh, stride_qs, stride_qd,
                      stride_kb, stride_kh, stride_ks, stride_kd,
                      stride_vb, stride_vh, stride_vs, stride_vd,
                      stride_ob, stride_oh, stride_os, stride_od,
                      CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_D: tl.constexpr, INTERP_BF16: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // HQ).to(tl.int64)
    h = (bh % HQ).to(tl.int64)
    hk = h // GROUP                      # GQA: the K/V head this query head reads
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    ds = tl.arange(0, BLOCK_D)
    ns = tl.arange(0, BLOCK_N)
    q_ptrs = (q_ptr + b * stride_qb + h * stride_qh + rows.to(tl.int64)[:, None] * stride_qs
              + ds.to(tl.int64)[None, :] * stride_qd)
    q = tl.load(q_ptrs, mask=(rows[:, None] < S) & (ds[None, :] < D), other=0.0)
    if INTERP_BF16:
        q = q.to(tl.float32)
    kt_ptrs = (k_ptr + b * stride_kb + hk * stride_kh + ns.to(tl.int64)[None, :] * stride_ks
               + ds.to(tl.int64)[:, None] * stride_kd)          # Kᵀ tile: (BLOCK_D, BLOCK_N)
    v_ptrs = (v_ptr + b * stride_vb + hk * stride_vh + ns.to(tl.int64)[:, None] * stride_vs
              + ds.to(tl.int64)[None, :] * stride_vd)
    k_step = tl.cast(stride_ks, tl.int64) * BLOCK_N
    v_step = tl.cast(stride_vs, tl.int64) * BLOCK_N
    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    for n0 in range(0, SK, BLOCK_N):
        cols = n0 + ns
        kt = tl.load(kt_ptrs, mask=(ds[:, None] < D) & (cols[None, :] < SK), other=0.0)
        if INTERP_BF16:
            kt = kt.to(tl.float32)
        s = tl.dot(q, kt, input_precision="ieee") * scale
        last = tl.full((BLOCK_M,), SK - 1, tl.int32)   # each row's last visible key
        if CAUSAL:
            last = tl.minimum(last, rows)   # SDPA: top-left aligned
        s = tl.where(cols[None, :] <= last[:, None], s, float("-inf"))
        # exercise begin: rescale
        m_new = tl.maximum(m_i, tl.max(s, 1))   # finite: key 0 is visible to every row
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        # exercise end
        v = tl.load(v_ptrs, mask=(cols[:, None] < SK) & (ds[None, :] < D), other=0.0)
        if INTERP_BF16:
            v = v.to(tl.float32)
            p = round_to_bf16(p)
        # exercise begin: accumulate
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision="ieee")
        m_i = m_new
        # exercise end
        kt_ptrs += k_step
        v_ptrs += v_step
    acc = acc / l_i[:, None]
    if INTERP_BF16:
        acc = round_to_bf16(acc)
    o_ptrs = (o_ptr + b * stride_ob + h * stride_oh + rows.to(tl.int64)[:, None] * stride_os
              + ds.to(tl.int64)[None, :] * stride_od)
    tl.store(o_ptrs, acc.to(o_ptr.dtype.element_ty), mask=(rows[:, None] < S) & (ds[None, :] < D))


def config(backend: str, d: int) -> dict:
    """Tiles per backend: 64x64 for the matrix cores, 32x32 for the slow interpreter (fewer programs)."""
    if backend == "interpreter":
        return dict(BLOCK_M=32, BLOCK_N=32, BLOCK_D=head_block(d), num_warps=4, num_stages=1)
    return dict(BLOCK_M=64, BLOCK_N=64, BLOCK_D=head_block(d), num_warps=4, num_stages=1)


def aot(dtype: torch.dtype, backend: str, arch: str) -> list:
    return [aot_launch(_flash_fwd_kernel, dtype, config(backend, 128), aot_ints(),
                       constexprs={"CAUSAL": True, "INTERP_BF16": False})]


@rung(op="attention", rung=2, name="flash_forward", backends=("hip", "cuda", "interpreter"),
      dtypes=DTYPES, interpreter=True, kind="triton", aot=aot)
def attention_v2(q, k, v, causal=False, scale=None):
    scale = validate.attention_operands(q, k, v, scale, DTYPES, MAX_HEAD_DIM)
    (b, hq, s, d), (hkv, sk) = q.shape, k.shape[1:3]
    o = new_output(q.shape, q.dtype, q.device)
    cfg = config(_backend.current().name, d)
    grid = (cdiv(s, cfg["BLOCK_M"]), b * hq)
    _flash_fwd_kernel[grid](q, k, v, o, scale, s, sk, d, hq // hkv, hq,
                            *strides(q), *strides(k), *strides(v), *strides(o),
                            CAUSAL=bool(causal), INTERP_BF16=interp_bf16(q.dtype), **cfg)
    return o
