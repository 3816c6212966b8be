"""v5 autotuned: v4's kernel, with the tile and knobs chosen per shape by timing, and no mask in the K loop.

Idea:
    No single tile is best for every shape: 128x128 wastes half its work on a
    decode GEMM with M=16, and a 256-wide tile halves the A/B traffic of a large
    square one. v5 wraps v4's kernel in ``triton.autotune`` over a per-backend space
    (:mod:`.configs`). That space was pruned ahead of time: every candidate was
    compiled for gfx942, gfx950 and sm90 and the ones that spill registers were
    dropped, so no GPU ever spends time on them (``python -m workbench.isa.tune_space``).
    ``prune_configs_by`` then drops, per shape, configs that do not fit it and keeps
    at most 16, and the survivors are each timed once per key; the fastest is cached.
    The key is the power-of-two bucket of M, N and K (kernel arguments ``M_BUCKET``...
    that the kernel does not read) plus the dtype, which autotune appends by itself.

    The loop also carries no mask, as in AMD's own tuned Triton GEMMs:

    * wrapped offsets: a tile's rows past M are read as ``row % M`` (columns as
      ``col % N``). They load real elements whose products land in rows that the
      store, which keeps its mask, never writes; so no load needs a row or column
      mask.
    * ``EVEN_K``: when K is a multiple of BLOCK_K (a heuristic computed at launch,
      so it is part of what the JIT specializes on) the peeled, K-masked last step
      is not compiled at all; otherwise it runs once after the unmasked loop.

    Offsets are 64-bit (``rows.to(tl.int64) * stride``, and the K step as an int64
    ``BLOCK_K * stride``): Triton passes int arguments below 2^31 as int32, and an
    operand of 2^31 elements or more would wrap around in 32-bit offsets.

    The chosen config is visible: ``kernels.gemm.v5_autotuned.chosen_config((M, N, K),
    dtype)`` returns it as a dict (tiles, num_warps, num_stages, AMD knobs) after a
    call with a shape in that bucket, ``None`` before.

Why faster:
    Each shape gets the tile and MFMA size that suit it; on decode shapes a 16-row
    tile stops computing rows that are masked away (reasoning, not a measurement).
    With ``EVEN_K`` the compiled kernel has no peeled step (fewer MFMA instructions
    in all, checked by a test), and the loop holds no mask (no vector compare in
    the gfx942/gfx950 hot loop, checked for v6 which shares this loop).

Expected bound:
    Compute bound for large shapes, as v4; memory bound (B read once) for decode
    shapes, where the right skinny tile gets close to HBM bandwidth (model). Wave
    quantization remains: a 4096x4096 GEMM in 256x128 tiles is 512 tiles on 304
    CUs, 1.7 waves, the second 68 % full (v6's idea).

Limits:
    The first call of each bucket on a GPU times every surviving config (seconds).
    A bucket's winner may be second-best for another shape in it. ``overrides``
    pins a config and skips the tuner (for experiments). The space was pruned with
    v6's kernel (the rung ``kernels.matmul`` runs), not v5's; v5's loop is the same
    with less around it. Wrapped rows still cost loads on the last tile row (the
    data is read, only its results are dropped).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import backend as _backend
from .. import validate
from ..outputs import new_output
from ..registry import AotKernel, rung
from ..tuning import as_dict, with_overrides
from ..xcd import full_chip_xcds, num_xcds
from .spec import aot_launch_settings
from . import configs
from ..triton_support import aot_launch, cdiv, interp_bf16, round_to_bf16

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@triton.autotune(configs=configs.space(_backend.current().name, _backend.current().arch),
                 key=["M_BUCKET", "N_BUCKET", "K_BUCKET"],
                 prune_configs_by={"early_config_prune": configs.early_config_prune})
@triton.heuristics({"EVEN_K": lambda args: args["K"] % args["BLOCK_K"] == 0})
@triton.jit
def _gemm_autotuned_kernel(a_ptr, b_ptr, c_ptr, M, N, K,
                           stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                           M_BUCKET, N_BUCKET, K_BUCKET,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                           GROUP_M: tl.constexpr, NUM_XCDS: tl.constexpr, EVEN_K: tl.constexpr,
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
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # Rows past M (columns past N) wrap onto rows that exist: their products are never
    # stored, so the loads need no row/column mask. 64-bit offsets: no wrap at 2^31 elements.
    # exercise begin: wrap
    rows = (offs_m % M).to(tl.int64)
    cols = (offs_n % N).to(tl.int64)
    # exercise end
    ks = tl.arange(0, BLOCK_K).to(tl.int64)
    a_ptrs = a_ptr + rows[:, None] * stride_am + ks[None, :] * stride_ak
    b_ptrs = b_ptr + ks[:, None] * stride_bk + cols[None, :] * stride_bn
    a_step = tl.cast(stride_ak, tl.int64) * BLOCK_K
    b_step = tl.cast(stride_bk, tl.int64) * BLOCK_K
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_full = (K // BLOCK_K) * BLOCK_K  # no mask at all inside the loop
    for k0 in range(0, k_full, BLOCK_K):
        a = tl.load(a_ptrs)
        b = tl.load(b_ptrs)
        if INTERP_BF16:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision="ieee")  # fp32: no TF32
        a_ptrs += a_step
        b_ptrs += b_step
    if not EVEN_K:  # the ragged last K step, peeled out of the loop; compiled only if K needs it
        a = tl.load(a_ptrs, mask=ks[None, :] + k_full < K, other=0.0)
        b = tl.load(b_ptrs, mask=ks[:, None] + k_full < K, other=0.0)
        if INTERP_BF16:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision="ieee")  # fp32: no TF32
    if INTERP_BF16:
        acc = round_to_bf16(acc)
    c_ptrs = c_ptr + offs_m.to(tl.int64)[:, None] * stride_cm + offs_n.to(tl.int64)[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


_CHOSEN: dict[tuple, dict] = {}


def _key(shape, dtype: torch.dtype) -> tuple:
    return (*(triton.next_power_of_2(d) for d in shape), dtype)


def chosen_config(shape, dtype: torch.dtype) -> dict | None:
    """The config v5 launched for ``shape``'s bucket and ``dtype`` in this process, or None."""
    return _CHOSEN.get(_key(shape, dtype))


def _with_overrides(overrides: dict | None) -> dict:
    here = _backend.current()
    known = {*as_dict(configs.space(here.name, here.arch)[0]), "NUM_XCDS"}
    unknown = set(overrides or ()) - known
    if unknown:
        raise ValueError(f"config overrides {sorted(unknown)} are not settings of this rung; "
                         f"known: {sorted(known)}")
    return dict(overrides or {})


def aot(dtype: torch.dtype, backend: str, arch: str, overrides: dict | None = None) -> list[AotKernel]:
    """The pruned space's first config for a large square GEMM (the tuner may pick another).

    ``overrides`` replaces settings (``{"waves_per_eu": 1}``); two more keys change the
    launch compiled: ``layout``, "NN" (default), "NT" or "TN" (see :func:`.spec.launch_ints`),
    and ``EVEN_K``, False to see the peeled ragged-K step that K=8192 does not need.
    """
    ints, settings = aot_launch_settings(overrides)
    even_k = settings.pop("EVEN_K", None)
    prior = configs.prune(configs.space(backend, arch), ints["M"], ints["N"], ints["K"])[0]
    cfg = with_overrides({**as_dict(prior), "NUM_XCDS": full_chip_xcds(backend, arch)},
                                 settings)
    buckets = {f"{d}_BUCKET": triton.next_power_of_2(ints[d]) for d in "MNK"}
    return [aot_launch(_gemm_autotuned_kernel, dtype, cfg, {**ints, **buckets},
                       constexprs={"EVEN_K": ints["K"] % cfg["BLOCK_K"] == 0 if even_k is None else even_k,
                                   "INTERP_BF16": False})]


@rung(op="gemm", rung=5, name="autotuned", backends=("hip", "cuda", "interpreter"),
      dtypes=DTYPES, interpreter=True, kind="triton", aot=aot)
def gemm_v5(a: torch.Tensor, b: torch.Tensor, *, overrides: dict | None = None) -> torch.Tensor:
    """``overrides`` replaces settings: ``{"NUM_XCDS": 8}`` runs the remap on a CPU; tile
    settings (``BLOCK_M``, ``num_warps``, ...) pin a config and skip the tuner."""
    validate.matmul_operands(a, b, DTYPES)
    (m, k), n = a.shape, b.shape[1]
    c = new_output((m, n), a.dtype, a.device)
    here = _backend.current()
    pinned = _with_overrides(overrides)
    xcds = pinned.pop("NUM_XCDS", num_xcds(here))
    kernel = _gemm_autotuned_kernel
    if pinned:  # skip the tuner: the pruned space's first config, overridden
        best = configs.prune(configs.space(here.name, here.arch), m, n, k)[0]
        pinned, kernel = {**as_dict(best), **pinned}, _gemm_autotuned_kernel.fn

    def grid(meta):
        return (cdiv(m, meta["BLOCK_M"]) * cdiv(n, meta["BLOCK_N"]),)

    kernel[grid](a, b, c, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                 c.stride(0), c.stride(1), *(triton.next_power_of_2(d) for d in (m, n, k)),
                 NUM_XCDS=xcds, INTERP_BF16=interp_bf16(a.dtype),
                 **pinned)
    chosen = pinned or as_dict(_gemm_autotuned_kernel.best_config)
    _CHOSEN[_key((m, n, k), a.dtype)] = {**chosen, "NUM_XCDS": xcds}
    return c
