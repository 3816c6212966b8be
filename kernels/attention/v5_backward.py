"""v5 backward: dQ, dK, dV recomputed from the saved log-sum-exp, without atomics.

Idea:
    The forward (v3's kernel) keeps only O and the row log-sum-exp as m, the max of
    sign(scale)·S, and log2 l, so P is recomputed tile by tile as
    exp2((sign·S - m)·|scale|·log2 e - log2 l): S - m is taken before scaling, as in
    the forward, so large scores lose no precision, if each score is recomputed as
    the forward rounded it. One that rounds differently by δ makes its P off by a
    factor 2^(δ·|scale|·log2 e), where SDPA's P of a row's max is exactly 1/l; at
    large scores dV then misses the harness rule. With dP = dO Vᵀ and the softmax
    gradient dS = P ∘ (dP - Δ), where Δ = rowsum(dO ∘ O) (a preprocess launch; it
    equals rowsum(P ∘ dP)), the gradients are dV = Pᵀ dO, dK = scale · dSᵀ Q and
    dQ = scale · dS K. Two main launches so that no two programs write the same
    element: one program per key block accumulates dK and dV over every query block
    *and every query head of its GQA group* (the group sum happens in registers), one
    program per query block accumulates dQ over the key blocks. No atomics, so the
    result is deterministic, run to run.

    Products per (query block, key block) pair: seven ``tl.dot`` products, four in the dK/dV
    launch (Sᵀ = K Qᵀ, dPᵀ = V dOᵀ, dV += Pᵀ dO, dK += dSᵀ Q) and three in the dQ
    launch (S = Q Kᵀ, dP = dO Vᵀ, dQ += dS K): S and dP are computed twice. This is the
    deterministic split of Triton's fused-attention tutorial. FlashAttention-2's
    backward computes five (S, dP, dV, dK, dQ once each, one program per key block) and
    adds each block's dQ into global memory with atomics, whose order, and so whose
    fp32 rounding, changes from run to run. v5 keeps determinism as the default and
    pays 7/5 of that matrix work for it.

    The dK/dV launch holds its tiles with the keys as rows: Sᵀ = K Qᵀ splits the
    product over the warps by key, as the dK and dV accumulators are split, so Pᵀ
    and dSᵀ are already the left operands of dV's and dK's products. Computing
    S = Q Kᵀ and transposing P and dS, as v5 did before, compiled (gfx942, bf16, 64 x 64
    tiles, 32x32 MFMAs) to 64 ``ds_write_b16`` per loop trip that moved P and dS
    through LDS an element at a time, and 14 spilled SGPRs; with 32 x 128 tiles and
    16x16 MFMAs it still had 32 and spilled 118 VGPRs (checked 2026-12-02). Where a
    score rounds as the forward's: on the interpreter the dots are NumPy's sgemm,
    whose rounding depends on the orientation (OpenBLAS's Haswell kernel rounds K Qᵀ
    and Q Kᵀ differently), so there the dK/dV launch multiplies Q Kᵀ as the forward
    does and transposes the result (``S_AS_FORWARD``); with the same 32 x 32 tiles as
    v3 and v4 there, the recomputed scores are the forward's bit for bit
    (``tests/test_attention_ladder.py`` checks dV, also with the Haswell kernel, and
    checks the orientation compiled for GPUs on scores exact in any order). On a GPU
    both launches sum each score's D products in MFMA steps, but v4 tunes the
    forward's tiles and MFMA shape apart from these: whether a score rounds alike
    there is not measured.

Why faster:
    Than autograd through v0/v1: no S x S_k matrix is stored or read back; each launch
    streams tiles as the forward does. Each launch has its own tiles: dK/dV a wide key
    block (the accumulators) over narrow query steps (at D = 64 on AMD a square one), dQ a
    wide query block over narrow key steps (:mod:`.configs_backward`), tuned per target, head dim and shape like v4
    (the pruned table ``tuned_space_backward.json``, timed on the GPU and kept by
    :func:`kernels.tuning.choice`; the prior is the table's first kept config that fits:
    no spills, then on AMD no 8- or 16-bit LDS ops and more waves/SIMD first, on sm90
    ``wgmma``-only configs first). Causal
    programs skip the blocks the mask hides, and only the diagonal blocks (and dQ's
    last partial key block) evaluate a mask: the other blocks run a loop without one.

Expected bound:
    Compute; about 3.5x the forward's matrix work (seven products against two).

Limits:
    As v3 (any S, S_k >= 1, D <= 128, any strides including the stride-0 output
    gradient of ``out.sum().backward()``, fp32/fp16/bf16 with fp32 accumulation,
    int64 offsets). dQ/dK/dV are in the inputs' dtypes and layouts, as ``torch.empty_like``
    lays them out (:func:`kernels.outputs.new_output_like`: q's strides where q is dense and
    non-overlapping, else dense ones in q's dimension order), the kernels storing through
    the strides they are given. So a v that is a transposed view of a (B, S, Hkv, D)
    projection, as the training model's, gets a dV that autograd hands back to the
    projection without a copy, as SDPA's. Packed sequences run the three
    kernels with ``VARLEN=True`` as v3's forward does: one launch each for the batch,
    the dense code unchanged; a sequence without queries gets dK = dV = 0 for its keys.
    Offsets nobody checked are first kept inside the packed rows on the device
    (:meth:`.varlen.Packing.clamped`), so wrong ones give wrong rows, never an access
    outside the tensors.
    The tuner times with the first shape of a bucket (as v4's); ``overrides`` pins
    settings of both kernels on top of the prior and skips it. No 8- or 16-bit LDS
    op and no spill is proved for the priors at D = 64 and D = 128 (``tests/test_attention_isa.py``),
    dense and packed on gfx942 and gfx950 (the table compiles every config both ways, drops
    one that spills in either, and one with 8/16-bit LDS ops where its kernel and head dim
    have a config without). At D = 64 on gfx942 only one-stage 2-warp tiles have none (dK/dV's
    32 x 32, dQ's 64 x 32); gfx950 keeps more (the table records each). At D = 128 dK/dV's priors run
    1 wave/SIMD: every 2-wave candidate spills or has such ops. On sm90 both priors multiply
    with ``wgmma`` and use no scratch at either head dim, dense and packed (proved there too);
    at D = 128 dK/dV's is a 16 x 128 tile on 8 warps, from 65 keys on: a 32-key tile has no
    64-row warpgroup shape, so at 64 keys or fewer, where the 16 x 128 tile does not fit, its
    32 x 32 prior multiplies with ``mma.sync`` (:data:`.configs_backward.HOPPER_TILES`).
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from .. import backend as _backend
from .. import plans, validate
from ..outputs import new_output, new_output_like
from ..registry import rung
from ..triton_support import aot_launch, cdiv, interp_bf16, round_to_bf16, run_args
from ..tuning import Problem, as_dict, choice, with_overrides
from . import configs, configs_backward, v3_causal_lse
from .launch import aot_ints, head_block, scale_sign, strides
from .varlen import Packing, aot_args, cu_args, sequence
from .spec import DTYPES, MAX_HEAD_DIM

DELTA_ROWS = 32   # query rows per program of the Δ launch: a row sum, no tile to tune


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
def _dkdv_step(dk, dv, k, v, q_head, do_head, lse_head, delta_head, m0, ms, cols, ds, S, D, T, qk_scale,
               stride_qs, stride_qd, stride_dos, stride_dod,
               CAUSAL_MASK: tl.constexpr, S_AS_FORWARD: tl.constexpr, INTERP_BF16: tl.constexpr):
    """One query block's share of dK and dV, every product with the keys as its rows."""
    rows = m0 + ms
    row_ok = rows < S
    qt = tl.load(q_head + rows.to(tl.int64)[None, :] * stride_qs + ds.to(tl.int64)[:, None] * stride_qd,
                 mask=row_ok[None, :] & (ds[:, None] < D), other=0.0)                   # Qᵀ: (D, M)
    do = tl.load(do_head + rows.to(tl.int64)[:, None] * stride_dos + ds.to(tl.int64)[None, :] * stride_dod,
                 mask=row_ok[:, None] & (ds[None, :] < D), other=0.0)                   # dO: (M, D)
    if INTERP_BF16:
        qt = qt.to(tl.float32)
        do = do.to(tl.float32)
    if S_AS_FORWARD:   # the interpreter: NumPy's sgemm may round K Qᵀ otherwise (see Idea)
        st = tl.trans(tl.dot(tl.trans(qt), tl.trans(k), input_precision="ieee"))
    else:   # Sᵀ = K Qᵀ: (N, M), Pᵀ and dSᵀ born in dV's and dK's operand layout (see Idea)
        st = tl.dot(k, qt, input_precision="ieee")
    m = tl.load(lse_head + rows, mask=row_ok, other=0.0)
    log2_l = tl.load(lse_head + T + rows, mask=row_ok, other=0.0)
    delta = tl.load(delta_head + rows, mask=row_ok, other=0.0)
    # exercise begin: dkdv
    pt = tl.exp2((st - m[None, :]) * qk_scale - log2_l[None, :])
    if CAUSAL_MASK:   # a diagonal block: key n is visible to query rows >= n
        pt = tl.where(cols[:, None] <= rows[None, :], pt, 0.0)
    dpt = tl.dot(v, tl.trans(do), input_precision="ieee")                              # dPᵀ = V dOᵀ
    dst = pt * (dpt - delta[None, :])
    if INTERP_BF16:
        pt = round_to_bf16(pt)
        dst = round_to_bf16(dst)
    dv = tl.dot(pt.to(do.dtype), do, dv, input_precision="ieee")                       # Pᵀ dO
    dk = tl.dot(dst.to(qt.dtype), tl.trans(qt), dk, input_precision="ieee")            # dSᵀ Q
    # exercise end
    return dk, dv


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
                     SCALE_SIGN: tl.constexpr = 1, S_AS_FORWARD: tl.constexpr = False):
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
    n0 = pid_n * BLOCK_N
    cols = n0 + tl.arange(0, BLOCK_N)
    ds = tl.arange(0, BLOCK_D)
    ms = tl.arange(0, BLOCK_M)
    if SCALE_SIGN == 0:                  # as in v3's forward
        qk_scale = 1.4426950408889634
    else:
        qk_scale = scale * SCALE_SIGN * 1.4426950408889634
    kv_mask = (cols[:, None] < SK) & (ds[None, :] < D)
    k = tl.load(k_ptr + b * stride_kb + hk * stride_kh + cols.to(tl.int64)[:, None] * stride_ks
                + ds.to(tl.int64)[None, :] * stride_kd, mask=kv_mask, other=0.0)    # K: (N, D)
    v = tl.load(v_ptr + b * stride_vb + hk * stride_vh + cols.to(tl.int64)[:, None] * stride_vs
                + ds.to(tl.int64)[None, :] * stride_vd, mask=kv_mask, other=0.0)    # V: (N, D)
    if INTERP_BF16:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    if SCALE_SIGN != 1:
        k = (k * SCALE_SIGN).to(k.dtype)   # sign·Sᵀ = (sign·K) Qᵀ: exact, as v3's sign·Q
    dk = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
    dv = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
    # Query rows past S and keys past SK need no mask: their Q, dO and K rows load as 0,
    # so a row past S adds P = 1 times dO = 0 to dV and dS = 0 to dK, and a key past SK
    # only touches its own dK/dV row, which is never stored.
    lo = 0
    mid = 0                              # causal: [lo, mid) the diagonal blocks, masked
    if CAUSAL:
        lo = (n0 // BLOCK_M) * BLOCK_M   # earlier rows see none of these keys
        mid = tl.minimum(S, tl.cdiv(n0 + BLOCK_N, BLOCK_M) * BLOCK_M)   # later rows see them all
    for g in range(0, GROUP):            # GQA: the query heads that read this K/V head
        h = hk * GROUP + g
        bh = b_stats * HQ + h
        q_head = q_ptr + b * stride_qb + h * stride_qh
        do_head = do_ptr + b * stride_dob + h * stride_doh
        lse_head = lse_ptr + bh * 2 * T
        delta_head = delta_ptr + bh * T
        if CAUSAL:
            for m0 in range(lo, mid, BLOCK_M):
                dk, dv = _dkdv_step(dk, dv, k, v, q_head, do_head, lse_head, delta_head, m0, ms, cols,
                                    ds, S, D, T, qk_scale, stride_qs, stride_qd,
                                    stride_dos, stride_dod, True, S_AS_FORWARD, INTERP_BF16)
        for m0 in range(mid, S, BLOCK_M):
            dk, dv = _dkdv_step(dk, dv, k, v, q_head, do_head, lse_head, delta_head, m0, ms, cols,
                                ds, S, D, T, qk_scale, stride_qs, stride_qd,
                                stride_dos, stride_dod, False, S_AS_FORWARD, INTERP_BF16)
    dk = dk * scale
    if INTERP_BF16:
        dk = round_to_bf16(dk)
        dv = round_to_bf16(dv)
    tl.store(dk_ptr + b * stride_dkb + hk * stride_dkh + cols.to(tl.int64)[:, None] * stride_dks
             + ds.to(tl.int64)[None, :] * stride_dkd, dk.to(dk_ptr.dtype.element_ty), mask=kv_mask)
    tl.store(dv_ptr + b * stride_dvb + hk * stride_dvh + cols.to(tl.int64)[:, None] * stride_dvs
             + ds.to(tl.int64)[None, :] * stride_dvd, dv.to(dv_ptr.dtype.element_ty), mask=kv_mask)


@triton.jit
def _dq_step(dq, q, do, m, log2_l, delta, k_ptr, v_ptr, n0, rows, ns, ds, SK, D, off_k, off_v, qk_scale,
             stride_ks, stride_kd, stride_vs, stride_vd,
             MASK: tl.constexpr, CAUSAL: tl.constexpr, INTERP_BF16: tl.constexpr):
    """One key block's share of dQ."""
    cols = n0 + ns
    t_mask = (ds[:, None] < D) & (cols[None, :] < SK)
    kt = tl.load(k_ptr + off_k + cols.to(tl.int64)[None, :] * stride_ks + ds.to(tl.int64)[:, None] * stride_kd,
                 mask=t_mask, other=0.0)                                                 # Kᵀ: (D, N)
    vt = tl.load(v_ptr + off_v + cols.to(tl.int64)[None, :] * stride_vs + ds.to(tl.int64)[:, None] * stride_vd,
                 mask=t_mask, other=0.0)                                                 # Vᵀ: (D, N)
    if INTERP_BF16:
        kt = kt.to(tl.float32)
        vt = vt.to(tl.float32)
    s = tl.dot(q, kt, input_precision="ieee")
    # exercise begin: dq
    p = tl.exp2((s - m[:, None]) * qk_scale - log2_l[:, None])
    if MASK:   # the last key block (keys past SK) or, causal, a diagonal one
        visible = cols[None, :] < SK
        if CAUSAL:
            visible = visible & (cols[None, :] <= rows[:, None])
        p = tl.where(visible, p, 0.0)
    dp = tl.dot(do, vt, input_precision="ieee")
    dscore = p * (dp - delta[:, None])
    if INTERP_BF16:
        dscore = round_to_bf16(dscore)
    dq = tl.dot(dscore.to(kt.dtype), tl.trans(kt), dq, input_precision="ieee")
    # exercise end
    return dq


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
    off_k = b * stride_kb + hk * stride_kh
    off_v = b * stride_vb + hk * stride_vh
    # Rows past S need no mask (Q and dO load as 0, their dQ is never stored); keys past
    # SK do, as their dS would meet K's zero rows. Unmasked: [0, mid), whole key blocks
    # that every row sees; masked: [mid, hi), the last partial block and the diagonal.
    mid = (SK // BLOCK_N) * BLOCK_N
    hi = SK
    if CAUSAL:
        mid = tl.minimum(mid, (pid_m * BLOCK_M + 1) // BLOCK_N * BLOCK_N)
        hi = tl.minimum(SK, (pid_m + 1) * BLOCK_M)
    for n0 in range(0, mid, BLOCK_N):
        dq = _dq_step(dq, q, do, m, log2_l, delta, k_ptr, v_ptr, n0, rows, ns, ds, SK, D, off_k, off_v,
                      qk_scale, stride_ks, stride_kd, stride_vs, stride_vd, False, CAUSAL, INTERP_BF16)
    for n0 in range(mid, hi, BLOCK_N):
        dq = _dq_step(dq, q, do, m, log2_l, delta, k_ptr, v_ptr, n0, rows, ns, ds, SK, D, off_k, off_v,
                      qk_scale, stride_ks, stride_kd, stride_vs, stride_vd, True, CAUSAL, INTERP_BF16)
    dq = dq * scale
    if INTERP_BF16:
        dq = round_to_bf16(dq)
    tl.store(dq_ptr + b * stride_dqb + h * stride_dqh + rows.to(tl.int64)[:, None] * stride_dqs
             + ds.to(tl.int64)[None, :] * stride_dqd, dq.to(dq_ptr.dtype.element_ty), mask=q_mask)


_CHOSEN: dict[tuple, dict] = {}   # (S and S_k buckets, BLOCK_D, dtype, causal) -> {kernel: settings}
SETTINGS = {"KERNEL", "BLOCK_M", "BLOCK_N", "BLOCK_D", "num_warps", "num_stages"}   # of every config


def scores_as_forward(backend: str) -> bool:
    """Whether dK/dV multiplies S as the forward's Q Kᵀ (the interpreter, whose NumPy dots
    round by orientation) rather than as Sᵀ = K Qᵀ (compiled; see Idea)."""
    return backend == "interpreter"


def _bucket(s: int, sk: int, d: int, dtype: torch.dtype, causal) -> tuple:
    return triton.next_power_of_2(s), triton.next_power_of_2(sk), head_block(d), dtype, bool(causal)


def _pruned(backend: str, arch: str, s: int, sk: int, d: int, kernel: str,
            dtype: torch.dtype | None = None) -> list[dict]:
    """The configs of ``kernel`` worth timing for the shape and dtype, with BLOCK_D fitted to ``d``."""
    return [{**as_dict(c), "BLOCK_D": head_block(d)}
            for c in configs.prune(configs_backward.space(backend, arch, d, kernel, dtype), s, sk)]


def prior(backend: str, arch: str, d: int, s: int = 4096, sk: int = 4096,
          dtype: torch.dtype | None = None) -> dict[str, dict]:
    """The untimed choice per kernel: its pruned space's first config for the shape and dtype
    (by default a 4096-token sequence, the launch the ISA inspector compiles)."""
    return {kernel: _pruned(backend, arch, s, sk, d, kernel, dtype)[0] for kernel in configs_backward.KERNELS}


def launch(kernel: str, run, cfg: dict):
    """One launch of ``kernel`` (``run(jit_fn, grid_rows, settings)``) with config ``cfg``."""
    fn, block = {"dkdv": (_bwd_dkdv_kernel, "BLOCK_N"), "dq": (_bwd_dq_kernel, "BLOCK_M")}[kernel]
    return run(fn, cfg[block], {k: v for k, v in cfg.items() if k != "KERNEL"})


def _tuned(kernel: str, key: tuple, s: int, sk: int, d: int, dtype: torch.dtype, run, problem=None) -> dict:
    """The fastest pruned config of ``kernel`` for ``key``, timed on its first call and kept
    (:func:`kernels.tuning.choice`: for the process and on disk; never timed in frozen mode
    or graph capture); a single candidate, always on the interpreter, untimed. ``problem``:
    the launch as a ranker sees it (:class:`kernels.tuning.Problem`)."""
    here = _backend.current()
    return choice(f"attention/v5/{kernel}", key, lambda: _pruned(here.name, here.arch, s, sk, d, kernel, dtype),
                  lambda cfg: launch(kernel, run, cfg), problem)


def backward(q, k, v, o, lse, do, causal: bool, scale: float, packing: Packing | None = None,
             overrides: dict | None = None):
    """dQ, dK, dV from the forward's inputs, O, its two-part LSE and the output gradient ``do``,
    each laid out as its input (see Limits).

    With ``packing``, every tensor is packed (T, H, D) as v3's launch takes them, the LSE
    (1, Hq, 2, T): three launches for every sequence, as for a dense batch. dK/dV and dQ
    each run their tuned config (:func:`chosen_config` tells which); ``overrides`` pins
    settings of both on top of :func:`prior` and skips the tuner. Without overrides the
    launch plan of the inputs' metadata is kept (:mod:`kernels.plans`): a repeated backward
    allocates and launches."""
    if overrides:
        return LaunchPlan(q, k, v, o, lse, do, causal, scale, packing, overrides)(q, k, v, o, lse, do, packing)
    cu = () if packing is None else (packing.cu_q, packing.cu_k)
    key = plans.meta(q, k, v, o, lse, do, *cu, extra=(
        causal, type(causal), scale, type(scale), *(() if packing is None else (packing.max_q, packing.max_k))))
    plan = _PLANS(key, LaunchPlan, q, k, v, o, lse, do, causal, scale, packing)
    return plan(q, k, v, o, lse, do, packing)


_PLANS = plans.PlanCache()


class LaunchPlan:
    """The backward's three launches for inputs of one metadata (and max lengths): grids,
    scalars, flags and each kernel's tuned config decided, so a call allocates the gradients
    and Δ, clamps a packed batch's offsets on the device and launches."""

    def __init__(self, q, k, v, o, lse, do, causal: bool, scale: float, packing: Packing | None = None,
                 overrides: dict | None = None):
        grads = (new_output_like(q), new_output_like(k), new_output_like(v))   # timed into
        if packing:
            packing = packing.clamped(q.shape[0], k.shape[0])
        tensors = (q, k, v, o, do, *grads)
        q, k, v, o, do, dq, dk, dv = packing.views(*tensors) if packing else tensors
        (b, hq, s, d), (hkv, sk) = q.shape, k.shape[1:3]
        rows_q, rows_k = (packing.max_q, packing.max_k) if packing else (s, sk)
        flags = dict(CAUSAL=bool(causal), VARLEN=packing is not None, INTERP_BF16=interp_bf16(q.dtype),
                     SCALE_SIGN=scale_sign(scale))
        here = _backend.current()
        self.delta = ((1 if packing else b, hq, s),
                      *run_args(_bwd_delta_kernel, 4, (s, d, hq, *strides(o), *strides(do)),
                                (cdiv(rows_q, DELTA_ROWS), b * hq),
                                dict(VARLEN=flags["VARLEN"], BLOCK_M=DELTA_ROWS, BLOCK_D=head_block(d))))
        self.scalars = {
            "dkdv": (scale, s, sk, d, hq // hkv, hq, hkv, *strides(q), *strides(k), *strides(v), *strides(do),
                     *strides(dk), *strides(dv)),
            "dq": (scale, s, sk, d, hq // hkv, hq, *strides(q), *strides(k), *strides(v), *strides(do),
                   *strides(dq))}
        self.flags = {"dkdv": {"S_AS_FORWARD": scores_as_forward(here.name), **flags}, "dq": flags}
        self.programs = {"dkdv": (rows_k, b * hkv), "dq": (rows_q, b * hq)}
        self.key = _bucket(rows_q, rows_k, d, q.dtype, causal)
        if overrides:
            self.chosen = {kernel: with_overrides(cfg, overrides)
                           for kernel, cfg in prior(here.name, here.arch, d, rows_q, rows_k, q.dtype).items()}
        else:
            delta = []   # Δ for the tuner's timed launches, computed on its first
            outs = {"dkdv": (dk, dv), "dq": (dq,)}

            def runs(kernel):
                packed = {}   # each timed candidate's run arguments, packed at its first launch

                def run(fn, block, cfg):
                    if not delta:
                        delta.append(self._delta(q, o, do, cu_args(packing)))
                    key = (fn, block, *cfg.items())
                    if key not in packed:
                        packed[key] = self._run_args(kernel, fn, block, cfg)
                    args, kwargs = packed[key]
                    fn.run(q, k, v, do, lse, delta[0], *outs[kernel], *cu_args(packing), *args, **kwargs)
                return run
            batch = packing.batch if packing else b   # a packed batch: the dense launch of its longest lengths
            self.chosen = {kernel: _tuned(kernel, self.key, rows_q, rows_k, d, q.dtype, runs(kernel),
                                          lambda kernel=kernel: Problem("attention", "v5", (
                                              batch, hq, hkv, rows_q, rows_k, d, int(bool(causal))), q.dtype, kernel))
                           for kernel in ("dkdv", "dq")}
        # each kernel's run arguments after its tensors (scalars, flags, settings), kept as a launch passes them
        self.run = {kernel: launch(kernel, functools.partial(self._run_args, kernel), cfg)
                    for kernel, cfg in self.chosen.items()}

    def _run_args(self, kernel: str, fn, block: int, cfg: dict) -> tuple[tuple, dict]:
        """``fn.run``'s arguments after its tensors and offsets (those before ``scale``, its first
        scalar), :func:`run_args` of ``cfg`` (:func:`launch`'s settings) on a grid of ``block`` rows."""
        rows, programs = self.programs[kernel]
        return run_args(fn, fn.arg_names.index("scale"), self.scalars[kernel], (cdiv(rows, block), programs),
                        {**self.flags[kernel], **cfg})

    def _delta(self, q, o, do, cu: tuple):
        """Δ = rowsum(dO ∘ O), launched into a new buffer; ``cu`` the offsets (:func:`.varlen.cu_args`)."""
        shape, args, kwargs = self.delta
        delta = new_output(shape, torch.float32, q.device)
        _bwd_delta_kernel.run(o, do, delta, cu[0], *args, **kwargs)
        return delta

    def __call__(self, q, k, v, o, lse, do, packing: Packing | None = None):
        grads = (new_output_like(q), new_output_like(k), new_output_like(v))   # the strides planned
        if packing:
            packing = packing.clamped(q.shape[0], k.shape[0])
            q, k, v, o, do, dq, dk, dv = packing.views(q, k, v, o, do, *grads)
        else:
            dq, dk, dv = grads
        cu = cu_args(packing)
        delta = self._delta(q, o, do, cu)
        (dkdv, dkdv_kw), (dq_args, dq_kw) = self.run["dkdv"], self.run["dq"]
        _bwd_dkdv_kernel.run(q, k, v, do, lse, delta, dk, dv, *cu, *dkdv, **dkdv_kw)
        _bwd_dq_kernel.run(q, k, v, do, lse, delta, dq, *cu, *dq_args, **dq_kw)
        _CHOSEN[self.key] = self.chosen
        return grads


def chosen_config(shape, dtype: torch.dtype) -> dict | None:
    """The settings v5 last launched per kernel ({"dkdv": ..., "dq": ...}) for ``shape``
    ((B, Hq, Hkv, S, S_k, D, causal), the spec's tuple) in its bucket and ``dtype`` in
    this process, or None."""
    s, sk, d, causal = shape[3:]
    return _CHOSEN.get(_bucket(s, sk, d, dtype, causal))


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
    """dK/dV and dQ of a causal Llama-3-8B launch, each with its prior (D = 128).

    ``overrides`` replaces settings of both; among them ``VARLEN=True`` compiles the
    packed kernels, ``CAUSAL=False`` the non-causal ones, ``KERNEL`` ("dkdv" or "dq") that
    kernel only and ``BLOCK_D`` that head dim. A complete config (every key of
    :data:`SETTINGS`; how ``workbench.isa.tune_space`` compiles a candidate) needs no table."""
    settings = dict(overrides or {})
    flags = {"CAUSAL": settings.pop("CAUSAL", True), "INTERP_BF16": False, "SCALE_SIGN": 1, "S_AS_FORWARD": False}
    varlen_flags, cu_pointers = aot_args({"VARLEN": settings.pop("VARLEN")} if "VARLEN" in settings else None)
    d = settings.get("BLOCK_D", 128)
    ints = aot_ints(d=d)
    ints.update({f"stride_{t}{a}": ints[f"stride_{src}{a}"]
                 for t, src in (("do", "q"), ("dq", "q"), ("dk", "k"), ("dv", "v")) for a in "bhsd"})
    ints["HKV"] = 8
    pointers = {"lse_ptr": "*fp32", "delta_ptr": "*fp32", **cu_pointers}
    if SETTINGS <= set(settings):
        chosen = {settings["KERNEL"]: settings}
    else:
        chosen = {kernel: with_overrides(cfg, settings) for kernel, cfg in prior(backend, arch, d, dtype=dtype).items()
                  if settings.get("KERNEL", kernel) == kernel}
    return [launch(kernel, lambda fn, _, cfg: aot_launch(fn, dtype, cfg, ints, constexprs={**flags, **varlen_flags},
                                                         pointers=pointers), cfg)
            for kernel, cfg in chosen.items()]


@rung(op="attention", rung=5, name="backward", backends=("hip", "cuda", "interpreter"),
      dtypes=DTYPES, interpreter=True, kind="triton", aot=aot, backward=True)
def attention_v5(q, k, v, causal=False, scale=None):
    scale = validate.attention_operands(q, k, v, scale, DTYPES, MAX_HEAD_DIM)
    return _FlashAttention.apply(q, k, v, bool(causal), scale)
