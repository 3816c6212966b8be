"""The MoE layer ladder's top rung (``moe`` v3, :mod:`kernels.moe.layer_ladder.v3_fused`),
forward and backward, as the sum of its launches (:mod:`.passes`).

Rows per expert: one seed-0 draw of router logits as the op's spec makes them, a standard
normal x·w_e (x ~ N(0, I), w_e of norm near 1) plus the routing's per-expert bias
(:func:`kernels.moe.layer_ladder.spec.expert_bias`), routed as the rung routes them
(:func:`kernels.moe.route`): a skewed routing's hot experts as the layer would see them,
without drawing the inputs themselves (DeepSeek-V3's experts alone are 1.4 G values).
R = T·k sorted rows, S bytes per element.

Forward:
* the router (``F.linear`` in fp32 on x, top-k, the sort of slots): torch, charged the
  larger of its HBM bytes (x read, its fp32 copy written and read) and its FLOPs at the
  spec's fp32 matrix peak; top-k and the sort of R indices are not charged;
* kernel 1, gather + gate/up + SwiGLU: a grouped launch (R, dim, hidden) whose K loop feeds
  two products from one A tile (``products=2``), its programs in super-row order
  (GROUP_M row tiles, then their column panels) over the upper-bound grid, each program
  first loading and scanning the offsets and the surplus ones doing only that (grouped
  GEMM v2's schedule, :mod:`.tile_schedule`), storing h, g and u (its ``aot`` compiles
  ``SAVE``: training);
* kernel 2, down + weighted scatter: a grouped launch (R, hidden, dim) in the same order;
* the k-sum (:mod:`kernels.moe.layer_ladder.slot_sum`): its HBM bytes (R·dim read, T·dim written).

Backward (:mod:`kernels.moe.layer_ladder.v3_backward`): the gathers of dy's and x's rows
(torch ``index_select``), per expert GEMM its grouped GEMM dX and dW launches on grouped
GEMM v4's kernels (the public op's, :mod:`.grouped_gemm_backward`: down's dX and dW, gate's
and up's dW and dX), SwiGLU's derivative, the routing weights' gradient and h·w in one
kernel (:mod:`kernels.moe.layer_ladder.swiglu_backward`), charged its HBM bytes
(:data:`SWIGLU_BACKWARD_ELEMENTS`: each input read and each output written once), and the
k-sum of the two dX results.
"""
from __future__ import annotations

import functools

import torch

from kernels.moe.layer_ladder import configs, spec
from kernels.moe.layer_ladder.v3_fused import GROUP_M
from kernels.moe.routing import route

from .. import isa
from . import chip as chip_model
from . import gemm, grouped_gemm, grouped_gemm_backward, passes, predict_gemm, tile_schedule, tiles
from .pinned import pinned
from .prediction import NotCovered, Prediction
from .tiles import Wave, round_robin

RUNGS = ("v3",)
SHAPE_NAMES = ("T", "dim", "hidden", "E", "top_k")
# HBM bytes of the backward's SwiGLU kernel (kernels.moe.layer_ladder.swiglu_backward), every
# output asked: per (row, hidden) element, elements of x's dtype (dh, g, u, h read; dg, du,
# h·w written); per row, fp32 bytes (the routing weight read, its gradient written)
SWIGLU_BACKWARD_ELEMENTS, SWIGLU_BACKWARD_ROW_BYTES = 7, 8


def check(shape) -> tuple:
    if not isinstance(shape, (tuple, list)) or len(shape) != 6 or shape[5] not in range(len(spec.ROUTINGS)):
        raise ValueError(f"shape must be (T, dim, hidden, E, top_k, routing) with routing in "
                         f"0..{len(spec.ROUTINGS) - 1}, got {shape!r}")
    shape = predict_gemm.check_shape(tuple(shape[:5]), SHAPE_NAMES) + (shape[5],)
    if shape[4] > shape[3]:
        raise ValueError(f"shape {shape!r}: top_k must be at most E")
    return shape


@functools.lru_cache(maxsize=32)
def expert_rows(shape: tuple) -> tuple[int, ...]:
    """Rows each expert gets: one seed-0 draw of logits (standard normal plus the routing's
    expert bias), routed top-k."""
    t, _, _, e, top_k, routing = shape
    gen = torch.Generator().manual_seed(0)
    bias = spec.expert_bias(e, routing, gen).float()
    ids = route(torch.randn(t, e, generator=gen) + bias, top_k)[1]
    return tuple(torch.bincount(ids.reshape(-1).long(), minlength=e).tolist())


def super_row_waves(table: list, rows_grid: int, tiles_n: int, k: int, slots: int, xcds: int,
                    out_bytes: float | None) -> list[Wave]:
    """The real tiles of the upper-bound grid (rows_grid x tiles_n) in super-row order, in waves."""
    order = [(pid, tile) for pid in range(rows_grid * tiles_n)
             if (tile := tiles.grouped(pid, rows_grid, tiles_n, GROUP_M))[0] < len(table)]
    return [Wave(tuple((round_robin(order[u][0], xcds), order[u][1]) for u in ids), k, out_bytes)
            for ids in tiles.waves(len(order), slots)]


def kernel_launch(kernel: str, shape: tuple, sizes: list[int], torch_dtype, dtype: str, chip_spec) -> Prediction:
    """Kernel 1 ("gate_up") or 2 ("down") of the forward."""
    t, dim, hidden, e, top_k, _ = shape
    rows = t * top_k
    n, k = (hidden, dim) if kernel == "gate_up" else (dim, hidden)
    backend = gemm.backend_of(chip_spec.target)
    cfg = dict(pinned() or configs.pruned(backend, chip_spec.target, rows, n, e)[0])   # a tuner's candidate, or the prior
    report = isa.inspect_all("moe", "v3", target=chip_spec.target, dtype=torch_dtype,
                             overrides={**cfg, "kernel": kernel})[0]
    elem, bm, bn = torch_dtype.itemsize, cfg["BLOCK_M"], cfg["BLOCK_N"]
    table = grouped_gemm.row_tiles(list(sizes), bm)
    rows_grid, tiles_n = -(-rows // bm) + e, -(-n // bn)
    products = 2 if kernel == "gate_up" else 1
    out = 3 * bm * bn * elem if kernel == "gate_up" else None     # h, g and u

    def traffic(wave: Wave, xcds: int) -> dict[str, float]:
        return tiles.block_traffic(wave, lambda i: table[i][1], lambda j: products * min(bn, n - j * bn),
                                   lambda i, j: (table[i][0], j), elem, xcds)

    return predict_gemm.tile_launch(
        "moe", "v3", (rows, k, n, e), dtype, chip_spec, report, cfg, None, elem,
        lambda slots, xcds: super_row_waves(table, rows_grid, tiles_n, k, slots, xcds, out),
        traffic, products * 2.0 * rows * k * n, f"moe v3 {kernel}'s untimed choice (configs.pruned)",
        products=products, schedule_of=lambda chip, num_warps: tile_schedule.cost(
            "v2", report, num_warps, rows_grid * tiles_n - len(table) * tiles_n, chip))


def forward_launches(shape, sizes, torch_dtype, dtype, chip_spec, chip) -> tuple[dict, dict]:
    t, dim, hidden, e, top_k, _ = shape
    elem = torch_dtype.itemsize
    router_bytes = t * dim * (elem + 4 + 4) + t * e * 4
    router = max(passes.hbm_seconds(router_bytes, chip), 2.0 * t * dim * e / (chip_spec.peak("fp32") * 1e12))
    launches = {name: kernel_launch(name, shape, sizes, torch_dtype, dtype, chip_spec) for name in configs.KERNELS}
    streams = {"router (torch, fp32)": router}
    if top_k > 1:
        streams["k-sum"] = passes.hbm_seconds((t * top_k + t) * dim * elem, chip)
    return launches, streams


def backward_launches(shape, sizes, torch_dtype, dtype, chip_spec, chip) -> tuple[dict, dict]:
    t, dim, hidden, e, top_k, _ = shape
    rows, elem = t * top_k, torch_dtype.itemsize
    down = (rows, hidden, dim, e)          # the forward problems of the three expert GEMMs
    gate_up = (rows, dim, hidden, e)
    args = (list(sizes), torch_dtype, dtype, chip_spec)
    gate_up_dw = grouped_gemm_backward.dw_launch("v4", gate_up, *args)   # gate and up: one problem,
    gate_up_dx = grouped_gemm_backward.dx_launch("v4", gate_up, *args)   # predicted once, launched twice
    launches = {"down dW": grouped_gemm_backward.dw_launch("v4", down, *args),
                "down dX": grouped_gemm_backward.dx_launch("v4", down, *args),
                "gate dW": gate_up_dw, "up dW": gate_up_dw, "gate dX": gate_up_dx, "up dX": gate_up_dx}
    streams = {"gathers of dy and x (torch)": passes.hbm_seconds(4 * rows * dim * elem, chip)}
    streams["SwiGLU backward kernel"] = passes.hbm_seconds(
        rows * (hidden * SWIGLU_BACKWARD_ELEMENTS * elem + SWIGLU_BACKWARD_ROW_BYTES), chip)
    streams["k-sum of the dX results"] = passes.hbm_seconds((2 * rows + t) * dim * elem, chip)
    return launches, streams


def _predict(label: str, shape, dtype: str, chip_spec, backward: bool) -> Prediction:
    shape = check(shape)
    torch_dtype = predict_gemm.check_dtype(dtype, "MoE")
    if label not in RUNGS:
        raise NotCovered(f"the model covers moe rungs {', '.join(RUNGS)}, not {label}")
    sizes = expert_rows(shape)
    chip = chip_model.chip(chip_spec, dtype)[0]
    build = backward_launches if backward else forward_launches
    launches, streams = build(shape, sizes, torch_dtype, dtype, chip_spec, chip)
    inputs = {"pass": ("backward" if backward else "forward", "kernels.moe.layer_ladder.v3_fused"),
              "rows per expert": (list(sizes), f"routing {spec.ROUTINGS[shape[5]]!r}: one seed-0 draw of logits "
                                  "(N(0, 1) plus the spec's expert bias), routed (model input)")}
    flops = spec.backward_flops(shape) if backward else spec.flops(shape)
    return passes.total("moe", label, shape, dtype, chip_spec.name, launches, streams, flops, inputs)


def launch(label: str, kernel: str, shape, dtype: str, chip_spec) -> Prediction:
    """One tuned launch of v3's forward, "gate_up" or "down", as its tuner names it."""
    shape = check(shape)
    if label not in RUNGS or kernel not in configs.KERNELS:
        raise NotCovered(f"the model covers moe v3's launches {', '.join(configs.KERNELS)}, not {label} {kernel!r}")
    return kernel_launch(kernel, shape, expert_rows(shape), predict_gemm.check_dtype(dtype, "MoE"), dtype, chip_spec)


def predict(label: str, shape, dtype: str, chip_spec) -> Prediction:
    """MoE rung ``label``'s forward at ``shape`` (T, dim, hidden, E, top_k, routing)."""
    return _predict(label, shape, dtype, chip_spec, False)


def predict_backward(label: str, shape, dtype: str, chip_spec) -> Prediction:
    """MoE rung ``label``'s backward at ``shape``, from what its forward saved."""
    return _predict(label, shape, dtype, chip_spec, True)
