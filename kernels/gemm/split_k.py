"""split-K beside v6: K cut into S slices over a second grid axis, reduced in a second pass.

Idea:
    The classic answer to a GEMM with too few output tiles for the chip (skinny M x N,
    long K: 512 x 1024 in 128 x 128 tiles is 32 tiles for MI300X's 304 CUs). The grid
    gets a second axis, the K slice: program ``(tile, s)`` walks K elements
    ``[s * SLICE_K, (s + 1) * SLICE_K)`` of one tile (``SLICE_K`` whole ``BLOCK_K``
    steps) and writes its fp32 accumulator tile to a workspace of ``tiles x S`` tiles.
    A second launch, v6's fix-up kernel as it is (every tile counted as a split
    "tail" tile), adds each tile's S partial tiles in slice order, rounds once and
    stores C. :func:`slices` picks S so that ``tiles x S`` fills the CUs once, at most
    one slice per K step.

    Why a variant beside v6 and not a rung: v6 already splits K, and only where it
    pays, the tail tiles that would leave CUs idle; for a shape with fewer tiles than
    CUs its schedule is this one (every tile split, :func:`kernels.gemm.v6_persistent.
    schedule`). Split-K splits every tile by one S for the whole launch, so a shape
    with more tiles than CUs pays the workspace for all of them. As v7 it would be a
    step down the ladder and undo v6's idea in its diff; beside v6 it is the
    comparison a GEMM engineer makes (``kernels.get("gemm", "split_k")``; off the
    ladder tables, see :attr:`kernels.registry.Rung.beside`).

    Why a workspace and not ``atomic_add`` into C: fp32 addition is not associative,
    and atomics add the S partials in the order they land, which changes from run to
    run on a GPU, so C would not be bitwise reproducible (:func:`partials` returns the
    workspace, so the order dependence can be shown on the very partials of a launch).
    Atomics would also need a zeroed fp32 C and a cast pass for 16-bit outputs. The
    reduce pass adds in slice order: the same bits every run.

Why faster:
    With ``tiles < CUs`` a one-program-per-tile launch keeps ``CUs - tiles`` CUs idle
    for the whole K loop; S slices put ``tiles x S`` programs to work, each on ``K / S``
    (model: ``workbench.model.predict("gemm", "split_k", ...)``; no GPU measured here).

Expected bound:
    What it costs, from the traffic: the workspace is written and read once,
    ``2 x S x tiles x BLOCK_M x BLOCK_N x 4`` bytes beside A, B (``(M + N) x K``
    elements) and C, plus a second launch. It pays while that is small against the
    time the idle CUs would cost: skinny M x N, long K.

Limits:
    Untuned (v6's prior tile for the shape), no XCD remap, no pipelining beyond what the
    tile config's ``num_stages`` gives. S is one number for every tile; v6's stream-K
    splits the tail only. ``SLICES`` in ``overrides`` pins S (clamped to the K steps).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import backend as _backend
from .. import validate
from ..outputs import new_output
from ..registry import AotKernel, rung
from ..triton_support import aot_launch, cdiv, interp_bf16
from ..tuning import with_overrides
from . import v6_persistent
from .spec import aot_launch_settings
from .tile_dot import tile_dot
from .v6_persistent import _streamk_fixup_kernel, _tile_coords

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def _split_k_kernel(a_ptr, b_ptr, p_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, SLICE_K,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    GROUP_M: tl.constexpr, EVEN_K: tl.constexpr, INTERP_BF16: tl.constexpr):
    tile = tl.program_id(0)
    s = tl.program_id(1)            # the K slice: the second grid axis
    k_lo = s * SLICE_K
    k_hi = tl.minimum(K, k_lo + SLICE_K)
    pid_m, pid_n = _tile_coords(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    acc = tile_dot(a_ptr, b_ptr, pid_m, pid_n, M, N, k_lo, k_hi, stride_am, stride_ak, stride_bk, stride_bn,
                   BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, INTERP_BF16)   # v6's K loop, shared
    # the fix-up's layout: tile t's slices are partial tiles t * S .. t * S + S - 1
    offs = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    slot = tile.to(tl.int64) * tl.num_programs(1) + s
    tl.store(p_ptr + slot * (BLOCK_M * BLOCK_N) + offs, acc)


def slices(m: int, n: int, k: int, block_m: int, block_n: int, block_k: int, compute_units: int) -> int:
    """S: enough K slices for ``tiles x S`` to fill the CUs once, at most one per K step,
    and no empty slice (S is rounded so that every slice has work)."""
    tiles = cdiv(m, block_m) * cdiv(n, block_n)
    return clamp_slices(compute_units // tiles, k, block_k)


def clamp_slices(wanted: int, k: int, block_k: int) -> int:
    """``wanted`` slices made legal: 1 to the K steps, and none of them empty."""
    steps = cdiv(k, block_k)
    wanted = min(max(wanted, 1), steps)
    return cdiv(steps, cdiv(steps, wanted))


def config(backend: _backend.Backend, m: int, n: int, k: int, dtype: torch.dtype | None = None) -> dict:
    """v6's prior tile for the shape and dtype (no tuning: a teaching variant) and S for the backend's CUs."""
    cfg = v6_persistent.config(backend, m, n, k, dtype=dtype)
    cfg = {key: value for key, value in cfg.items() if key not in v6_persistent.PERSISTENT}
    return {**cfg, "SLICES": slices(m, n, k, cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"],
                                     v6_persistent.programs(backend))}


def _settings(m: int, n: int, k: int, overrides: dict | None, backend: _backend.Backend,
              dtype: torch.dtype | None = None) -> dict:
    cfg = with_overrides(config(backend, m, n, k, dtype), overrides)
    cfg["SLICES"] = clamp_slices(cfg["SLICES"], k, cfg["BLOCK_K"])
    return cfg


def aot(dtype: torch.dtype, backend: str, arch: str, overrides: dict | None = None) -> list[AotKernel]:
    """Both launches at an 8192^3 GEMM (the ISA inspector's shape) with S from MI300X's
    304 CUs (H100's 132 SMs on sm90); ``overrides`` replaces settings (``SLICES`` too)."""
    ints, settings = aot_launch_settings(overrides)
    even_k = settings.pop("EVEN_K", None)
    units = 304 if backend == "hip" else 132
    cfg = _settings(ints["M"], ints["N"], ints["K"], settings,
                    _backend.Backend(backend, arch, "aot", units), dtype)
    s = cfg.pop("SLICES")
    slice_k = cdiv(cdiv(ints["K"], cfg["BLOCK_K"]), s) * cfg["BLOCK_K"]
    main = {key: ints[key] for key in ("M", "N", "K", "stride_am", "stride_ak", "stride_bk", "stride_bn")}
    fixup = {key: ints[key] for key in ("M", "N", "stride_cm", "stride_cn")}
    return [aot_launch(_split_k_kernel, dtype, cfg, {**main, "SLICE_K": slice_k},
                       constexprs={"EVEN_K": ints["K"] % cfg["BLOCK_K"] == 0 if even_k is None else even_k,
                                   "INTERP_BF16": False},
                       pointers={"p_ptr": "*fp32"}),
            aot_launch(_streamk_fixup_kernel, dtype,
                       {**{key: cfg[key] for key in ("BLOCK_M", "BLOCK_N", "GROUP_M")},
                        "num_warps": cfg["num_warps"], "num_stages": 1},
                       {**fixup, "DP_TILES": 0, "SPLITS": s, "stride_bias": 0},
                       constexprs={"INTERP_BF16": False, "HAS_BIAS": False},
                       pointers={"p_ptr": "*fp32"})]


def partials(a: torch.Tensor, b: torch.Tensor, cfg: dict) -> torch.Tensor:
    """The main launch alone: the fp32 workspace, ``(tiles, S, BLOCK_M, BLOCK_N)``, tile t in
    v3's grouped order. Allocated as an output, so the harness's poison shows a slice never written."""
    (m, k), n = a.shape, b.shape[1]
    cfg = dict(cfg)
    s = cfg.pop("SLICES")
    bm, bn, bk = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]
    tiles = cdiv(m, bm) * cdiv(n, bn)
    work = new_output((tiles, s, bm, bn), torch.float32, a.device)
    _split_k_kernel[(tiles, s)](
        a, b, work, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
        cdiv(cdiv(k, bk), s) * bk, EVEN_K=k % bk == 0, INTERP_BF16=interp_bf16(a.dtype), **cfg)
    return work


@rung(op="gemm", rung=6, name="split_k", backends=("hip", "cuda", "interpreter"), dtypes=DTYPES,
      interpreter=True, kind="triton", aot=aot, beside=True)
def gemm_split_k(a: torch.Tensor, b: torch.Tensor, *, overrides: dict | None = None) -> torch.Tensor:
    """``overrides`` replaces settings, e.g. ``{"SLICES": 4}``."""
    validate.matmul_operands(a, b, DTYPES)
    (m, k), n = a.shape, b.shape[1]
    c = new_output((m, n), a.dtype, a.device)
    cfg = _settings(m, n, k, overrides, _backend.current(), a.dtype)
    work = partials(a, b, cfg)
    _streamk_fixup_kernel[(work.shape[0],)](   # no bias: c stands in for its pointer, never read
        c, work, c, m, n, c.stride(0), c.stride(1), 0, cfg["SLICES"], 0,
        BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], GROUP_M=cfg["GROUP_M"], HAS_BIAS=False,
        INTERP_BF16=interp_bf16(a.dtype), num_warps=cfg["num_warps"])
    return c
