"""v4 lds_pipeline: software-pipeline the K loop through LDS, and set the AMD knobs.

Idea:
    In v3 every K step loads its A and B tiles from HBM, writes them to LDS, waits,
    and only then runs its MFMAs: the matrix cores idle during each load. With
    ``num_stages=2`` Triton's pipeliner (the "stream pipeliner" on AMD) issues the
    global loads of step k+1 before the MFMAs of step k. Where the prefetch waits
    depends on the target, and the compiled code shows it. gfx942: in registers. The
    loop loads step k+1 into VGPRs, reads step k's operands out of LDS, waits at a
    barrier until every wave has read them, then writes the registers over the
    same LDS tiles (``ds_write``): one tile per operand, 32 KiB for 128x64 A and
    64x128 B (v2's one-stage loop uses 16 KiB, A and B taking turns in one
    allocation; a second LDS tile per operand appears at ``num_stages=3``, 64 KiB).
    gfx950: straight into LDS (``buffer_load_dwordx4 ... lds``), so there the
    prefetch needs a second LDS tile per operand at two stages already (67,520 B).

    The kernel change that goes with it: the loop now runs over the full BLOCK_K
    steps with only the loop-invariant row/column masks, and the ragged last K step,
    if any, is peeled after the loop with the K mask. The pipeliner would
    pipeline v3's masked loop as well (v3 compiled with ``num_stages=2`` doubles
    its LDS too); what peeling buys is a loop without the K test: v3's gfx942 hot
    loop compares every step against K (``v_cmp_gt_i32``), v4's has no vector
    compare at all.

    The AMD compile options, passed only on the hip backend (NVIDIA's compiler
    rejects unknown options; the interpreter drops them):

    * ``matrix_instr_nonkdim``: the M/N size of the MFMA instruction. 16 selects
      ``v_mfma_f32_16x16x16_bf16`` (gfx950: ``..._16x16x32_bf16``), 32 selects
      ``v_mfma_f32_32x32x8_bf16``, 0 lets the compiler pick (it picks 32x32 for
      these tiles). 16x16 needs fewer registers per instruction and suits
      smaller/odd tiles; both have the same peak rate on CDNA3.
    * ``kpack``: how many k-packs each lane reads from LDS per MFMA operand. kpack=2
      turns the ``ds_read2st64_b64`` operand reads into ``ds_read_b128`` on gfx942
      (fewer, wider LDS instructions). In Triton 3.9 ``HIPOptions.__post_init__``
      overwrites kpack to 1 on gfx950, with a deprecation warning; this rung sends
      kpack=2 on gfx942 only.
    * ``waves_per_eu``: Triton emits the LLVM attribute ``amdgpu-waves-per-eu="N,N"``,
      a floor *and* a ceiling on the waves per SIMD. The floor would cap registers at
      512 / N per lane (256 for N = 2), but v4 needs about 120 VGPRs, so the cap never
      binds; the ceiling does: without the option the kernel runs 4 waves per SIMD,
      with ``waves_per_eu=2`` it runs 2. Look at ``.vgpr_count`` and ``; Occupancy:``
      in the ISA. Whether two waves beat four here is for a GPU to measure; this
      rung sets 2, and v5's tuner also times 0 (no attribute).

    What to look for in the gfx942 ISA: ``v_mfma_f32_16x16x16_bf16``,
    ``ds_write_b128`` (staging into LDS), ``ds_read_b128`` (operands out of LDS),
    ``buffer_load_dwordx4`` (16 bytes per lane) and LDS bytes in the metadata twice
    v3's (one tile per operand against v3's shared one). The wide loads need leading
    strides that are multiples of 16 elements, which the JIT specializes on at run
    time (the ISA inspector compiles with the same hints; tensors under 2 GB also
    make the loads buffer loads).

    The layout of B matters on gfx942. MFMA wants both operands K-contiguous in
    LDS; B in row-major layout (N contiguous, ``x @ w`` with ``w`` (K, N)) is
    transposed on its way in: 8 ``ds_write_b32`` per K step for the B tile, against
    2 ``ds_write_b128`` when B is K-contiguous. K-contiguous B is what
    ``torch.nn.Linear`` stores (``weight`` is (N, K); ``kernels.nn.Linear`` passes
    ``weight.t()``, a view, no copy), so training layers take the fast path. On
    gfx950 the loads go straight to LDS either way, and row-major B is read out
    with the transposing ``ds_read_b64_tr_b16``.

Why faster:
    Meant to be: global-memory latency (hundreds of cycles) overlapping MFMA work
    instead of adding to it, and wider LDS reads issuing fewer instructions per MFMA.
    The compiled code keeps less of that than the idea promises, and the model puts
    v4 *below* v3 at 8192³ on MI300X and MI355X (``tests/test_model_gemm.py``; no GPU
    has measured either). On gfx942 the loop's ``s_waitcnt vmcnt(0)`` retires the
    loads issued at the top of the same iteration, after two of its 32 MFMAs (the
    ``v_perm`` that transposes row-major B wants them; :mod:`workbench.isa.waits`):
    the prefetch hides almost no latency there. On gfx950 part of the loads (those
    straight into LDS) are waited on one iteration later, a real overlap. On both,
    ``waves_per_eu=2`` leaves half of v3's waves per SIMD (2 against 4), the waves
    that hide latency and LDS time behind each other's MFMAs. v4 is the rung that
    shows the pipeline and the AMD knobs; whether they pay is v5's tuner's to time.

Expected bound:
    Compute (matrix-core peak) for large shapes; the remaining gap is the epilogue,
    the K tail, and wave quantization when the tile count is not a multiple of the
    CU count (v6's idea). Which tile size wins depends on the shape: v5 tunes it.

Limits:
    Any M, N, K and strides, as v3; a K that is not a multiple of BLOCK_K costs one
    extra masked step. The LDS tiles, (BLOCK_M + BLOCK_N) x BLOCK_K elements per
    stage beyond the first on gfx942 (per stage on gfx950), must fit in 64 KiB on
    gfx942 (160 KiB on gfx950). One fixed tile for every shape.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import backend as _backend
from .. import validate
from ..outputs import new_output
from ..registry import AotKernel, rung
from ..tuning import with_overrides
from ..xcd import full_chip_xcds, num_xcds
from . import configs
from .spec import aot_launch_settings
from ..triton_support import aot_launch, cdiv, interp_bf16, round_to_bf16

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def _gemm_pipelined_kernel(a_ptr, b_ptr, c_ptr, M, N, K,
                         stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         GROUP_M: tl.constexpr, NUM_XCDS: tl.constexpr,
                         INTERP_BF16: tl.constexpr):
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    if NUM_XCDS > 1:  # v3's remap (see v3_grouped_order.xcd_remap)
        per = tl.cdiv(tiles_m * tiles_n, NUM_XCDS)
        tall = tiles_m * tiles_n - (per - 1) * NUM_XCDS
        xcd = pid % NUM_XCDS
        pid = xcd * per - tl.maximum(xcd - tall, 0) + pid // NUM_XCDS
    # Grouped order: GROUP_M tile rows per group, walked column by column.
    group_size = GROUP_M * tiles_n
    first_m = (pid // group_size) * GROUP_M
    rows_in_group = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group_size) % rows_in_group
    pid_n = (pid % group_size) // rows_in_group
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    # Offsets in int64: int arguments below 2^31 arrive as i32, and rows * stride_am
    # wraps for an operand of 2^31+ elements. Computed once here, not in the loop.
    a_ptrs = a_ptr + rows.to(tl.int64)[:, None] * stride_am + ks.to(tl.int64)[None, :] * stride_ak
    b_ptrs = b_ptr + ks.to(tl.int64)[:, None] * stride_bk + cols.to(tl.int64)[None, :] * stride_bn
    a_step = tl.cast(stride_ak, tl.int64) * BLOCK_K
    b_step = tl.cast(stride_bk, tl.int64) * BLOCK_K
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # exercise begin: peel
    k_full = (K // BLOCK_K) * BLOCK_K  # no K mask inside the loop: the pipeliner needs that
    for k0 in range(0, k_full, BLOCK_K):
        a = tl.load(a_ptrs, mask=rows[:, None] < M, other=0.0)
        b = tl.load(b_ptrs, mask=cols[None, :] < N, other=0.0)
        if INTERP_BF16:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision="ieee")  # fp32: no TF32
        a_ptrs += a_step
        b_ptrs += b_step
    if k_full < K:  # the ragged last K step, peeled out of the loop
        a = tl.load(a_ptrs, mask=(rows[:, None] < M) & (ks[None, :] + k_full < K), other=0.0)
        b = tl.load(b_ptrs, mask=(ks[:, None] + k_full < K) & (cols[None, :] < N), other=0.0)
        if INTERP_BF16:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision="ieee")  # fp32: no TF32
    # exercise end
    if INTERP_BF16:
        acc = round_to_bf16(acc)
    c_ptrs = c_ptr + rows.to(tl.int64)[:, None] * stride_cm + cols.to(tl.int64)[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(rows[:, None] < M) & (cols[None, :] < N))


def amd_options(arch: str) -> dict:
    """The AMD-only compile options (see the module docstring); kpack=2 only where it exists."""
    return dict(matrix_instr_nonkdim=16, kpack=2 if arch == "gfx942" else 1, waves_per_eu=2)


def config(backend: str, arch: str = "gfx942", xcds: int | None = None) -> dict:
    """Tiles and pipeline depth per backend; the interpreter ignores stages and knobs.

    ``xcds`` as in v3's ``config``: the device's, or the whole chip's by default."""
    if backend == "interpreter":
        return dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=32, GROUP_M=2, NUM_XCDS=1,
                    num_warps=4, num_stages=2)
    if backend == "hip":
        return dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8,
                    NUM_XCDS=xcds or full_chip_xcds(backend, arch), num_warps=8, num_stages=2, **amd_options(arch))
    return dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, NUM_XCDS=1,
                num_warps=4, num_stages=3)


def aot(dtype: torch.dtype, backend: str, arch: str, overrides: dict | None = None) -> list[AotKernel]:
    """An 8192^3 launch; ``overrides`` replaces settings, ``layout`` "NT" makes B K-contiguous."""
    ints, settings = aot_launch_settings(overrides)
    cfg = with_overrides(config(backend, arch), settings)
    return [aot_launch(_gemm_pipelined_kernel, dtype, cfg, ints, constexprs={"INTERP_BF16": False})]


@rung(op="gemm", rung=4, name="lds_pipeline", backends=("hip", "cuda", "interpreter"),
      dtypes=DTYPES, interpreter=True, kind="triton", aot=aot)
def gemm_v4(a: torch.Tensor, b: torch.Tensor, *, overrides: dict | None = None) -> torch.Tensor:
    """``overrides`` replaces settings, e.g. ``{"NUM_XCDS": 8}`` runs the remap on a CPU."""
    validate.matmul_operands(a, b, DTYPES)
    (m, k), n = a.shape, b.shape[1]
    c = new_output((m, n), a.dtype, a.device)
    here = _backend.current()
    cfg = with_overrides(config(here.name, here.arch, num_xcds(here)), overrides)
    grid = (cdiv(m, cfg["BLOCK_M"]) * cdiv(n, cfg["BLOCK_N"]),)
    _gemm_pipelined_kernel[grid](a, b, c, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                               c.stride(0), c.stride(1), INTERP_BF16=interp_bf16(a.dtype), **cfg)
    return c
