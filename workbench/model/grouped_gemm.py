"""The grouped GEMM ladder (one GEMM per expert): the GEMM model per expert group, with
the tiles of every group laid out as each rung launches them.

The rows per group come from the shape's routing (:func:`kernels.moe.grouped_gemm.spec.group_sizes`
with a seed-0 generator: balanced is exact, the other routings one draw of theirs). Each
group's rows split into row tiles of ``BLOCK_M`` (a group's last tile partial); a tile
reads its rows of x and one column block of its own expert's w, so tiles of one expert
share w blocks and tiles of one row block share x.

* v1 launches GEMM v4's kernel, with GEMM v4's settings for the target, once per
  non-empty expert: each launch's tiles in GEMM v4's order make their own waves (wave
  quantization paid per expert); the host read of the offsets and the launch gaps between
  experts are not modelled.
* v2 launches once: row tiles of every group (in group order) fastest, then column tiles;
  every program first loads and scans the offsets, and the surplus programs of its
  upper-bound grid do only that (:mod:`.tile_schedule`, weighed from the compiled code).
* v4 launches one persistent program per CU (SM on NVIDIA) walking units (row tile,
  column tile) in turn, with GEMM v3's XCD remap on AMD (none on NVIDIA: no XCDs), scanning
  the offsets once and locating each unit's group; its tile is the untimed prior for the
  shape.
"""
from __future__ import annotations

import torch
import triton

from kernels import backend as _backend
from kernels.gemm import v4_lds_pipeline
from kernels.gemm.v6_persistent import programs
from kernels.moe.grouped_gemm import launch as grouped_launch
from kernels.moe.grouped_gemm import spec, v4_persistent
from kernels.gemm.v3_grouped_order import xcd_remap
from kernels.xcd import full_chip_xcds

from .. import isa
from . import gemm, predict_gemm, tile_schedule, tiles
from .pinned import pinned
from .prediction import NotCovered, Prediction
from .tiles import Wave, round_robin

RUNGS = ("v1", "v2", "v4")
SHAPE_NAMES = ("T", "K", "N", "G", "routing")


def group_rows(shape: tuple) -> list[int]:
    """Rows per group for the shape's routing (one seed-0 draw; balanced is exact)."""
    t, _, _, g, routing = shape
    return spec.group_sizes(t, g, routing, torch.Generator().manual_seed(0)).tolist()


def row_tiles(sizes: list[int], bm: int) -> list[tuple[int, int]]:
    """(group, rows) of every row tile, in group order."""
    return [(g, min(bm, size - start)) for g, size in enumerate(sizes) for start in range(0, size, bm)]


KERNELS = {"forward": 0, "dx": 1, "dw": 2}   # a rung's aot launches, in order (v2, v4)


def config(rung: str, shape: tuple, arch: str, compute_units: int, kernel: str = "forward",
           dtype: torch.dtype | None = None) -> tuple[dict, dict]:
    """(the rung's settings for ``kernel`` at the launch's ``shape`` on an ``arch`` GPU of
    ``compute_units`` CUs (SMs), what the ISA inspector's compile gets): the choice the rung
    makes on that target's backend ("hip" or "cuda", :func:`.gemm.backend_of`), so no AMD knob
    reaches an NVIDIA compile. ``kernel``: "forward", "dx" (the forward kernel on wᵀ: ``shape``
    is then the dX launch's, K and N swapped) or "dw" (v2, v4 only). v4's tile: a tuner's
    candidate where one is pinned (:func:`.candidates.predict_config`), else its untimed prior;
    its persistent settings as it launches them: one program per CU (SM), GEMM v3's XCD remap
    over the chip's XCDs (none on NVIDIA)."""
    tile = pinned()
    if tile is not None and rung != "v4":
        raise NotImplementedError(f"grouped_gemm {rung} is not tuned: it has no candidate configs to predict")
    backend = gemm.backend_of(arch)
    if rung == "v1":
        return v4_lds_pipeline.config(backend, arch), {}
    if rung == "v2":
        return grouped_launch.config(backend, arch), {}
    t, k, n, g = shape[:4]
    if kernel == "dw":
        cfg = dict(tile or v4_persistent.prior("dw", backend, arch, t, k, n, g, dtype))
        return cfg, {**cfg, "kernel": "dw"}
    device = _backend.Backend(backend, arch, "model", compute_units)
    cfg = {**(tile or v4_persistent.prior("forward", backend, arch, t, k, n, g, dtype)),
           "NUM_XCDS": full_chip_xcds(backend, arch), "NUM_PROGS": programs(device)}
    return cfg, {**cfg, "kernel": kernel}


def compiled(rung: str, kernel: str, shape: tuple, torch_dtype: torch.dtype, arch: str, compute_units: int):
    """(settings, the ISA report) of ``rung``'s ``kernel`` launch at ``shape``, compiled ahead of time."""
    cfg, overrides = config(rung, shape, arch, compute_units, kernel, torch_dtype)
    if overrides:   # the launch its settings name, compiled alone
        return cfg, isa.inspect_all("grouped_gemm", rung, target=arch, dtype=torch_dtype, overrides=overrides)[0]
    return cfg, isa.inspect_launch("grouped_gemm", rung, KERNELS[kernel], target=arch, dtype=torch_dtype)


def waves(rung: str, cfg: dict, shape: tuple, table: list[tuple[int, int]], sizes: list[int],
          slots: int, xcds: int, arch: str, compute_units: int, out_bytes: float | None = None) -> list[Wave]:
    """The tiles each rung runs together, as (XCD, (row tile index in ``table``, column tile));
    ``out_bytes``: what each program stores, if not its tile in the operands' dtype."""
    k, n = shape[1:3]
    tiles_n = triton.cdiv(n, cfg["BLOCK_N"])
    if rung == "v1":
        out, first = [], 0
        for size in sizes:
            if size:
                plan = gemm.plan("v4", (size, n, k), arch, compute_units)   # GEMM v4's config: ``cfg``
                out += [Wave(tuple((x, (first + i, j)) for x, (i, j) in w.placed), k)
                        for w in plan.waves((size, n, k), slots, xcds)]
                first += triton.cdiv(size, cfg["BLOCK_M"])
        return out
    if rung == "v2":
        rows_grid = triton.cdiv(sum(sizes), cfg["BLOCK_M"]) + len(sizes)
        order = [(r + c * rows_grid, (r, c)) for c in range(tiles_n) for r in range(len(table))]
        return [Wave(tuple((round_robin(order[u][0], xcds), order[u][1]) for u in ids), k, out_bytes)
                for ids in tiles.waves(len(order), slots)]
    count, remap = cfg["NUM_PROGS"], cfg["NUM_XCDS"]
    hardware = {xcd_remap(h, count, remap): h for h in range(count)}
    return [Wave(tuple((round_robin(hardware[u % count], xcds), divmod(u, tiles_n)) for u in ids), k)
            for ids in tiles.waves(len(table) * tiles_n, count)]


def check(shape) -> tuple:
    """(T, K, N, G, routing), checked."""
    if not isinstance(shape, (tuple, list)) or len(shape) != 5 or shape[4] not in range(len(spec.ROUTINGS)):
        raise ValueError(f"shape must be (T, K, N, G, routing) with routing in 0..{len(spec.ROUTINGS) - 1}, "
                         f"got {shape!r}")
    return predict_gemm.check_shape(tuple(shape[:4]), SHAPE_NAMES[:4]) + (shape[4],)


def tile_prediction(op: str, label: str, shape: tuple, sizes: list[int], cfg: dict, report, dtype: str,
                    chip_spec, elem: int, out_elem: int, flops: float, config_source: str,
                    schedule: str | None = None, **extra_inputs) -> Prediction:
    """A grouped launch of rung ``label`` over groups of ``sizes`` rows at ``shape`` (T, K, N,
    G, ...), operands of ``elem`` bytes, outputs of ``out_elem``, its tiles laid out as grouped
    GEMM's ``schedule`` (v1, v2 or v4; default ``label``) launches them."""
    schedule = schedule or label
    table = row_tiles(sizes, cfg["BLOCK_M"])
    n, bn = shape[2], cfg["BLOCK_N"]
    out = None if out_elem == elem else cfg["BLOCK_M"] * bn * out_elem

    def traffic(wave: Wave, xcds: int) -> dict[str, float]:
        return tiles.block_traffic(wave, lambda i: table[i][1], lambda j: min(bn, n - j * bn),
                                   lambda i, j: (table[i][0], j), elem, xcds)

    units = len(table) * triton.cdiv(n, bn)
    surplus = {"v2": (triton.cdiv(sum(sizes), cfg["BLOCK_M"]) + len(sizes)) * triton.cdiv(n, bn) - units,
               "v4": max(cfg.get("NUM_PROGS", 0) - units, 0)}.get(schedule, 0)
    return predict_gemm.tile_launch(
        op, label, shape, dtype, chip_spec, report, cfg, cfg.get("NUM_PROGS") if schedule == "v4" else None,
        out_elem, lambda slots, xcds: waves(schedule, cfg, shape, table, sizes, slots, xcds, chip_spec.target,
                                            chip_spec.compute_units, out),
        traffic, flops, config_source,
        schedule_of=lambda chip, num_warps: tile_schedule.cost(schedule, report, num_warps, surplus, chip),
        **extra_inputs,
        **{"row tiles": (len(table), "model: each group's rows in BLOCK_M tiles")})


def predict(label: str, shape, dtype: str, chip_spec) -> Prediction:
    """Grouped GEMM rung ``label`` at ``shape`` (T, K, N, G, routing)."""
    shape = check(shape)
    torch_dtype = predict_gemm.check_dtype(dtype, "grouped GEMM")
    if label not in RUNGS:
        raise NotCovered(f"the model covers grouped_gemm rungs {', '.join(RUNGS)}, not {label}")
    cfg, report = compiled(label, "forward", shape, torch_dtype, chip_spec.target, chip_spec.compute_units)
    sizes = group_rows(shape)
    return tile_prediction(
        "grouped_gemm", label, shape, sizes, cfg, report, dtype, chip_spec, torch_dtype.itemsize,
        torch_dtype.itemsize, spec.flops(shape), f"grouped_gemm {label}'s choice for this shape"
        + (" (v4's untimed prior)" if label == "v4" else ""),
        **{"rows per group": (sizes, f"routing {spec.ROUTINGS[shape[4]]!r}, one seed-0 draw (model input)")})
