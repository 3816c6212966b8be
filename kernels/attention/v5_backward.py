"""v5 backward: dQ, dK, dV recomputed from the saved log-sum-exp (FlashAttention-2 style).

Idea:
    The forward (v3's kernel) keeps only O and the row log-sum-exp as m, the max of
    sign(scale)·S, and log2 l, so P is recomputed tile by tile as
    exp2((sign·S - m)·|scale|·log2 e - log2 l): S - m is taken before scaling, as in
    the forward, so large scores lose no precision, if each score is recomputed as
    the forward rounded it. One that rounds differently by δ makes its P off by a
    factor 2^(δ·|scale|·log2 e), where SDPA's P of a row's max is exactly 1/l; at
    large scores dV then misses the harness rule. So both launches multiply Q Kᵀ as
    the forward does, and the dK/dV launch, too, holds P and dS as (query rows, keys),
    transposing them only as operands of dV and dK, rather than computing Sᵀ = K Qᵀ.
    On the interpreter v3, v4 and v5 use the same 32 x 32 tiles and the recomputed
    scores are the forward's bit for bit (``tests/test_attention_ladder.py`` checks dV
    with OpenBLAS's Haswell kernel, whose K Qᵀ and Q Kᵀ round differently). On a GPU,
    v4 tunes the forward's tiles and MFMA shape apart from the backward's: whether a
    score rounds alike there is not measured. With dP = dO Vᵀ and the softmax
    gradient dS = P ∘ (dP - Δ), where Δ = rowsum(dO ∘ O) (a preprocess launch; it
    equals rowsum(P ∘ dP)), the gradients are dV = Pᵀ dO, dK = scale · dSᵀ Q and
    dQ = scale · dS K. Two main launches so that no two programs write the same
    element: one program per key block accumulates dK and dV over every query block
    *and every query head of its GQA group* (the group sum happens in registers), one
    program per query block accumulates dQ over the key blocks. No atomics, so the result is deterministic, run to run.

Why faster:
    Than autograd through v0/v1: no S x S_k matrix is stored or read back; each launch
    streams tiles as the forward does. A (query block, key block) pair costs seven
    ``tl.dot`` products over the two launches (dK/dV: S, dP, dV, dK; dQ: S, dP, dQ):
    S and dP are computed twice, FA2's price for avoiding atomics. Causal programs
    skip the blocks the mask hides, as v3 does.

Expected bound:
    Compute; about 3.5x the forward's matrix work (seven products against two).
    Untuned tiles, one stage.

Limits:
    As v3 (any S, S_k >= 1, D <= 128, any strides including the stride-0 output
    gradient of ``out.sum().backward()``, fp32/fp16/bf16 with fp32 accumulation,
    int64 offsets). dQ/dK/dV are in the inputs' dtypes. Packed sequences run the three
    kernels with ``VARLEN=True`` as v3's forward does: one launch each for the batch,
    the dense code unchanged; a sequence without queries gets dK = dV = 0 for its keys.
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
from . import v3_causal_lse
from .launch import aot_ints, head_block, scale_sign, strides
from .varlen import Packing, aot_args, cu_args, sequence
from .spec import DTYPES, MAX_HEAD_DIM


@triton.jit
def _bwd_delta_kernel(o_ptr, do_ptr, delta_ptr, cu_q_ptr, S, D, HQ,
                      stride_ob, stride_oh, stride_os, stride_od,
                      stride_dob, stride_doh, stride_dos, stride_dod,
                      VARLEN: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // HQ).to(tl.int64)
    h = (bh % HQ).to(tl.int64)
    T = S                                # rows of the Δ buffer
    if VARLEN:   # as in v3's kernel: b is a packed sequence, S the token count
        q0, S = sequence(cu_q_ptr, b)
        if pid_m * BLOCK_M >= S:
            return
        o_ptr += q0.to(tl.int64) * stride_os
        do_ptr += q0.to(tl.int64) * stride_dos
        delta_ptr += q0
        bh = h                           # Δ is (1, Hq, T)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    ds = tl.arange(0, BLOCK_D)
    mask = (rows[:, None] < S) & (ds[None, :] < D)
    o = tl.load(o_ptr + b * stride_ob + h * stride_oh + rows.to(tl.int64)[:, None] * stride_os
                + ds.to(tl.int64)[None, :] * stride_od, mask=mask, other=0.0)
    do = tl.load(do_ptr + b * stride_dob + h * stride_doh + rows.to(tl.int64)[:, None] * stride_dos
                 + ds.to(tl.int64)[None, :] * stride_dod, mask=mask, other=0.0)
    # exercise begin: delta
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    # exercise end
    tl.store(delta_ptr + bh.to(tl.int64) * T + rows, delta, mask=rows < S)


@triton.jit
def _bwd_dkdv_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr,
                     cu_q_ptr, cu_k_ptr, scale, S, SK, D, GROUP, HQ, HKV,
                     stride_qb, stride_qh, stride_qs, stride_qd,
                     stride_kb, stride_kh, stride_ks, stride_kd,
                     stride_vb, stride_vh, stride_vs, stride_vd,
                     stride_dob, stride_doh, stride_dos, stride_dod,
                     stride_dkb, stride_dkh, stride_dks, stride_dkd,
                     stride_dvb, stride_dvh, stride_dvs, stride_dvd,
                     CAUSAL: tl.constexpr, VARLEN: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, INTERP_BF16: tl.constexpr,
                     SCALE_SIGN: tl.constexpr = 1):
    pid_n = tl.program_id(0)
    bhk = tl.program_id(1)
    b = (bhk // HKV).to(tl.int64)
    hk = (bhk % HKV).to(tl.int64)
    T = S                                # rows of the LSE and Δ buffers
    b_stats = b                          # their batch index
    if VARLEN:   # as in v3's kernel: b is a packed sequence, S and SK the token counts
        q0, S = sequence(cu_q_ptr, b)
        k0, SK = sequence(cu_k_ptr, b)
        if pid_n * BLOCK_N >= SK:        # keys of a sequence without queries still get dK = dV = 0
            return
        q_ptr += q0.to(tl.int64) * stride_qs
        do_ptr += q0.to(tl.int64) * stride_dos
        k_ptr += k0.to(tl.int64) * stride_ks
        v_ptr += k0.to(tl.int64) * stride_vs
        dk_ptr += k0.to(tl.int64) * stride_dks
        dv_ptr += k0.to(tl.int64) * stride_dvs
        lse_ptr += q0
        delta_ptr += q0
        b_stats = 0                      # LSE (1, Hq, 2, T), Δ (1, Hq, T)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ds = tl.arange(0, BLOCK_D)
    ms = tl.arange(0, BLOCK_M)
    if SCALE_SIGN == 0:                  # as in v3's forward
        qk_scale = 1.4426950408889634
    else:
        qk_scale = scale * SCALE_SIGN * 1.4426950408889634
    kv_mask = (cols[:, None] < SK) & (ds[None, :] < D)
    kt = tl.load(k_ptr + b * stride_kb + hk * stride_kh + cols.to(tl.int64)[None, :] * stride_ks
                 + ds.to(tl.int64)[:, None] * stride_kd,
                 mask=(ds[:, None] < D) & (cols[None, :] < SK), other=0.0)   # Kᵀ: (D, N)
    vt = tl.load(v_ptr + b * stride_vb + hk * stride_vh + cols.to(tl.int64)[None, :] * stride_vs
                 + ds.to(tl.int64)[:, None] * stride_vd,
                 mask=(ds[:, None] < D) & (cols[None, :] < SK), other=0.0)   # Vᵀ: (D, N)
    if INTERP_BF16:
        kt = kt.to(tl.float32)
        vt = vt.to(tl.float32)
    if SCALE_SIGN != 1:
        kt = (kt * SCALE_SIGN).to(kt.dtype)   # sign·S = Q (sign·Kᵀ): exact, as v3's sign·Q
    dk = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
    dv = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
    lo = 0
    if CAUSAL:
        lo = (pid_n * BLOCK_N // BLOCK_M) * BLOCK_M   # earlier rows see none of these keys
    for g in range(0, GROUP):            # GQA: the query heads that read this K/V head
        h = hk * GROUP + g
        bh = b_stats * HQ + h
        for m0 in range(lo, S, BLOCK_M):
            rows = m0 + ms
            row_ok = rows < S
            q = tl.load(q_ptr + b * stride_qb + h * stride_qh + rows.to(tl.int64)[:, None] * stride_qs
                        + ds.to(tl.int64)[None, :] * stride_qd,
                        mask=row_ok[:, None] & (ds[None, :] < D), other=0.0)
            do = tl.load(do_ptr + b * stride_dob + h * stride_doh + rows.to(tl.int64)[:, None] * stride_dos
                         + ds.to(tl.int64)[None, :] * stride_dod,
                         mask=row_ok[:, None] & (ds[None, :] < D), other=0.0)
            delta = tl.load(delta_ptr + bh * T + rows, mask=row_ok, other=0.0)
            if INTERP_BF16:
                q = q.to(tl.float32)
                do = do.to(tl.float32)
            # S: (M, N), multiplied as the forward's Q Kᵀ so that each score rounds as it did
            # there (see Idea: K Qᵀ can round differently)
            s = tl.dot(q, kt, input_precision="ieee")
            # loaded after S: live across that product too, they spilled on gfx942
            m = tl.load(lse_ptr + bh * 2 * T + rows, mask=row_ok, other=0.0)
            log2_l = tl.load(lse_ptr + bh * 2 * T + T + rows, mask=row_ok, other=0.0)
            # exercise begin: dkdv
            visible = row_ok[:, None] & (cols[None, :] < SK)
            if CAUSAL:
                visible = visible & (cols[None, :] <= rows[:, None])
            p = tl.where(visible, tl.exp2((s - m[:, None]) * qk_scale - log2_l[:, None]), 0.0)
            dp = tl.dot(do, vt, input_precision="ieee")
            dscore = p * (dp - delta[:, None])
            if INTERP_BF16:
                p = round_to_bf16(p)
                dscore = round_to_bf16(dscore)
            dv = tl.dot(tl.trans(p.to(do.dtype)), do, dv, input_precision="ieee")        # Pᵀ dO
            dk = tl.dot(tl.trans(dscore.to(q.dtype)), q, dk, input_precision="ieee")    # dSᵀ Q
            # exercise end
    dk = dk * scale
    if INTERP_BF16:
        dk = round_to_bf16(dk)
        dv = round_to_bf16(dv)
    tl.store(dk_ptr + b * stride_dkb + hk * stride_dkh + cols.to(tl.int64)[:, None] * stride_dks
             + ds.to(tl.int64)[None, :] * stride_dkd, dk.to(dk_ptr.dtype.element_ty), mask=kv_mask)
    tl.store(dv_ptr + b * stride_dvb + hk * stride_dvh + cols.to(tl.int64)[:, None] * stride_dvs
             + ds.to(tl.int64)[None, :] * stride_dvd, dv.to(dv_ptr.dtype.element_ty), mask=kv_mask)


@triton.jit
def _bwd_dq_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr,
                   cu_q_ptr, cu_k_ptr, scale, S, SK, D, GROUP, HQ,
                   stride_qb, stride_qh, stride_qs, stride_qd,
                   stride_kb, stride_kh, stride_ks, stride_kd,
                   stride_vb, stride_vh, stride_vs, stride_vd,
                   stride_dob, stride_doh, stride_dos, stride_dod,
                   stride_dqb, stride_dqh, stride_dqs, stride_dqd,
                   CAUSAL: tl.constexpr, VARLEN: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, INTERP_BF16: tl.constexpr,
                     SCALE_SIGN: tl.constexpr = 1):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // HQ).to(tl.int64)
    h = (bh % HQ).to(tl.int64)
    hk = h // GROUP
    T = S                                # rows of the LSE and Δ buffers
    if VARLEN:   # as in v3's kernel: b is a packed sequence, S and SK the token counts
        q0, S = sequence(cu_q_ptr, b)
        k0, SK = sequence(cu_k_ptr, b)
        if pid_m * BLOCK_M >= S:
            return
        q_ptr += q0.to(tl.int64) * stride_qs
        do_ptr += q0.to(tl.int64) * stride_dos
        dq_ptr += q0.to(tl.int64) * stride_dqs
        k_ptr += k0.to(tl.int64) * stride_ks
        v_ptr += k0.to(tl.int64) * stride_vs
        lse_ptr += q0
        delta_ptr += q0
        bh = h                           # LSE (1, Hq, 2, T), Δ (1, Hq, T)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    ds = tl.arange(0, BLOCK_D)
    ns = tl.arange(0, BLOCK_N)
    if SCALE_SIGN == 0:                  # as in v3's forward
        qk_scale = 1.4426950408889634
    else:
        qk_scale = scale * SCALE_SIGN * 1.4426950408889634
    q_mask = (rows[:, None] < S) & (ds[None, :] < D)
    q = tl.load(q_ptr + b * stride_qb + h * stride_qh + rows.to(tl.int64)[:, None] * stride_qs
                + ds.to(tl.int64)[None, :] * stride_qd, mask=q_mask, other=0.0)
    do = tl.load(do_ptr + b * stride_dob + h * stride_doh + rows.to(tl.int64)[:, None] * stride_dos
                 + ds.to(tl.int64)[None, :] * stride_dod, mask=q_mask, other=0.0)
    m = tl.load(lse_ptr + bh.to(tl.int64) * 2 * T + rows, mask=rows < S, other=0.0)
    log2_l = tl.load(lse_ptr + bh.to(tl.int64) * 2 * T + T + rows, mask=rows < S, other=0.0)
    delta = tl.load(delta_ptr + bh.to(tl.int64) * T + rows, mask=rows < S, other=0.0)
    if INTERP_BF16:
        q = q.to(tl.float32)
        do = do.to(tl.float32)
    if SCALE_SIGN != 1:
        q = (q * SCALE_SIGN).to(q.dtype)
    dq = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    hi = SK
    if CAUSAL:
        hi = tl.minimum(SK, (pid_m + 1) * BLOCK_M)
    for n0 in range(0, hi, BLOCK_N):
        cols = n0 + ns
        t_mask = (ds[:, None] < D) & (cols[None, :] < SK)
        kt = tl.load(k_ptr + b * stride_kb + hk * stride_kh + cols.to(tl.int64)[None, :] * stride_ks
                     + ds.to(tl.int64)[:, None] * stride_kd, mask=t_mask, other=0.0)
        vt = tl.load(v_ptr + b * stride_vb + hk * stride_vh + cols.to(tl.int64)[None, :] * stride_vs
                     + ds.to(tl.int64)[:, None] * stride_vd, mask=t_mask, other=0.0)
        if INTERP_BF16:
            kt = kt.to(tl.float32)
            vt = vt.to(tl.float32)
        s = tl.dot(q, kt, input_precision="ieee")
        # exercise begin: dq
        visible = (rows[:, None] < S) & (cols[None, :] < SK)
        if CAUSAL:
            visible = visible & (cols[None, :] <= rows[:, None])
        p = tl.where(visible, tl.exp2((s - m[:, None]) * qk_scale - log2_l[:, None]), 0.0)
        dp = tl.dot(do, vt, input_precision="ieee")
        dscore = p * (dp - delta[:, None])
        if INTERP_BF16:
            dscore = round_to_bf16(dscore)
        dq = tl.dot(dscore.to(kt.dtype), tl.trans(kt), dq, input_precision="ieee")
        # exercise end
    dq = dq * scale
    if INTERP_BF16:
        dq = round_to_bf16(dq)
    tl.store(dq_ptr + b * stride_dqb + h * stride_dqh + rows.to(tl.int64)[:, None] * stride_dqs
             + ds.to(tl.int64)[None, :] * stride_dqd, dq.to(dq_ptr.dtype.element_ty), mask=q_mask)


def config(backend: str, d: int) -> dict:
    """Tiles per backend: 64x64 for the matrix cores, 32x32 for the slow interpreter (fewer programs)."""
    if backend == "interpreter":
        return dict(BLOCK_M=32, BLOCK_N=32, BLOCK_D=head_block(d), num_warps=4, num_stages=1)
    return dict(BLOCK_M=64, BLOCK_N=64, BLOCK_D=head_block(d), num_warps=4, num_stages=1)


def backward(q, k, v, o, lse, do, causal: bool, scale: float, packing: Packing | None = None):
    """dQ, dK, dV from the forward's inputs, O, its two-part LSE and the output gradient ``do``.

    With ``packing``, every tensor is packed (T, H, D) as v3's launch takes them, the LSE
    (1, Hq, 2, T): three launches for every sequence, as for a dense batch."""
    grads = tuple(new_output(t.shape, t.dtype, t.device) for t in (q, k, v))
    tensors = (q, k, v, o, do, *grads)
    q, k, v, o, do, dq, dk, dv = packing.views(*tensors) if packing else tensors
    (b, hq, s, d), (hkv, sk) = q.shape, k.shape[1:3]
    rows_q, rows_k = (packing.max_q, packing.max_k) if packing else (s, sk)
    cfg = config(_backend.current().name, d)
    flags = dict(CAUSAL=bool(causal), VARLEN=packing is not None, INTERP_BF16=interp_bf16(q.dtype),
                 SCALE_SIGN=scale_sign(scale))
    cu_q, cu_k = cu_args(packing)
    delta = new_output((1 if packing else b, hq, s), torch.float32, q.device)
    _bwd_delta_kernel[(cdiv(rows_q, cfg["BLOCK_M"]), b * hq)](
        o, do, delta, cu_q, s, d, hq, *strides(o), *strides(do), VARLEN=flags["VARLEN"],
        BLOCK_M=cfg["BLOCK_M"], BLOCK_D=cfg["BLOCK_D"])
    _bwd_dkdv_kernel[(cdiv(rows_k, cfg["BLOCK_N"]), b * hkv)](
        q, k, v, do, lse, delta, dk, dv, cu_q, cu_k, scale, s, sk, d, hq // hkv, hq, hkv,
        *strides(q), *strides(k), *strides(v), *strides(do), *strides(dk), *strides(dv),
        **flags, **cfg)
    _bwd_dq_kernel[(cdiv(rows_q, cfg["BLOCK_M"]), b * hq)](
        q, k, v, do, lse, delta, dq, cu_q, cu_k, scale, s, sk, d, hq // hkv, hq,
        *strides(q), *strides(k), *strides(v), *strides(do), *strides(dq), **flags, **cfg)
    return grads


class _FlashAttention(torch.autograd.Function):
    """v3's forward (O and LSE) with this module's backward."""

    @staticmethod
    def forward(ctx, q, k, v, causal, scale):
        cfg = v3_causal_lse.config(_backend.current().name, q.shape[-1])
        o, lse = v3_causal_lse.launch(q, k, v, causal, scale, cfg)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.scale = causal, scale
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        return (*backward(q, k, v, o, lse, do, ctx.causal, ctx.scale), None, None)


def aot(dtype: torch.dtype, backend: str, arch: str, overrides: dict | None = None) -> list:
    """dK/dV and dQ of a causal Llama-3-8B launch; ``overrides={"VARLEN": True}`` compiles the packed ones."""
    cfg = config(backend, 128)
    ints = aot_ints()
    ints.update({f"stride_{t}{a}": ints[f"stride_{src}{a}"]
                 for t, src in (("do", "q"), ("dq", "q"), ("dk", "k"), ("dv", "v")) for a in "bhsd"})
    ints["HKV"] = 8
    varlen_flags, cu_pointers = aot_args(overrides)
    pointers = {"lse_ptr": "*fp32", "delta_ptr": "*fp32", **cu_pointers}
    flags = {"CAUSAL": True, "INTERP_BF16": False, "SCALE_SIGN": 1, **varlen_flags}
    return [aot_launch(_bwd_dkdv_kernel, dtype, cfg, ints, constexprs=flags, pointers=pointers),
            aot_launch(_bwd_dq_kernel, dtype, cfg, ints, constexprs=flags, pointers=pointers)]


@rung(op="attention", rung=5, name="backward", backends=("hip", "cuda", "interpreter"),
      dtypes=DTYPES, interpreter=True, kind="triton", aot=aot, backward=True)
def attention_v5(q, k, v, causal=False, scale=None):
    scale = validate.attention_operands(q, k, v, scale, DTYPES, MAX_HEAD_DIM)
    return _FlashAttention.apply(q, k, v, bool(causal), scale)
