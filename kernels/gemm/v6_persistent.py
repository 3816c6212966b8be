"""v6 persistent: one program per CU loops over tiles; the last partial wave is split along K.

Idea:
    v5 launches one program per tile. When the tile count is not a multiple of the
    number of CUs, the last wave runs partly empty: 4096x4096 in 256x128 tiles is
    512 tiles on MI300X's 304 CUs, so the second wave keeps only 208 CUs busy
    ("wave quantization"). v6 launches exactly ``compute_units`` programs (304 on
    MI300X, the SM count on NVIDIA, 4 on the interpreter so that several tiles per
    program and the tail run on a CPU) and lets each loop over work units:

    * the tiles of the full waves, one unit each (data parallel, as before);
    * the ``tail = tiles % programs`` leftover tiles, each split into ``splits``
      K ranges (``splits = programs // tail``, at most the number of K steps), one
      unit per range: the stream-K part (Osama et al., "Stream-K: Work-centric
      Parallel Decomposition for Dense Matrix-Matrix Multiplication on the GPU",
      2023, in its simpler "data-parallel + split tail" form). When there are fewer
      tiles than programs (skinny or small shapes) every tile is a tail tile.

    Combining the K partial sums: each split writes its fp32 accumulator tile to a
    workspace (``tail x splits`` tiles), and a second small kernel adds the splits of
    each tail tile in a fixed order, rounds once, and stores C. Chosen over fp32
    ``atomic_add`` into C (needs a zeroed fp32 copy of C, a cast pass, and sums in
    whatever order the atomics land: not bitwise reproducible) and over an
    in-kernel fix-up where the tile's owner spins on flags until the other splits
    are done (one launch, but it needs all programs resident at once, which the
    CPU interpreter, running programs one after another, cannot give: it would
    hang). The fix-up pass is deterministic and costs one extra small launch plus
    ``tail x splits`` fp32 tiles of traffic.

    A bias (``kernels.nn.Linear``'s, through :mod:`.linear`) is added in the epilogue: to the
    fp32 accumulator of a whole tile before its one rounding, or by the fix-up to a split tile's
    sum; ``HAS_BIAS`` is a constexpr, so a GEMM without one compiles without it. Compiled for
    gfx942 and gfx950 (bf16, NT, the prior config) the hot loop, the registers and the waves are
    those of the launch without a bias, plus at most four 8- or 16-byte loads of it per thread
    after the loop (``tests/test_isa_claims.py``).

    C may have another dtype than the operands: the kernels store ``acc.to(C's dtype)``, so an fp32
    C of bf16 operands (the weight gradient of an fp32 master weight, :mod:`.wgrad`) receives the
    accumulator itself, with no rounding to bf16 and no cast pass after. Compiled for gfx942 and
    gfx950 (bf16, TN, the prior config) that launch keeps the bf16 C's hot loop with its MFMAs,
    spills neither VGPRs nor SGPRs in either kernel, stores 16 bytes at a time, twice a bf16 C's
    bytes, and on gfx950 converts nothing to bf16 (``tests/test_isa_claims.py``; gfx942 has no
    conversion instruction to look for, it rounds with integer ops).

    The program ids keep v3's XCD remap (now over the ``programs`` persistent ids)
    and grouped order, and the K loop is v5's: v4's pipelining, wrapped row and
    column offsets (no load mask), ``EVEN_K`` and 64-bit offsets. :func:`schedule`
    shows the split for a shape.

    v6 is the rung ``kernels.matmul`` runs, so it tunes its tile itself: the grid,
    the split and the workspace depend on the tile, so they must be known before the
    launch, which ``triton.autotune`` (choosing inside the launch) does not allow.
    :func:`tuned` times, on the first call of each (M, N, K power-of-two bucket,
    dtype, operand layout), every config that v5's space keeps for the shape (the
    ahead-of-time pruned table, then :func:`.configs.prune`: at most 16) with v6's
    own launch, and keeps the fastest (:func:`kernels.tuning.choice`: for the process and
    in the on-disk tuning cache; never timed in frozen mode). On the interpreter the space
    has one config, so nothing is timed. :func:`chosen_config` tells what ran. A call's
    checks, config, split and scalar arguments are kept per operand metadata
    (:class:`LaunchPlan`, :mod:`kernels.plans`): a repeated shape allocates and launches.

Why faster:
    Every CU has work until the end: the tail's K work is spread over all programs
    instead of leaving most of them idle, and persistent programs pay the launch and
    prologue once rather than per tile (reasoning, not a measurement).

Expected bound:
    Compute bound for large shapes, with the last-wave loss of v5 (up to one wave
    out of ``tiles / CUs``) mostly recovered; skinny/small shapes with fewer tiles
    than CUs get up to ``splits`` times more CUs working on them (model).

Limits:
    Splits are whole K-step ranges per tile, so a tail that is more than half the
    CU count gets no split (``programs // tail == 1``); full Stream-K's fractional
    iteration ranges would balance that too. The tuner times with the program
    count and split of the first shape of a bucket; another shape in the bucket
    reuses the winner untimed. ``overrides`` sets any setting (a tile setting skips
    the tuner and starts from the untimed prior, :func:`config`); ``NUM_PROGS``
    changes the program count and ``FIXUP=False`` skips the combine pass (a
    deliberately broken variant for tests). The second epilogue (a split's fp32
    partial tile) costs registers: every 256x256 config spills VGPRs, so no 256x256
    tile survives the ahead-of-time prune on gfx942 or gfx950. (v5, without that
    epilogue, holds 256x256x64 at 4 warps in its VGPRs and AGPRs, but at bf16 on gfx942,
    which has no fp32 -> bf16 instruction, the store's software rounding makes one NaN
    check per element, ``v_cmp_o_f32``, each a lane mask in an SGPR pair, and the
    compiler spills those masks into VGPR lanes; fp16, and gfx950's
    ``v_cvt_pk_bf16_f32``, compile without spills: ``tests/test_gemm_tuning.py``.)
"""
from __future__ import annotations

import copy
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .. import backend as _backend
from .. import plans, validate
from ..outputs import new_output
from ..registry import AotKernel, rung
from ..tuning import Problem, as_dict, choice, with_overrides
from ..xcd import full_chip_xcds, num_xcds
from .spec import aot_launch_settings, layout
from . import configs
from ..triton_support import aot_launch, cdiv, interp_bf16, next_power_of_2, run_args, stored_as

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INTERPRETER_PROGRAMS = 4


@triton.jit
def _tile_coords(tile, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """v3's grouped order: GROUP_M tile rows per group, walked column by column."""
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    group_size = GROUP_M * tiles_n
    first_m = (tile // group_size) * GROUP_M
    rows_in_group = tl.minimum(tiles_m - first_m, GROUP_M)
    return first_m + (tile % group_size) % rows_in_group, (tile % group_size) // rows_in_group


@triton.jit
def _gemm_persistent_kernel(a_ptr, b_ptr, c_ptr, p_ptr, bias_ptr, M, N, K,
                            stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                            DP_TILES, SPLITS, SPLIT_K, stride_bias,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                            GROUP_M: tl.constexpr, NUM_XCDS: tl.constexpr, NUM_PROGS: tl.constexpr,
                            EVEN_K: tl.constexpr, HAS_BIAS: tl.constexpr, INTERP_BF16: tl.constexpr):
    pid = tl.program_id(0)
    if NUM_XCDS > 1:  # v3's remap (see v3_grouped_order.xcd_remap), over the persistent ids
        per = tl.cdiv(NUM_PROGS, NUM_XCDS)
        tall = NUM_PROGS - (per - 1) * NUM_XCDS
        xcd = pid % NUM_XCDS
        pid = xcd * per - tl.maximum(xcd - tall, 0) + pid // NUM_XCDS
    num_tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    num_units = DP_TILES + (num_tiles - DP_TILES) * SPLITS
    ks = tl.arange(0, BLOCK_K)
    a_step = tl.cast(stride_ak, tl.int64) * BLOCK_K
    b_step = tl.cast(stride_bk, tl.int64) * BLOCK_K
    # exercise begin: units
    for unit in range(pid, num_units, NUM_PROGS):
        split_unit = unit >= DP_TILES  # a K range of a tail tile, not a whole tile
        sk = tl.maximum(unit - DP_TILES, 0)
        tile = tl.where(split_unit, DP_TILES + sk // SPLITS, unit)
        k_lo = tl.where(split_unit, (sk % SPLITS) * SPLIT_K, 0)   # SPLIT_K: whole K steps
        k_hi = tl.where(split_unit, tl.minimum(K, k_lo + SPLIT_K), K)
    # exercise end
        pid_m, pid_n = _tile_coords(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rows = (offs_m % M).to(tl.int64)  # v5: wrapped, so the loads need no row/column mask
        cols = (offs_n % N).to(tl.int64)
        k_offs = (ks + k_lo).to(tl.int64)
        a_ptrs = a_ptr + rows[:, None] * stride_am + k_offs[None, :] * stride_ak
        b_ptrs = b_ptr + k_offs[:, None] * stride_bk + cols[None, :] * stride_bn
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        k_full = k_lo + ((k_hi - k_lo) // BLOCK_K) * BLOCK_K  # v5: no mask inside the loop
        for k0 in range(k_lo, k_full, BLOCK_K):
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
            if INTERP_BF16:
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            acc = tl.dot(a, b, acc, input_precision="ieee")  # fp32: no TF32
            a_ptrs += a_step
            b_ptrs += b_step
        if not EVEN_K:  # v5's peeled ragged step; only the last K range of a tile has one
            if k_full < k_hi:
                a = tl.load(a_ptrs, mask=ks[None, :] + k_full < k_hi, other=0.0)
                b = tl.load(b_ptrs, mask=ks[:, None] + k_full < k_hi, other=0.0)
                if INTERP_BF16:
                    a = a.to(tl.float32)
                    b = b.to(tl.float32)
                acc = tl.dot(a, b, acc, input_precision="ieee")  # fp32: no TF32
        if split_unit:  # partial sum: the whole fp32 tile to the workspace, combined later
            offs = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
            tl.store(p_ptr + sk * (BLOCK_M * BLOCK_N) + offs, acc)
        else:
            if HAS_BIAS:  # in fp32, before the one rounding: nn.Linear's addmm epilogue
                acc += tl.load(bias_ptr + cols * stride_bias).to(tl.float32)[None, :]
            c_ptrs = (c_ptr + offs_m.to(tl.int64)[:, None] * stride_cm
                      + offs_n.to(tl.int64)[None, :] * stride_cn)
            tl.store(c_ptrs, stored_as(acc, c_ptr, INTERP_BF16), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


@triton.jit
def _streamk_fixup_kernel(c_ptr, p_ptr, bias_ptr, M, N, stride_cm, stride_cn, DP_TILES, SPLITS, stride_bias,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr,
                          HAS_BIAS: tl.constexpr, INTERP_BF16: tl.constexpr):
    """One program per tail tile: add its SPLITS partial tiles in order (and the bias), round once, store."""
    t = tl.program_id(0)
    pid_m, pid_n = _tile_coords(DP_TILES + t, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for s in range(0, SPLITS):
        acc += tl.load(p_ptr + (t * SPLITS + s) * (BLOCK_M * BLOCK_N) + offs)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + (cols % N).to(tl.int64) * stride_bias).to(tl.float32)[None, :]
    c_ptrs = c_ptr + rows.to(tl.int64)[:, None] * stride_cm + cols.to(tl.int64)[None, :] * stride_cn
    tl.store(c_ptrs, stored_as(acc, c_ptr, INTERP_BF16), mask=(rows[:, None] < M) & (cols[None, :] < N))


def programs(backend: _backend.Backend) -> int:
    """Persistent programs: one per CU/SM on a GPU, a few on the interpreter."""
    return backend.compute_units if backend.is_gpu else INTERPRETER_PROGRAMS


class Schedule(NamedTuple):
    """How v6 shares an (M, N, K) GEMM among its programs."""

    dp_tiles: int   # tiles computed whole (the full waves)
    sk_tiles: int   # tail tiles split along K
    splits: int     # K ranges per tail tile
    split_k: int    # K elements per range (a multiple of BLOCK_K)


def schedule(m: int, n: int, k: int, block_m: int, block_n: int, block_k: int,
             num_progs: int) -> Schedule:
    """Full waves data parallel; the tail's tiles split into K ranges to fill the programs."""
    tiles = cdiv(m, block_m) * cdiv(n, block_n)
    steps = cdiv(k, block_k)
    tail = tiles % num_progs
    splits = min(steps, num_progs // tail) if tail else 1
    if splits <= 1:
        return Schedule(tiles, 0, 1, steps * block_k)
    per_split = cdiv(steps, splits)
    return Schedule(tiles - tail, tail, cdiv(steps, per_split), per_split * block_k)


PERSISTENT = ("NUM_XCDS", "NUM_PROGS", "FIXUP")  # settings that are not part of the tile config


def persistent_settings(backend: _backend.Backend, xcds: int | None = None) -> dict:
    """The settings of a launch that are not part of the tile config (:data:`PERSISTENT`)."""
    return {"NUM_XCDS": xcds or num_xcds(backend), "NUM_PROGS": programs(backend), "FIXUP": True}


def config(backend: _backend.Backend, m: int, n: int, k: int, xcds: int | None = None,
           dtype: torch.dtype | None = None) -> dict:
    """The prior: the pruned space's first config for the shape and dtype (untimed), plus the
    persistent settings."""
    best = configs.prune(configs.space(backend.name, backend.arch, dtype), m, n, k)[0]
    return {**as_dict(best), **persistent_settings(backend, xcds)}


def aot(dtype: torch.dtype, backend: str, arch: str, overrides: dict | None = None) -> list[AotKernel]:
    """Both kernels for a large square GEMM; 304 programs (MI300X CUs) or 132 (H100 SMs).

    Its tiles fill whole waves (8192^3 splits no tail: SPLITS = 1, which Triton makes a
    constant), as most of a training step's projections do. The fix-up runs only where a
    tail is split, so it is compiled with the schedule of one that is: a GEMM whose tiles
    fill half the programs, each split in two along K (SPLITS = 2; a constant 1 would fold
    its loop over the partial tiles away).

    ``overrides`` replaces settings; ``layout``, ``EVEN_K`` and ``HAS_BIAS`` (a contiguous bias,
    ``nn.Linear``'s) change the launch compiled, as in v5's ``aot``; ``fp32_c`` True compiles both
    kernels storing an fp32 C (:meth:`LaunchPlan.writing`: the weight gradient of an fp32 master
    weight, layout TN, :mod:`.wgrad`). ``split_tail`` True compiles
    the persistent kernel with the fix-up's schedule too: the binary every launch with a split
    tail runs, another one (SPLITS = 2 is an integer argument there, not the constant 1, so its
    loop over partial tiles is kept), shown on request so that the tables, the model and the
    tuners, which compile the whole-tile binary, compile no more.
    """
    ints, settings = aot_launch_settings(overrides)
    even_k = settings.pop("EVEN_K", None)
    split_tail = settings.pop("split_tail", False)
    bias = {"HAS_BIAS": settings.pop("HAS_BIAS", False)}
    pointers = {"p_ptr": "*fp32"}
    if settings.pop("fp32_c", False):   # without a bias, a launch passes C as the bias pointer it never reads
        pointers.update(c_ptr="*fp32", **({} if bias["HAS_BIAS"] else {"bias_ptr": "*fp32"}))
    ints["stride_bias"] = int(bias["HAS_BIAS"])   # what a launch passes: 1 for a contiguous bias, else 0
    units = 304 if backend == "hip" else 132
    cfg = with_overrides(
        config(_backend.Backend(backend, arch, "aot", units), ints["M"], ints["N"], ints["K"],
               xcds=full_chip_xcds(backend, arch), dtype=dtype), settings)
    cfg.pop("FIXUP")
    plan = schedule(ints["M"], ints["N"], ints["K"], cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"],
                    cfg["NUM_PROGS"])
    split = dict(DP_TILES=plan.dp_tiles, SPLITS=plan.splits, SPLIT_K=plan.split_k)
    m_tail, n_tail = cfg["BLOCK_M"] * (cfg["NUM_PROGS"] // 2), cfg["BLOCK_N"]
    tail = schedule(m_tail, n_tail, ints["K"], cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"], cfg["NUM_PROGS"])
    tail_ints = dict(M=m_tail, N=n_tail, stride_cm=n_tail, stride_cn=1, DP_TILES=tail.dp_tiles, SPLITS=tail.splits,
                     stride_bias=ints["stride_bias"])
    fixup_cfg = {k: cfg[k] for k in ("BLOCK_M", "BLOCK_N", "GROUP_M")}
    main = {**ints, **tail_ints, "SPLIT_K": tail.split_k} if split_tail else {**ints, **split}
    return [aot_launch(_gemm_persistent_kernel, dtype, cfg, main,
                       constexprs={"EVEN_K": ints["K"] % cfg["BLOCK_K"] == 0 if even_k is None else even_k,
                                   "INTERP_BF16": False, **bias},
                       pointers=pointers),
            aot_launch(_streamk_fixup_kernel, dtype,
                       {**fixup_cfg, "num_warps": cfg["num_warps"], "num_stages": 1},
                       tail_ints, constexprs={"INTERP_BF16": False, **bias}, pointers=pointers)]


class LaunchPlan:
    """v6's launches for operands of one metadata, settings ``cfg``: every argument but the
    tensors decided, so a call allocates C (and a split tail's workspace) and launches. The
    kernels take pointers, the operands' strides kept here: a call may pass, for an operand,
    any tensor whose first element is the operand's (``x`` for its view ``x.reshape(M, K)``,
    ``weight`` for ``weight.t()``; :meth:`kernels.gemm.ops._Plan.bind` decides when)."""

    def __init__(self, a: torch.Tensor, b: torch.Tensor, cfg: dict, bucket: tuple | None = None,
                 operands: str | None = None):
        (m, k), n = a.shape, b.shape[1]
        cfg = dict(cfg)
        fixup = cfg.pop("FIXUP")
        plan = schedule(m, n, k, cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"], cfg["NUM_PROGS"])
        bf16 = interp_bf16(a.dtype)
        self.schedule, self.shape, self.c_dtype, self.device = plan, (m, n), a.dtype, a.device   # device: in the key
        self.workspace = (plan.sk_tiles * plan.splits, cfg["BLOCK_M"] * cfg["BLOCK_N"]) if plan.sk_tiles else None
        self.no_partials = _no_partials(self.device)
        # C is new_output's: contiguous, strides (N, 1)
        self.scalars = (m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1), n, 1,
                        plan.dp_tiles, plan.splits, plan.split_k)
        self.constexprs = {"EVEN_K": k % cfg["BLOCK_K"] == 0, "INTERP_BF16": bf16, **cfg}
        self.fixup_settings = None
        if plan.sk_tiles and fixup:
            self.fixup_settings = {"BLOCK_M": cfg["BLOCK_M"], "BLOCK_N": cfg["BLOCK_N"], "GROUP_M": cfg["GROUP_M"],
                                   "INTERP_BF16": bf16, "num_warps": cfg["num_warps"]}
        self.args = self._run_args(None)
        self.bias_args = None   # see biased()
        self.bucket = bucket
        self.chosen = {**cfg, "FIXUP": fixup, "layout": operands, "EVEN_K": self.constexprs["EVEN_K"],
                       "DP_TILES": plan.dp_tiles, "SPLITS": plan.splits, "SPLIT_K": plan.split_k}

    def _run_args(self, bias: torch.Tensor | None) -> tuple:
        """Both kernels' ``run`` arguments after their tensors (:func:`run_args`), the fix-up's None
        when no tail is split: with the bias epilogue for a ``bias`` of that one's metadata."""
        has_bias = bias is not None
        stride_bias = bias.stride(0) if has_bias and bias.dim() and bias.shape[0] > 1 else 0   # 0: broadcast
        main = run_args(_gemm_persistent_kernel, 5, (*self.scalars, stride_bias), (self.constexprs["NUM_PROGS"],),
                        {**self.constexprs, "HAS_BIAS": has_bias})
        if self.fixup_settings is None:
            return main, None
        (m, n, *_), plan = self.scalars, self.schedule
        return main, run_args(_streamk_fixup_kernel, 3, (m, n, n, 1, plan.dp_tiles, plan.splits, stride_bias),
                              (plan.sk_tiles,), {**self.fixup_settings, "HAS_BIAS": has_bias})

    def launch(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        """Both kernels into ``c`` (contiguous, as :func:`new_output` makes it), adding ``bias``
        (N,), (1,) or () in C's dtype, if given, to every row in fp32 before the one rounding."""
        partials = (torch.empty(*self.workspace, dtype=torch.float32, device=self.device)   # sizes as new_output's
                    if self.workspace else self.no_partials)
        if bias is None:
            main, fixup = self.args
            bias = c   # a pointer the kernels never read (HAS_BIAS is False)
        else:
            main, fixup = self.bias_args or self._run_args(bias)
        _gemm_persistent_kernel.run(a, b, c, partials, bias, *main[0], **main[1])
        if fixup is not None:
            _streamk_fixup_kernel.run(c, partials, bias, *fixup[0], **fixup[1])

    def shaped(self, shape: tuple) -> "LaunchPlan":
        """The same launches into a C allocated in ``shape`` ((..., N) with the same element count,
        contiguous: the (M, N) result's memory), for ``a`` flattened from more dimensions: the
        public op's result needs no reshape after the launch."""
        plan = copy.copy(self)
        plan.shape = shape
        return plan

    def biased(self, bias: torch.Tensor) -> "LaunchPlan":
        """The same launches whose calls with a bias of ``bias``'s metadata (a public op's plan
        keyed on it) take that bias's ``run`` arguments as kept, not worked out per call."""
        plan = copy.copy(self)
        plan.bias_args = self._run_args(bias)
        return plan

    def writing(self, dtype: torch.dtype) -> "LaunchPlan":
        """The same launches into a C of ``dtype``: the kernels store their fp32 sum as
        ``acc.to(C's dtype)``, so an fp32 C of bf16 operands gets the accumulator itself, with no
        rounding to bf16 (the weight gradient of an fp32 master weight, :mod:`.wgrad`)."""
        plan = copy.copy(self)
        plan.c_dtype = dtype
        return plan

    def __call__(self, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        c = new_output(self.shape, self.c_dtype, self.device)
        self.launch(a, b, c, bias)
        _CHOSEN[self.bucket] = self.chosen
        return c


def _launch(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, cfg: dict) -> Schedule:
    """Both kernels of one v6 GEMM with settings ``cfg``; returns the split it used."""
    plan = LaunchPlan(a, b, cfg)
    plan.launch(a, b, c)
    return plan.schedule


_NO_PARTIALS: dict[torch.device, torch.Tensor] = {}


def _no_partials(device: torch.device) -> torch.Tensor:
    """The workspace of a launch without a split tail: one fp32 element per device, made once
    (an allocation per call is host time for nothing). No program writes or reads it: every
    unit of such a launch is a whole tile, stored to C."""
    if device not in _NO_PARTIALS:
        _NO_PARTIALS[device] = torch.empty(1, dtype=torch.float32, device=device)
    return _NO_PARTIALS[device]


_CHOSEN: dict[tuple, dict] = {}   # (M, N, K buckets, dtype) -> the settings of the last launch


def _bucket(shape, dtype: torch.dtype) -> tuple:
    m, n, k = shape
    return next_power_of_2(m), next_power_of_2(n), next_power_of_2(k), dtype


def tuned(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, persistent: dict,
          operands: str | None = None, bucket: tuple | None = None) -> dict:
    """The tile config for this launch: the fastest pruned candidate of its (bucket, dtype, layout).

    The first call of a key times every candidate ``prune`` keeps with v6's own launch
    (into ``c``, which the real launch then overwrites) and keeps the winner
    (:func:`kernels.tuning.choice`; with a ranker installed, only its shortlist is timed);
    a single candidate (always, on the interpreter) is taken without timing. ``operands`` is ``layout(a, b)`` and ``bucket`` the shape's
    ``_bucket`` when the caller has them already.
    """
    (m, k), n = a.shape, b.shape[1]
    key = (*(bucket or _bucket((m, n, k), a.dtype)), operands or layout(a, b))
    here = _backend.current()
    return choice("gemm/v6", key,
                  lambda: [as_dict(cfg) for cfg in configs.prune(configs.space(here.name, here.arch, a.dtype),
                                                                 m, n, k)],
                  lambda cfg: _launch(a, b, c, {**cfg, **persistent}), lambda: Problem("gemm", "v6", (m, n, k), a.dtype))


def chosen_config(shape, dtype: torch.dtype) -> dict | None:
    """The settings v6 last launched for ``shape``'s bucket and ``dtype`` in this process, or None:
    tiles, warps, stages, AMD knobs, NUM_XCDS, NUM_PROGS, the operand layout and the split."""
    return _CHOSEN.get(_bucket(shape, dtype))


_PLANS = plans.PlanCache()


def _plan(a: torch.Tensor, b: torch.Tensor, overrides: dict | None = None) -> LaunchPlan:
    """Every check and decision of a v6 call on ``a`` and ``b``'s metadata (tuning a new key)."""
    validate.matmul_operands(a, b, DTYPES)
    (m, k), n = a.shape, b.shape[1]
    here = _backend.current()
    operands, bucket = layout(a, b), _bucket((m, n, k), a.dtype)
    if set(overrides or ()) - set(PERSISTENT):   # a tile setting pinned: on the prior, untimed
        cfg = with_overrides(config(here, m, n, k, dtype=a.dtype), overrides)
    else:   # the tuner's choice; the prior (a prune of the space) is not needed
        fixed = with_overrides(persistent_settings(here), overrides)
        c = new_output((m, n), a.dtype, a.device)   # what the tuner times into
        cfg = {**tuned(a, b, c, fixed, operands, bucket), **fixed}
    return LaunchPlan(a, b, cfg, bucket, operands)


def plan(a: torch.Tensor, b: torch.Tensor) -> LaunchPlan:
    """The kept launch plan of ``a`` and ``b``'s metadata (a public op keeps it in its own)."""
    return _PLANS(plans.meta(a, b), _plan, a, b)


@rung(op="gemm", rung=6, name="persistent", backends=("hip", "cuda", "interpreter"),
      dtypes=DTYPES, interpreter=True, kind="triton", aot=aot, plan=plan)
def gemm_v6(a: torch.Tensor, b: torch.Tensor, *, overrides: dict | None = None) -> torch.Tensor:
    """``overrides`` replaces settings, e.g. ``{"NUM_XCDS": 8}`` runs the remap on a CPU; a
    tile setting (``BLOCK_M``, ``num_warps``, ...) starts from the prior and skips the tuner."""
    if overrides:
        return _plan(a, b, overrides)(a, b)
    return plan(a, b)(a, b)
