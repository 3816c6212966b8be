"""What a GEMM rung launches at one shape: the config it picks, the compile that shows its
loop, and which tile each program computes, wave after wave.

The configs come from the rungs themselves (their ``config`` functions, v5's and v6's
pruned prior for the shape, v6's split schedule), for the target's backend ("hip" on
gfx*, "cuda" on sm_90: :func:`backend_of`), so a change to a rung's choice changes the
prediction. The tile orders mirror the kernels: v2's 2-D grid walks
tile rows fastest (the dispatcher is taken to deal workgroups x-fastest: assumption); v3 to v5 remap program ids so each XCD gets a contiguous run,
then walk ``GROUP_M`` rows per group; v6's persistent programs take units in turn, the
split units write fp32 partial tiles, and its fixup kernel is a last wave without a K
loop that reads them. split-K (beside v6) launches ``tiles x S`` programs, slice by
slice, each writing an fp32 partial tile over ``K / S``, then the same fixup over every tile.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import triton

from kernels import backend as _backend
from kernels.gemm import configs, split_k, v2_triton_tile, v3_grouped_order, v4_lds_pipeline, v6_persistent
from kernels.tuning import as_dict
from kernels.xcd import full_chip_xcds

from .pinned import pinned
from .tiles import Wave, grouped, round_robin, waves

RUNGS = ("v2", "v3", "v4", "v5", "v6", "split_k")


@dataclass(frozen=True)
class GemmPlan:
    """One rung at one shape: settings to compile with, and its programs in waves."""

    rung: str
    cfg: dict                 # BLOCK_M/N/K, GROUP_M, num_warps, num_stages, AMD knobs
    overrides: dict           # what the ISA inspector's compile gets (the rung's aot settings)
    persistent: int | None    # programs of a persistent launch (v6), else None

    def waves(self, shape: tuple[int, int, int], slots: int, xcds: int) -> list[Wave]:
        """The programs that run together, for ``slots`` resident programs on the chip."""
        m, n, k = shape
        bm, bn = self.cfg["BLOCK_M"], self.cfg["BLOCK_N"]
        tiles_m, tiles_n = -(-m // bm), -(-n // bn)
        total = tiles_m * tiles_n
        if self.persistent is not None:
            return _persistent_waves(self.cfg, self.persistent, shape, tiles_m, tiles_n, xcds)
        if self.rung == "split_k":
            return _split_k_waves(self.cfg, shape, tiles_m, tiles_n, slots, xcds)
        if self.rung == "v2":
            def tile(i: int) -> tuple[int, int]:
                return i % tiles_m, i // tiles_m
        else:
            tile = v3_order(self.cfg, tiles_m, tiles_n)
        return [Wave(tuple((round_robin(i, xcds), tile(i)) for i in ids), k)
                for ids in waves(total, slots)]


def v3_order(cfg: dict, tiles_m: int, tiles_n: int) -> Callable[[int], tuple[int, int]]:
    """The tile program ``i`` of a 1-D grid computes in gemm v3's order (v4, v5 and the FP8
    GEMM's too): the XCD remap (``NUM_XCDS``), then grouped order (``GROUP_M`` row tiles)."""
    total, remap = tiles_m * tiles_n, cfg["NUM_XCDS"]

    def tile(i: int) -> tuple[int, int]:
        pid = v3_grouped_order.xcd_remap(i, total, remap) if remap > 1 else i
        return grouped(pid, tiles_m, tiles_n, cfg["GROUP_M"])
    return tile


def _persistent_waves(cfg: dict, programs: int, shape, tiles_m: int, tiles_n: int, xcds: int) -> list[Wave]:
    """v6: program p takes units p, p + P, ...; the data-parallel units are whole tiles in
    grouped order, the split units K ranges of the tail's tiles."""
    m, n, k = shape
    plan = v6_persistent.schedule(m, n, k, cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"], programs)
    remap_xcds = cfg["NUM_XCDS"]
    hardware = {(v3_grouped_order.xcd_remap(h, programs, remap_xcds) if remap_xcds > 1 else h): h
                for h in range(programs)}   # remapped program id -> hardware id

    def placed(units: range, tile_of) -> tuple:
        return tuple((round_robin(hardware[u % programs], xcds),
                      grouped(tile_of(u), tiles_m, tiles_n, cfg["GROUP_M"])) for u in units)

    out = [Wave(placed(ids, lambda u: u), k) for ids in waves(plan.dp_tiles, programs)]
    if plan.sk_tiles:
        partial = cfg["BLOCK_M"] * cfg["BLOCK_N"] * 4   # an fp32 tile to the workspace
        units = range(plan.dp_tiles, plan.dp_tiles + plan.sk_tiles * plan.splits)
        out.append(Wave(placed(units, lambda u: plan.dp_tiles + (u - plan.dp_tiles) // plan.splits),
                        plan.split_k, out_bytes=partial))
        # the fixup kernel: one program per tail tile, no K loop, reads its partials
        fixup = range(plan.sk_tiles)
        out.append(Wave(tuple((round_robin(t, xcds), grouped(plan.dp_tiles + t, tiles_m, tiles_n, cfg["GROUP_M"]))
                              for t in fixup), 0, read_bytes=plan.splits * partial))
    return out


def _split_k_waves(cfg: dict, shape, tiles_m: int, tiles_n: int, slots: int, xcds: int) -> list[Wave]:
    """split-K: the grid (tiles, S) dispatched tile-fastest (hardware id = tile + tiles x s),
    every program over one slice's K (the shorter last slice charged in full) writing an
    fp32 partial tile; then the fixup, one program per tile reading its S partials."""
    k, tiles = shape[2], tiles_m * tiles_n
    s, block_k = cfg["SLICES"], cfg["BLOCK_K"]
    slice_k = -(-(-(-k // block_k)) // s) * block_k
    partial = cfg["BLOCK_M"] * cfg["BLOCK_N"] * 4

    def placed(ids) -> tuple:
        return tuple((round_robin(i, xcds), grouped(i % tiles, tiles_m, tiles_n, cfg["GROUP_M"])) for i in ids)

    return ([Wave(placed(ids), slice_k, out_bytes=partial) for ids in waves(tiles * s, slots)]
            + [Wave(placed(ids), 0, read_bytes=s * partial) for ids in waves(tiles, slots)])


def backend_of(arch: str) -> str:
    """The kernels' backend name for a target: "hip" for gfx*, "cuda" for sm_*."""
    return "hip" if arch.startswith("gfx") else "cuda"


def plan(rung: str, shape: tuple[int, int, int], arch: str, compute_units: int,
         dtype: torch.dtype | None = None) -> GemmPlan:
    """The config ``rung`` runs at ``shape`` in ``dtype`` on an ``arch`` GPU with ``compute_units``
    CUs (for the tuned rungs v5 and v6: a config :func:`.candidates.predict_config` pinned; else
    their prior from the table section of ``dtype``, :func:`kernels.tuning.section`)."""
    m, n, k = shape
    backend = backend_of(arch)
    candidate = pinned()
    if candidate is not None and rung not in ("v5", "v6"):
        raise NotImplementedError(f"gemm {rung} is not tuned: it has no candidate configs to predict")
    if rung == "v2":
        return GemmPlan(rung, v2_triton_tile.config(backend), {}, None)
    if rung == "v3":
        return GemmPlan(rung, v3_grouped_order.config(backend, arch), {}, None)
    if rung == "v4":
        return GemmPlan(rung, v4_lds_pipeline.config(backend, arch), {}, None)
    if rung == "v5":
        prior = candidate or as_dict(configs.prune(configs.space(backend, arch, dtype), m, n, k)[0])
        even_k = k % prior["BLOCK_K"] == 0
        return GemmPlan(rung, {**prior, "NUM_XCDS": full_chip_xcds(backend, arch)},
                        {**prior, "EVEN_K": even_k}, None)
    if rung == "v6":
        device = _backend.Backend(backend, arch, "model", compute_units)
        xcds = full_chip_xcds(backend, arch)
        cfg = ({**candidate, **v6_persistent.persistent_settings(device, xcds)} if candidate
               else v6_persistent.config(device, m, n, k, xcds=xcds, dtype=dtype))
        cfg.pop("FIXUP")
        tile = {key: value for key, value in cfg.items() if key not in v6_persistent.PERSISTENT}
        return GemmPlan(rung, cfg, {**tile, "NUM_PROGS": cfg["NUM_PROGS"],
                                    "EVEN_K": k % cfg["BLOCK_K"] == 0}, cfg["NUM_PROGS"])
    if rung == "split_k":
        cfg = split_k.config(_backend.Backend(backend, arch, "model", compute_units), m, n, k, dtype)
        return GemmPlan(rung, cfg, {**cfg, "EVEN_K": k % cfg["BLOCK_K"] == 0}, None)
    raise NotImplementedError(f"the model covers GEMM rungs {', '.join(RUNGS)}, not {rung!r}")


def steps_per_iteration(cfg: dict, num_warps: int, flops_per_wave_iteration: int) -> int:
    """K steps of ``cfg``'s tile one loop iteration covers (the compiler may unroll the K loop),
    over the compiled kernel's ``num_warps`` (its report's, not a stated config's)."""
    per_step = 2 * cfg["BLOCK_M"] * cfg["BLOCK_N"] * cfg["BLOCK_K"]
    steps, rest = divmod(flops_per_wave_iteration * num_warps, per_step)
    if rest or steps < 1:
        raise ValueError(f"the hot loop's {flops_per_wave_iteration} FLOP per wave is not a whole number "
                         f"of {cfg['BLOCK_M']}x{cfg['BLOCK_N']}x{cfg['BLOCK_K']} K steps")
    return steps


def trips(k: int, cfg: dict, steps: int) -> int:
    """Loop iterations a program runs over ``k`` (a ragged last step counted whole)."""
    return triton.cdiv(k, cfg["BLOCK_K"] * steps)
