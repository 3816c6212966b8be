"""The grouped quantize kernels: the wgrad operand xᵀ or dyᵀ, scaled per (group, feature) or per
tensor, or in MXFP8 per 32 tokens (and the forward's expert weights, as a batch of one-group
problems).

dw[g] = x_gᵀ · dy_g reduces over each group's tokens, so its row-wise operands take one
scale per (group, feature), the amax over that group's tokens only, and are stored
feature-major, token-contiguous (C, R), R = T padded with zeros to a multiple of 16
(:func:`.quantize.wgrad_operand`). No dense granularity of :func:`kernels.gemm_fp8.quantize`
is that: its groups are rows, columns or fixed blocks, not ranges of tokens read from the
device. No element can be cast before its group's amax is known (the dense ``row``
granularity has the same two passes over x, :mod:`kernels.gemm_fp8.quantize_kernel`), so:

1. :func:`_chunk_amax_kernel`: one program per (256 tokens, 64 features), the tokens
   counted from 0 (``CHUNK``), so the program count is ceil(T/256) x C/64 whatever the
   number of groups. A program walks each group's part of its chunk: a group lying within
   the chunk gets its scale ``amax / fp8_max`` (1 for an all-zero one) here; the parts of
   the chunk's first and last group, where these run on into other chunks, go to two
   partial-maximum rows of the chunk (a (B, chunks, 2, C) fp32 scratch, 1/64 of a bf16
   x's bytes).
2. :func:`_group_scale_kernel`: one light program per (group, 64 features) writes the
   scales the chunks left: an empty group's (1) and, for a group over several chunks,
   the max of its partials (the last row of its first chunk, the first row of the
   others), reading no token. Each scale and each partial has one writer, so no atomics
   (an atomic max would be deterministic, but needs its buffer zeroed first and the
   scale computed in yet another pass); group bounds come from the device offsets, so the
   host reads nothing (the number of groups is the offsets' length).
3. :func:`_cast_transpose_kernel`: one program per (64 tokens, 64 features) tile of the
   padded (R, C) range reads x once, divides each token by its group's scales (a loop
   over the few groups the tile's tokens belong to, usually one: a tile spans a group
   boundary only where one lies in it), casts, and writes the tile transposed. Tiles
   start at a multiple of 64 tokens, not at a group's start, so the token-contiguous
   stores are whole 16-byte runs; the padding tokens [T, R) are written as zeros by the
   same stores.

Programs of the amax work, T = 8192 bf16 tokens, C = 2048 (``tests/test_grouped_quantize.py``
reads the launch grids): 1024 in launch 1 for 1, 8 or 128 groups, then 8 x 32 = 256
light ones in launch 2 for 8 groups; one launch of groups x C/64 = 256 programs before,
each walking 1024 tokens: fewer than MI300X's 304 CUs (a count, not a timing: nothing here
was run on a GPU).

One scale per tensor (the per-tensor recipes; ``PER_TENSOR``): launches 1 and 2 are not
run; the scale is the dense op's per-tensor amax pass and the launch that reduces it to the
scale (:func:`kernels.gemm_fp8.quantize_kernel.tensor_scale`: two launches, no torch op) or
given by the caller (delayed scaling's, from an amax history, or one an earlier cast of the same
tensor found: no amax pass at all), and the cast reads it as a row of
64 with stride 0, with no group lookup. Read as one number, Triton moved the transpose's
layout conversion onto the bf16 x instead of the FP8 tile; the stride-0 row costs 16 four-byte loads a thread of one address.

What gfx942 and gfx950 make of them (Triton 3.9, ``tests/test_grouped_quantize_isa.py``):
no spills, at least 7 waves per SIMD; per thread and tile, x read as two 16-byte buffer
loads in launches 1 and 3, the FP8 tile written as one 16-byte store; the transpose is a
layout conversion of the FP8 tile through 4 KiB of LDS, written and read a byte at a
time (8-bit LDS accesses, the dense kernel's pattern). The divisions (the scale, x /
scale) compile to the correctly rounded sequence (v_div_scale, v_div_fmas, v_div_fixup),
so a GPU rounds them as the reference does on the CPU (they are ``tl.math.div_rn``, on sm_90
``div.rn.f32`` where ``/`` would be the 2-ulp ``div.full.f32``: ``tests/test_fp8_divisions.py``), and the cast ends in the hardware's packed FP8
convert of values already on the grid. The division sits inside the group loop so that
the conversion moves the 1-byte result: with the scales selected into a tile first,
Triton converted the bf16 x and the fp32 scale tile instead (16 KiB of LDS).

``rows`` (:func:`launch`; :func:`.quantize.token_operands`): the same launches also make the
token's row-wise quantization, the forward's (or dgrad's) operand of the same tensor, from the
same two reads of t: the amax launch writes each token's max over its 64 features beside the
group partials, the dense op's scale launch (:func:`kernels.gemm_fp8.quantize_kernel._row_scales_kernel`)
reduces them to one scale per token, and the cast divides the tile by the row scales as well and
stores it row-major. Four launches and two reads of t where the two quantizations took six and
four; the bits are the dense ``row`` cast's. Compiled (``tests/test_grouped_quantize_isa.py``):
one more 4-byte store a thread in the amax launch; one more 4-byte load (the row scales) and
one more 16-byte store (the row-major FP8 tile) in the cast; the plain launches' LDS and waves
per SIMD, no spills. With one scale (per tensor or given: the per-tensor recipes' token operands
and weights) there are no row scales: the cast stores its FP8 tile a second time, row-major, so
one read of t after its amax pass (none for a given scale) makes both layouts where two casts
read it twice; compiled, one more 16-byte store and nothing else (the plain cast's loads, its one
division per value and one packed convert per two values, which both stores take, its LDS).

A third grid axis runs a batch of such problems with the same offsets: the forward's
weight is one, each expert's w[g] (K, N) a problem of K tokens in one group, whose
transposed copy is the K-contiguous (N, K) the forward GEMM reads.

MXFP8's transposed operands (``MX``, :func:`mx_launch`; :mod:`kernels.moe.grouped_gemm_mxfp8.quantize`)
are the cast with a gather in front and the scales found in the tile, so no amax launch:
padded position p of the copy holds token ``start_g + p - ends[g-1]`` of group g when p lies
in g's first ``size_g`` padded positions, zero otherwise (the padding up to ``ends[g]``, the
positions past the last end, to which the tokens past the last offset are not copied). The
wgrad operand is one such problem, its group ends rounded up to multiples of 32 so no
32-token block holds two groups' tokens; the forward's weight a batch of them, each expert's
w[g] (K, N) one group of K tokens, unpadded (R = K, its last block partial). A program finds
the source token of each of its 64 positions from the few groups its tile touches
(:func:`_padded_sources`, with :func:`_groups_of_range` over the padded ends), loads those
rows of t (a gather of whole feature runs, so the loads stay 16 bytes wide), and quantizes
the tile's two 32-position blocks of each feature with the dense kernel's MX step
(:func:`kernels.gemm_fp8.quantize_kernel._grouped_along_k` on the transposed tile: the
exponent from the block amax's bits, x times an exact power of two, rounded on the FP8
grid), so the bytes are :func:`kernels.gemm_fp8.quantize_ref.quantize_one`'s ``mx32`` on the
padded copy, the plain passes this replaced (``tests/test_grouped_quantize_mxfp8.py``). Every
position and scale byte is written by the one launch, the padding's too (an all-zero block
gets byte 0, as the MX rule gives it), so nothing is zeroed first. On gfx942 and gfx950
(``tests/test_grouped_quantize_mxfp8_isa.py``, both launches, bf16 t; on gfx950 under either
e8m0 rule, ``scale_rule``): no spills, 8 waves
per SIMD; per thread, t read as two 16-byte buffer loads (beside the group offsets and ends),
the copy written as one 16-byte store and the scales as one byte store (two bytes per
feature and tile); the transpose's layout conversions take 4 KiB of LDS. The 16-byte stores
need the copy's rows 16-byte aligned, R a multiple of 16: always for the wgrad operand (a
multiple of 32), for the forward weight where K is (as in the compiled case).

Outside ``MX``, tokens past the last offset (unchecked offsets) count to the last group, as
:func:`.quantize.group_of_rows` says. The cast rounds as the dense kernels do
(:func:`kernels.gemm_fp8.quantize_kernel.quantized`), so results are bit-identical to
:mod:`.quantize_ref`, the plain PyTorch passes these replaced.

Limits: inputs must be finite; a group over many chunks is reduced by one program per 64
features walking its chunks' partials (ceil(T/256) loads at most).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...gemm_fp8.quantize_kernel import (ROW_SCALES_SETTINGS, _grouped_along_k, _row_scales_kernel, format_constants,
                                         quantized, scale_of_amax, tensor_scale)
from ...microscaling import BLOCK as MX_BLOCK
from ...outputs import new_output
from ...registry import AotKernel
from ...triton_support import aot_launch, cdiv, cols_if, next_power_of_2, pointer_type, run_kwargs
from ..grouped_gemm.schedule import clamped
from .dw import ALIGN

BLOCK_T = 64     # tokens per tile: a multiple of ALIGN, so a tile's stores start 16-byte aligned
BLOCK_C = 64     # features per tile
CHUNK = 256      # tokens per program of the amax launch: 4 tiles, 32 KiB of a bf16 x per 64 features
NUM_WARPS = 4    # 256 threads per 64 x 64 tile: 16 values each


@triton.jit
def _group_bounds(offsets_ptr, g, G, T):
    """Tokens [start, end) of group g; the last group runs to T (tokens past its offset)."""
    start = clamped(offsets_ptr + g - 1, g > 0, T)
    end = tl.where(g == G - 1, T, clamped(offsets_ptr + g, g < G - 1, T))
    return start, tl.maximum(end, start)


@triton.jit
def _groups_of_range(offsets_ptr, first, last, G, T, BLOCK_G: tl.constexpr):
    """The groups of tokens ``first`` and ``last`` (first <= last < T): how many of the first
    G - 1 ends lie at or below each (the last group takes the rest). The groups between
    them are the ones the range touches (an empty one among them holds none of its tokens)."""
    gs = tl.arange(0, BLOCK_G)
    ends = tl.where(gs < G - 1, clamped(offsets_ptr + gs, gs < G - 1, T), T)
    return tl.sum((ends <= first).to(tl.int32)), tl.sum((ends <= last).to(tl.int32))


@triton.jit
def _within_one_chunk(start, end, CHUNK: tl.constexpr):
    """Whether the tokens [start, end) are some and lie in one chunk of CHUNK (counted from 0)."""
    return (end > start) & (start // CHUNK == tl.maximum(end - 1, start) // CHUNK)


@triton.jit
def _padded_sources(offsets_ptr, ends_ptr, first, tokens, T, R, G, BLOCK_T: tl.constexpr, BLOCK_G: tl.constexpr):
    """MX's gather: the token of t that each padded position ``tokens`` (from ``first``) copies,
    -1 where none: group g's tokens [start, end) go to [ends[g-1], ends[g-1] + end - start)."""
    g_first, g_last = _groups_of_range(ends_ptr, first, tl.minimum(first + BLOCK_T, R) - 1, G, R, BLOCK_G)
    source = tl.full((BLOCK_T,), -1, tl.int32)
    for g in range(g_first, tl.minimum(g_last + 1, G)):
        # bounds as among G + 1 groups: the tokens past offsets[-1] are the extra one, copied nowhere
        start, end = _group_bounds(offsets_ptr, g, G + 1, T)
        local = tokens - clamped(ends_ptr + g - 1, g > 0, R)
        source = tl.where((local >= 0) & (local < end - start), start + local, source)
    return source


@triton.jit
def _chunk_amax_kernel(t_ptr, offsets_ptr, scale_ptr, partial_ptr, rows_ptr, T, C, G,
                       stride_tb, stride_tt, stride_tc, stride_sb, stride_sg, stride_sc,
                       stride_pb, stride_pn, stride_ps, stride_pc, FMAX: tl.constexpr, CHUNK: tl.constexpr,
                       BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_G: tl.constexpr, ROWS: tl.constexpr):
    """Per chunk of CHUNK tokens and BLOCK_C features, the amax of each group's tokens in it:
    a group lying within the chunk gets its scale here; the part of the chunk's first and
    last group that runs on into other chunks goes to partial[b, chunk, 0 or 1, cols]. ROWS:
    also each token's max over the BLOCK_C features, to rows[b, token, feature tile] (contiguous
    (B, T, tiles)), which the dense ``row`` scale launch reduces (:func:`launch`'s ``rows``)."""
    chunk = tl.program_id(0)
    batch = tl.program_id(2).to(tl.int64)
    t_ptr += batch * stride_tb
    scale_ptr += batch * stride_sb
    partial_ptr += batch * stride_pb + chunk * stride_pn
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cols64 = cols.to(tl.int64)
    first = chunk * CHUNK
    stop = tl.minimum(first + CHUNK, T)
    g_first, g_last = _groups_of_range(offsets_ptr, first, stop - 1, G, T, BLOCK_G)
    for g in range(g_first, g_last + 1):
        start, end = _group_bounds(offsets_ptr, g, G, T)
        acc = tl.zeros((BLOCK_T, BLOCK_C), dtype=tl.float32)
        for row in range(tl.maximum(start, first), tl.minimum(end, stop), BLOCK_T):
            tokens = row + tl.arange(0, BLOCK_T)
            mine = tokens < tl.minimum(end, stop)
            x = tl.load(t_ptr + tokens.to(tl.int64)[:, None] * stride_tt + cols64[None, :] * stride_tc,
                        mask=mine[:, None] & (cols[None, :] < C), other=0.0)
            ax = tl.abs(x.to(tl.float32))
            acc = tl.maximum(acc, ax)
            if ROWS:   # every token lies in one group's part of one chunk: written once
                tl.store(rows_ptr + ((batch * T + tokens) * tl.num_programs(1) + tl.program_id(1)),
                         tl.max(ax, axis=1), mask=mine)
        amax = tl.max(acc, axis=0)
        whole = _within_one_chunk(start, end, CHUNK)
        tl.store(scale_ptr + g * stride_sg + cols64 * stride_sc, scale_of_amax(amax, FMAX),
                 mask=cols_if(cols, C, whole))
        tl.store(partial_ptr + cols64 * stride_pc, amax, mask=cols_if(cols, C, (g == g_first) & (whole == 0)))
        tl.store(partial_ptr + stride_ps + cols64 * stride_pc, amax,
                 mask=cols_if(cols, C, (g == g_last) & (whole == 0)))


@triton.jit
def _group_scale_kernel(offsets_ptr, scale_ptr, partial_ptr, T, C, G, stride_sb, stride_sg, stride_sc,
                        stride_pb, stride_pn, stride_ps, stride_pc, FMAX: tl.constexpr, CHUNK: tl.constexpr,
                        BLOCK_C: tl.constexpr):
    """The scale of each group the chunks did not finish: an empty one's (1), and that of a
    group over several chunks, from its partials (the last of its first chunk, the first of
    each following one)."""
    g = tl.program_id(0)
    batch = tl.program_id(2).to(tl.int64)
    scale_ptr += batch * stride_sb
    partial_ptr += batch * stride_pb
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cols64 = cols.to(tl.int64)
    start, end = _group_bounds(offsets_ptr, g, G, T)
    first, last = start // CHUNK, tl.maximum(end - 1, start) // CHUNK
    amax = tl.load(partial_ptr + first * stride_pn + stride_ps + cols64 * stride_pc,
                   mask=cols_if(cols, C, last > first), other=0.0)
    for chunk in range(first + 1, last + 1):
        amax = tl.maximum(amax, tl.load(partial_ptr + chunk * stride_pn + cols64 * stride_pc, mask=cols < C))
    tl.store(scale_ptr + g * stride_sg + cols64 * stride_sc, scale_of_amax(amax, FMAX),
             mask=cols_if(cols, C, _within_one_chunk(start, end, CHUNK) == 0))


@triton.jit
def _cast_transpose_kernel(t_ptr, offsets_ptr, ends_ptr, scale_ptr, q_ptr, amax_ptr, row_scale_ptr, q_rows_ptr,
                           T, R, C, G,
                           stride_tb, stride_tt, stride_tc, stride_sb, stride_sg, stride_sc,
                           stride_qb, stride_qc, stride_qt,
                           FMAX: tl.constexpr, MANT: tl.constexpr, EMIN: tl.constexpr, EMAX: tl.constexpr,
                           BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_G: tl.constexpr,
                           PER_TENSOR: tl.constexpr, AMAX: tl.constexpr, MX: tl.constexpr,
                           ROUND_UP: tl.constexpr, ROWS: tl.constexpr):
    """q[b, cols, tokens] = t[b, tokens, cols] / scale[b, group of the token, cols] in FP8
    (PER_TENSOR: / scale[0], one number); zeros for the padding tokens [T, R). AMAX: also
    the tile's max |t| to amax_ptr[b, tile row, tile column] (row-major over the grid).
    MX: q[b, cols, p] = the token :func:`_padded_sources` gives padded position p (0 if none)
    over 2^e of its block of 32 positions, the e8m0 byte e + 127 to scale[b, cols, p / 32]
    (an output here; stride_sg its stride along the blocks), e by the OCP rule or, with
    ROUND_UP, the round-up rule. ROWS (per group): also q_rows[b, tokens, cols] = t / row_scale[b,
    tokens] in FP8 from the same tile, contiguous (B, T, C) and (B, T): the row-wise token operand;
    with PER_TENSOR, q_rows = the tile's q itself, row-major (no row scales)."""
    batch = tl.program_id(2).to(tl.int64)
    t_ptr += batch * stride_tb
    scale_ptr += batch * stride_sb
    q_ptr += batch * stride_qb
    first = tl.program_id(0) * BLOCK_T
    tokens = first + tl.arange(0, BLOCK_T)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    tokens64, cols64 = tokens.to(tl.int64), cols.to(tl.int64)
    if MX:
        source = _padded_sources(offsets_ptr, ends_ptr, first, tokens, T, R, G, BLOCK_T, BLOCK_G)
        x = tl.load(t_ptr + source.to(tl.int64)[:, None] * stride_tt + cols64[None, :] * stride_tc,
                    mask=(source[:, None] >= 0) & (cols[None, :] < C), other=0.0).to(tl.float32)
    else:
        x = tl.load(t_ptr + tokens64[:, None] * stride_tt + cols64[None, :] * stride_tc,
                    mask=(tokens[:, None] < T) & (cols[None, :] < C), other=0.0).to(tl.float32)
    if AMAX:
        tile = (batch * tl.num_programs(0) + tl.program_id(0)) * tl.num_programs(1) + tl.program_id(1)
        tl.store(amax_ptr + tile, tl.max(tl.max(tl.abs(x), axis=1), axis=0))
    if MX:   # blocks of 32 along the tokens are 1 x 32 groups of the transposed tile (the dense kernel's step)
        q_t, exponent = _grouped_along_k(tl.trans(x), tl.trans(tl.abs(x)), BLOCK_C, BLOCK_T, 32,
                                         FMAX, MANT, EMIN, True, EMAX, ROUND_UP)
        blocks = tl.program_id(0) * (BLOCK_T // 32) + tl.arange(0, BLOCK_T // 32)
        tl.store(scale_ptr + cols64[:, None] * stride_sc + blocks[None, :] * stride_sg, exponent,
                 mask=(cols[:, None] < C) & (blocks[None, :] < tl.cdiv(R, 32)))
        q_t = q_t.to(q_ptr.dtype.element_ty)
    else:
        if PER_TENSOR:   # no group to look up; the one scale read as a row (stride 0), see the module docstring
            y = tl.math.div_rn(x, tl.load(scale_ptr + cols64 * stride_sc, mask=cols < C, other=1.0)[None, :])
        else:            # only the groups of the tile's first and last real token matter
            g_first, g_last = _groups_of_range(offsets_ptr, first, tl.minimum(first + BLOCK_T, T) - 1, G, T,
                                               BLOCK_G)
            y = x   # x / its group's scale; the padding tokens' zeros stay zeros
            for g in range(g_first, g_last + 1):
                start, end = _group_bounds(offsets_ptr, g, G, T)
                group_scale = tl.load(scale_ptr + g * stride_sg + cols64 * stride_sc, mask=cols < C, other=1.0)
                mine = (tokens >= start) & (tokens < end)
                y = tl.where(mine[:, None], tl.math.div_rn(x, group_scale[None, :]), y)
        q = quantized(y, FMAX, MANT, EMIN)
        q_t = tl.trans(q.to(q_ptr.dtype.element_ty))
        if ROWS:
            rows = batch * T + tokens64
            if not PER_TENSOR:   # each token over its own scale; with one scale, the tile's bytes row-major
                row_scale = tl.load(row_scale_ptr + rows, mask=tokens < T, other=1.0)
                q = quantized(tl.math.div_rn(x, row_scale[:, None]), FMAX, MANT, EMIN)
            tl.store(q_rows_ptr + rows[:, None] * C + cols64[None, :], q.to(q_rows_ptr.dtype.element_ty),
                     mask=(tokens[:, None] < T) & (cols[None, :] < C))
    tl.store(q_ptr + cols64[:, None] * stride_qc + tokens64[None, :] * stride_qt,
             q_t, mask=(cols[:, None] < C) & (tokens[None, :] < R))


def _block_g(groups: int) -> int:
    """BLOCK_G, the length of the vector the kernels hold the group offsets in: a power of two,
    at least 2."""
    return max(next_power_of_2(groups), 2)


def launch(t: torch.Tensor, offsets: torch.Tensor, fp8_dtype: torch.dtype, scale: torch.Tensor | None = None,
           per_tensor: bool = False, amax: bool = False, rows: bool = False) -> tuple[torch.Tensor, ...]:
    """(q (B, C, R) fp8 token-contiguous, scale (B, G, C) fp32) of a checked t (B, T, C): B
    problems whose T tokens the int32 offsets (G,) group alike (the wgrad operand: B = 1;
    the experts' weights: B = G experts of K tokens each, one group). Three launches (chunk
    amaxes, group scales, cast), no host sync. ``per_tensor``: one scale for all of t
    instead (0-d), from the dense op's amax pass and reducing launch
    (:func:`kernels.gemm_fp8.quantize_kernel.tensor_scale`); a given ``scale`` (float32, one
    number: delayed scaling's) skips every amax launch and returns (q,) alone. Either one
    reaches the cast launch with strides 0, as one scale for every group. ``amax`` (with a
    given scale): the cast also writes each tile's max |t|, returned after q as the tile maxima
    (float32, :func:`tile_maxima_shape`; none where nothing is cast), whose max is t's amax:
    what delayed scaling records (its record's launch reduces them,
    :func:`kernels.fp8.history_ops.record`). ``rows`` (per group): also t's row-wise quantization
    from the same two reads, returned after them: (q_rows (B, T, C), row scales (B, T)), each
    token over its own amax (the dense op's ``row``: :func:`kernels.gemm_fp8.quantize`), the amax
    launch writing each token's maximum per feature tile and the dense op's scale launch reducing
    them: four launches where the two quantizations took six, t read twice where it was four times.
    With one scale (``per_tensor`` or given), ``rows`` returns q_rows alone, after the tile maxima:
    the same bytes row-major (one scale rounds each element once), written by the cast from its
    one read of t (a per-tensor recipe's two weight operands: t read once, where a second cast
    read it again)."""
    (batch, tokens, cols), groups = t.shape, offsets.shape[0]
    padded = cdiv(tokens, ALIGN) * ALIGN
    q = new_output((batch, cols, padded), fp8_dtype, t.device)
    given = scale is not None
    one_scale = given or per_tensor
    consts = format_constants(fp8_dtype)
    if one_scale:
        if not given:
            scale = tensor_scale(t.reshape(batch * tokens, cols), fp8_dtype)   # 1 for an empty t
        scale_strides = (0, 0, 0)
    else:
        scale = new_output((batch, groups, cols), torch.float32, t.device)
        scale_strides = scale.stride()
    q_rows = new_output((batch, tokens, cols), fp8_dtype, t.device) if rows else q
    if rows and not one_scale:
        row_scales = new_output((batch, tokens), torch.float32, t.device)
        row_max = new_output((batch, tokens, cdiv(cols, BLOCK_C)), torch.float32, t.device)
    else:   # never read without per-group ROWS: the scale stands in, as the compiled launch's pointers
        row_scales = row_max = scale
    block_g = _block_g(groups)
    if batch and cols and groups and not one_scale:
        chunks = cdiv(tokens, CHUNK)
        partial = new_output((batch, chunks, 2, cols), torch.float32, t.device)
        args = (tokens, cols, groups, *scale_strides, *partial.stride())
        if chunks:
            _chunk_amax_kernel.run(
                t, offsets, scale, partial, row_max, *args[:3], *t.stride(), *args[3:], **run_kwargs(
                    (chunks, cdiv(cols, BLOCK_C), batch), dict(FMAX=consts["FMAX"], CHUNK=CHUNK, BLOCK_T=BLOCK_T,
                                                               BLOCK_C=BLOCK_C, BLOCK_G=block_g, ROWS=rows,
                                                               num_warps=NUM_WARPS)))
        _group_scale_kernel.run(offsets, scale, partial, *args, **run_kwargs(
            (groups, cdiv(cols, BLOCK_C), batch), dict(FMAX=consts["FMAX"], CHUNK=CHUNK, BLOCK_C=BLOCK_C, num_warps=1)))
    if rows and not one_scale and batch * tokens and not cols:   # tokens of no features: amax 0's scale
        row_scales.fill_(1.0)
    elif rows and not one_scale and batch * tokens:   # each row's scale from its tiles' maxima
        tiles = cdiv(cols, BLOCK_C)
        _row_scales_kernel.run(row_max, row_max, row_scales, row_scales, batch * tokens, cols, tiles, 0,
                               **run_kwargs((cdiv(batch * tokens, ROW_SCALES_SETTINGS["BLOCK"]),),
                                            dict(FMAX=consts["FMAX"], COLS=False, **ROW_SCALES_SETTINGS)))
    grid = (cdiv(padded, BLOCK_T), cdiv(cols, BLOCK_C), batch)
    work = batch and cols and groups and padded
    if amax:   # none where nothing is cast: their max is then 0
        tile_max = new_output(tile_maxima_shape(batch, tokens, cols, groups), torch.float32, t.device)
    else:      # never read without AMAX: the float32 scale stands in, as the compiled launch's *fp32
        tile_max = scale
    if work:
        _cast_transpose_kernel.run(   # no padded ends without MX: the offsets stand in
            t, offsets, offsets, scale, q, tile_max, row_scales, q_rows, tokens, padded, cols, groups, *t.stride(),
            *scale_strides, *q.stride(), **run_kwargs(grid, dict(BLOCK_T=BLOCK_T, BLOCK_C=BLOCK_C, BLOCK_G=block_g,
                                                                 PER_TENSOR=one_scale, AMAX=amax, MX=False,
                                                                 ROUND_UP=False, ROWS=rows,
                                                                 num_warps=NUM_WARPS, **consts)))
    row_wise = () if not rows else (q_rows,) if one_scale else (q_rows, row_scales)
    if given:
        return (q, tile_max, *row_wise) if amax else (q, *row_wise)
    return (q, scale, *row_wise)


def tile_maxima_shape(batch: int, rows: int, cols: int, groups: int) -> tuple[int, ...]:
    """The shape of the tile maxima :func:`launch` returns for ``amax`` on t (batch, rows, cols)
    of ``groups`` groups: one per tile of the cast's grid, (batch, tile rows, tile columns), or
    none, (0,), where the cast does not run (no groups, or an empty t). The custom op's fake
    makes the same."""
    padded = cdiv(rows, ALIGN) * ALIGN
    if not (batch and cols and groups and padded):
        return (0,)
    return batch, cdiv(padded, BLOCK_T), cdiv(cols, BLOCK_C)


def mx_launch(t: torch.Tensor, offsets: torch.Tensor, ends: torch.Tensor, fp8: torch.dtype, rows: int,
              scale_rule: str = "ocp") -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP8's transposed copies (:mod:`kernels.moe.grouped_gemm_mxfp8.quantize`): (q (B, C, rows)
    fp8 token-contiguous, scales (B, C, ceil(rows/32)) uint8 e8m0) of t (B, T, C), B problems
    grouped alike by the int32 ``offsets`` (G,), group g's tokens copied to the padded positions
    from ``ends[g-1]`` (int32 (G,); 0 for g = 0), both contiguous. One launch of the cast in
    its ``MX`` mode, which finds each 32-position block's scale in its tile: no amax launch,
    t read once, every position and scale written (the padding's zeros too). ``scale_rule``:
    the e8m0 rule, ``"ocp"`` or ``"round_up"`` (:func:`kernels.gemm_fp8.quantize`'s)."""
    (batch, tokens, cols), groups = t.shape, offsets.shape[0]
    q = new_output((batch, cols, rows), fp8, t.device)
    scales = new_output((batch, cols, cdiv(rows, MX_BLOCK)), torch.uint8, t.device)
    if batch and cols and rows:
        grid = (cdiv(rows, BLOCK_T), cdiv(cols, BLOCK_C), batch)
        _cast_transpose_kernel.run(   # no AMAX or ROWS: the scales and q stand in for their pointers
            t, offsets, ends, scales, q, scales, scales, q, tokens, rows, cols, groups, *t.stride(),
            scales.stride(0), scales.stride(2), scales.stride(1), *q.stride(), **run_kwargs(grid, dict(
                BLOCK_T=BLOCK_T, BLOCK_C=BLOCK_C, BLOCK_G=_block_g(groups), PER_TENSOR=False,
                AMAX=False, MX=True, ROUND_UP=scale_rule == "round_up", ROWS=False, num_warps=NUM_WARPS,
                **format_constants(fp8))))
    return q, scales


def aot(fp8_dtype: torch.dtype, t_dtype: torch.dtype = torch.bfloat16,
        per_tensor: bool = False, amax: bool = False, rows: bool = False) -> tuple[AotKernel, ...]:
    """The three launches (chunk amaxes, group scales, cast) as a GPU runs them on a
    contiguous bf16 (8192, 7168) x of 128 groups (DeepSeek-V3's hidden size and its routed
    experts), for an ahead-of-time compile (:func:`workbench.isa.compile.compile_aot`; not a
    rung, so not in the inspector); ``per_tensor``: the cast alone, its scale read with
    strides 0 (which the JIT specializes as divisible by 16: another binary); ``amax``: with
    the tile maxima a given scale's cast writes for delayed scaling; ``rows``: with the row-wise
    quantization beside (:func:`launch`'s ``rows``: the dense op's scale launch between them, not here)."""
    t, c, g = 8192, 7168, 128
    chunks = cdiv(t, CHUNK)
    common = dict(T=t, C=c, G=g, **(dict(stride_sb=0, stride_sg=0, stride_sc=0) if per_tensor
                                    else dict(stride_sb=g * c, stride_sg=c, stride_sc=1)))
    tokens = dict(stride_tb=t * c, stride_tt=c, stride_tc=1)
    partials = dict(stride_pb=chunks * 2 * c, stride_pn=2 * c, stride_ps=c, stride_pc=1)
    pointers = {"t_ptr": pointer_type(t_dtype), "offsets_ptr": "*i32", "ends_ptr": "*i32", "scale_ptr": "*fp32",
                "partial_ptr": "*fp32", "amax_ptr": "*fp32", "rows_ptr": "*fp32", "row_scale_ptr": "*fp32"}
    cfg = dict(BLOCK_T=BLOCK_T, BLOCK_C=BLOCK_C, num_warps=NUM_WARPS)
    consts = format_constants(fp8_dtype)
    chunk_amax = aot_launch(_chunk_amax_kernel, fp8_dtype, cfg, dict(common, **tokens, **partials),
                      dict(FMAX=consts["FMAX"], CHUNK=CHUNK, BLOCK_G=g, ROWS=rows), pointers)
    scales = aot_launch(_group_scale_kernel, fp8_dtype, dict(BLOCK_C=BLOCK_C, num_warps=1), dict(common, **partials),
                        dict(FMAX=consts["FMAX"], CHUNK=CHUNK), pointers)
    cast = aot_launch(_cast_transpose_kernel, fp8_dtype, cfg,
                      dict(common, **tokens, R=t, stride_qb=c * t, stride_qc=t, stride_qt=1),
                      dict(consts, BLOCK_G=g, PER_TENSOR=per_tensor, AMAX=amax, MX=False, ROUND_UP=False, ROWS=rows),
                      pointers)
    return (cast,) if per_tensor else (chunk_amax, scales, cast)


def mx_aot(fp8_dtype: torch.dtype, t_dtype: torch.dtype = torch.bfloat16, weight: bool = False,
           scale_rule: str = "ocp") -> AotKernel:
    """:func:`mx_launch` as a GPU runs it, for an ahead-of-time compile: the wgrad operand of a
    contiguous (8192, 7168) x of 128 groups (R = T + 32·G, the padded bound), or (``weight``)
    the forward's weight, 128 experts' (7168, 2048) w[g], each one group of K tokens (R = K);
    ``scale_rule``: the e8m0 rule."""
    if weight:
        (b, t, c), g, r = (128, 7168, 2048), 1, 7168
    else:
        (b, t, c), g = (1, 8192, 7168), 128
        r = t + MX_BLOCK * g
    blocks = r // MX_BLOCK
    ints = dict(T=t, R=r, C=c, G=g, stride_tb=t * c, stride_tt=c, stride_tc=1, stride_sb=c * blocks, stride_sg=1,
                stride_sc=blocks, stride_qb=c * r, stride_qc=r, stride_qt=1)
    scales = pointer_type(torch.uint8)
    return aot_launch(_cast_transpose_kernel, fp8_dtype, dict(BLOCK_T=BLOCK_T, BLOCK_C=BLOCK_C, num_warps=NUM_WARPS),
                      ints, dict(format_constants(fp8_dtype), BLOCK_G=_block_g(g),
                                 PER_TENSOR=False, AMAX=False, MX=True, ROUND_UP=scale_rule == "round_up", ROWS=False),
                      {"t_ptr": pointer_type(t_dtype), "offsets_ptr": "*i32", "ends_ptr": "*i32",
                       "scale_ptr": scales, "amax_ptr": scales, "row_scale_ptr": scales})
