"""MoE exercises: grouped GEMM, FP8 and MXFP8 grouped GEMM, the MoE layer.

Routings matter here: the harness draws a fresh routing per check, so each exercise
checks shapes where experts are empty (routings "sparse" and "one_group"), since most
mistakes of this ladder (an expert index that skips empty experts, a tile past its
expert's rows) only show there. The one-launch rungs are also run once under
:func:`~workbench.learn.exercises.races.triton_store_races`: on the CPU a tile that strays into
the next expert's rows is overwritten by its owner and passes every numeric check.
"""
from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

import torch

import kernels

from .. import learner, source
from ..grading import dtype_name, harness_verdict
from ..model import KernelExercise, Verdict
from ..races import ProgramRace, triton_store_races

_MX = "kernels.moe.grouped_gemm_mxfp8.v0_one_launch"
# (T, K, N, G, routing): odd sizes; "sparse" (half the experts empty) and "one_group".
EMPTY_EXPERTS = ((70, 40, 24, 8, 3), (50, 48, 33, 8, 2))


def _exercise(key: str) -> KernelExercise:
    from .. import get
    return get(key)


def _race_verdict(entry, shape, dtype) -> Verdict | None:
    """A failing verdict if two programs of one launch store one element (CPU only)."""
    if kernels.backend.current().is_gpu:
        return None
    inputs = kernels.spec(entry.op).make_inputs(shape, dtype, seed=0)
    try:
        with triton_store_races():
            entry(*inputs)
    except Exception as error:  # the interpreter wraps the race in its own error
        race = error
        while race is not None and not isinstance(race, ProgramRace):
            race = race.__cause__
        if race is None:
            raise
        return Verdict(False, f"at shape {shape}, {dtype_name(dtype)}: {race}")
    return None


def _harness_and_races(key: str):
    """The harness's verdict, then the race check at the exercise's first shape."""
    def grade(module, captured) -> Verdict:
        exercise = _exercise(key)
        verdict = harness_verdict(exercise, captured)
        if not verdict.passed:
            return verdict
        entry = next(r for r in captured if r.op == exercise.op and r.label == exercise.rung)
        dtype = exercise.dtypes[0] if exercise.dtypes else entry.dtypes[0]
        return _race_verdict(entry, exercise.shapes[0], dtype) or replace(
            verdict, message=verdict.message + "; no two programs store one element")
    return grade


_SCHEDULE_IMPORT = "from kernels.moe.grouped_gemm.schedule import group_tiles, locate"


def _schedule_in_v2(module, captured) -> Verdict:
    """The learner's schedule is a helper, not a rung: grade it inside v2's kernel.

    v2's source is rendered with its schedule import pointing at the learner's module
    (already imported, under its fresh name), imported as a learner file, and that v2
    faces the harness and the race check."""
    exercise = replace(_exercise("grouped_gemm/v2"), op="grouped_gemm", rung="v2")
    text = source.render("kernels.moe.grouped_gemm.v2_one_launch")
    if _SCHEDULE_IMPORT not in text:
        raise RuntimeError(f"v2_one_launch no longer has the line {_SCHEDULE_IMPORT!r}; "
                           f"update workbench.learn.exercises.catalog.moe")
    mine = (f"import importlib\n_schedule = importlib.import_module({module.__name__!r})\n"
            f"group_tiles, locate = _schedule.group_tiles, _schedule.locate")
    with tempfile.TemporaryDirectory() as folder:
        host = Path(folder) / "grouped_gemm_v2_on_your_schedule.py"
        host.write_text(text.replace(_SCHEDULE_IMPORT, mine), encoding="utf-8")
        try:
            _, rungs = learner.import_file(host, "grouped_gemm")
        except learner.LearnerError as error:
            return Verdict(False, str(error))
        verdict = harness_verdict(exercise, rungs)
        if not verdict.passed:
            return verdict
        race = _race_verdict(rungs[0], exercise.shapes[0], exercise.dtypes[0])
    # No model line: the graded v2 lived in a folder that is gone, and the learner's part is
    # its schedule, which the model does not see.
    return race or replace(verdict, message=verdict.message + "; every tile stays in its expert's rows",
                           predict=None)


EXERCISES = (
    KernelExercise(
        key="grouped_gemm/v0", module="kernels.moe.grouped_gemm.v0_loop", op="grouped_gemm", rung="v0",
        title="The grouped GEMM as a loop over experts",
        task="Write the grouped GEMM as a Python loop over the experts: offsets holds each "
             "group's cumulative row end (torch._grouped_mm's offs), so group g owns rows "
             "offsets[g-1]:offsets[g] of x and out. For every group with rows, multiply its "
             "slice of x by its weight w[g] into the same rows of out.",
        todo={"loop": 'raise NotImplementedError("TODO: one matmul per expert over its rows of x")'},
        hints=(
            "offsets[g] is where group g's rows end (exclusive); group g starts where group g-1 "
            "ended, group 0 at row 0. group_bounds(offsets) reads them on the host as "
            "(start, end) pairs.",
            "An expert no token chose repeats the previous end (start == end): it has no rows, "
            "but it still owns w[g], so the expert index must count it.",
            "for g, (start, end) in enumerate(group_bounds(offsets)): if end > start: "
            "out[start:end] = x[start:end] @ w[g]",
        ),
        wrong={
            "offsets read as group starts": {"loop": '''
ends = offsets.tolist()
for g in range(len(ends) - 1):
    out[ends[g]:ends[g + 1]] = x[ends[g]:ends[g + 1]] @ w[g]
'''},
            "empty experts not counted": {"loop": '''
g = 0
for start, end in group_bounds(offsets):
    if end > start:
        out[start:end] = x[start:end] @ w[g]
        g += 1
'''},
        },
        shapes=(*EMPTY_EXPERTS, (41, 24, 16, 7, 3)), dtypes=(torch.float32,),
    ),
    KernelExercise(
        key="grouped_gemm/v1", module="kernels.moe.grouped_gemm.v1_per_expert", op="grouped_gemm",
        rung="v1",
        title="One tiled-GEMM launch per expert, forward and weight gradient",
        task="Launch GEMM v4's tiled kernel (_gemm_into: one launch) once per expert that has "
             "rows, on views of its rows of x and out and on its weight w[g]: nothing is padded "
             "or copied. The backward's weight gradient is the same pattern: dw[g] = x_gᵀ · dy_g "
             "for each expert with rows, and zeros for an expert without.",
        todo={"forward": 'raise NotImplementedError("TODO: one _gemm_into launch per expert with rows")',
              "dw": 'raise NotImplementedError("TODO: dw[g] = x_gT . dy_g per expert; zeros for an empty one")'},
        hints=(
            "group_bounds(offsets) gives each expert's (start, end) rows on the host (a sync, as "
            "in v0_loop.py); a slice like x[start:end] is a view, so the kernel writes straight "
            "into out.",
            "An empty expert (start == end) gets no launch, but its dw[g] must still be written: "
            "the output starts as poison, and an expert no token chose has a zero gradient.",
            "forward: if end > start: _gemm_into(x[start:end], w[g], out[start:end]). dw: "
            "_gemm_into(x[start:end].t(), dy[start:end], dw[g]) for an expert with rows, else "
            "dw[g].zero_().",
        ),
        wrong={
            "empty expert's dw left unwritten": {"dw": '''
for g, (start, end) in enumerate(group_bounds(offsets)):
    if end > start:
        _gemm_into(x[start:end].t(), dy[start:end], dw[g])
'''},
            "dw over every row, not the expert's": {"dw": '''
for g, (start, end) in enumerate(group_bounds(offsets)):
    if end > start:
        _gemm_into(x.t(), dy, dw[g])
    else:
        dw[g].zero_()
'''},
        },
        shapes=EMPTY_EXPERTS, dtypes=(torch.float32,),
    ),
    KernelExercise(
        key="grouped_gemm/v2", module="kernels.moe.grouped_gemm.schedule",
        title="The device-side tile schedule: which program owns which expert's tile",
        task="v2 launches one grid sized without reading the offsets (cdiv(T, BLOCK_M) + G row "
             "tiles), and each program finds its own tile on the device. Write that schedule. "
             "group_tiles loads the G row ends through clamped (each clamped to the rows "
             "[0, T], so unchecked offsets stay inside x and out) and returns per group its "
             "first row, end row, number of BLOCK_M row tiles (zero past G, and for a group "
             "whose end lies below its start) and their running sum. locate maps a "
             "row-tile id to (group, first row of the tile, the group's end row), with a group "
             ">= G for an id past the last tile. Empty experts own no tile. Your schedule is "
             "checked inside v2's kernel.",
        todo={"tiles": '''
gs = tl.arange(0, BLOCK_G)
ends = clamped(offsets_ptr + gs, gs < G, T)
starts = ends  # TODO: each group's first row (the previous group's end; 0 for group 0)
tiles = tl.zeros_like(gs)  # TODO: each group's row tiles, zero past G
return starts, ends, tiles, tl.cumsum(tiles, 0)
''',
              "locate": '''
# TODO: the group whose row tiles hold `tile`, the tile's first row and the group's end.
group = tl.sum(tl.zeros_like(cum), 0) + BLOCK_G  # past every group: the program exits
return group, tile * BLOCK_M, tile * BLOCK_M
'''},
        hints=(
            "Group g owns cdiv(rows of g, BLOCK_M) row tiles; with cum = tl.cumsum(tiles, 0) it "
            "owns the tile ids cum[g] - tiles[g] up to cum[g]. An empty group has 0 tiles, so no "
            "id maps to it.",
            "The starts are the ends shifted by one: clamped(offsets_ptr + gs - 1, mask, T) with "
            "a mask that keeps lane 0 (no previous end) and lanes past G from reading; count the "
            "rows as tl.maximum(ends - starts, 0), so a decreasing pair gives no tile. In locate "
            "the group is the number of groups whose tiles all come before the id: "
            "tl.sum((cum <= tile).to(tl.int32), 0).",
            "Triton vectors cannot be indexed by a scalar: pick the group's entries with "
            "mine = tl.arange(0, BLOCK_G) == group and tl.sum(tl.where(mine, v, 0), 0). The "
            "tile's first row is the group's start + (tile - the group's first tile id) * "
            "BLOCK_M; the end returned is the group's end row, which masks the tile's rows.",
        ),
        wrong={
            "off-by-one group (cum < tile)": {"locate": '''
group = tl.sum((cum < tile).to(tl.int32), 0)
mine = tl.arange(0, BLOCK_G) == group
first_tile = tl.sum(tl.where(mine, cum - tiles, 0), 0)
start = tl.sum(tl.where(mine, starts, 0), 0) + (tile - first_tile) * BLOCK_M
return group, start, tl.sum(tl.where(mine, ends, 0), 0)
'''},
            "a group's partial last tile dropped (floor, not cdiv)": {"tiles": '''
gs = tl.arange(0, BLOCK_G)
ends = clamped(offsets_ptr + gs, gs < G, T)
starts = clamped(offsets_ptr + gs - 1, (gs > 0) & (gs < G), T)
tiles = tl.where(gs < G, tl.maximum(ends - starts, 0) // BLOCK_M, 0)
return starts, ends, tiles, tl.cumsum(tiles, 0)
'''},
            "group 0's start read before offsets": {"tiles": '''
gs = tl.arange(0, BLOCK_G)
ends = clamped(offsets_ptr + gs, gs < G, T)
starts = clamped(offsets_ptr + gs - 1, gs < G, T)
tiles = tl.where(gs < G, tl.cdiv(tl.maximum(ends - starts, 0), BLOCK_M), 0)
return starts, ends, tiles, tl.cumsum(tiles, 0)
'''},
            "a tile's end is start + BLOCK_M, not the expert's end": {"locate": '''
group = tl.sum((cum <= tile).to(tl.int32), 0)
mine = tl.arange(0, BLOCK_G) == group
first_tile = tl.sum(tl.where(mine, cum - tiles, 0), 0)
start = tl.sum(tl.where(mine, starts, 0), 0) + (tile - first_tile) * BLOCK_M
return group, start, start + BLOCK_M
'''},
        },
        shapes=EMPTY_EXPERTS, dtypes=(torch.float32,), grade=_schedule_in_v2,
    ),
    KernelExercise(
        key="grouped_gemm/v4", module="kernels.moe.grouped_gemm.v4_persistent", op="grouped_gemm",
        rung="v4",
        title="The persistent walk over every expert's tiles",
        task="v4 launches NUM_PROGS programs (one per CU; 4 under the interpreter) instead of "
             "one per tile. Each has read the schedule once (starts, ends, tiles, cum). Write its "
             "walk over the work list: the units are every group's row tiles times tiles_n "
             "column tiles, unit u is (row tile u // tiles_n, column tile u % tiles_n), and "
             "program pid takes units pid, pid + NUM_PROGS, ... Locate each unit's row tile on "
             "the schedule for its group and rows.",
        todo={"walk": '''
for unit in range(pid, pid + 1):  # TODO: every unit of the work list, NUM_PROGS apart
    group, start, end = locate(pid, starts, ends, tiles, cum, BLOCK_M, BLOCK_G)  # TODO: this unit's row tile
    rows = start + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)  # TODO: this unit's column tile
'''},
        hints=(
            "The number of units is known on the device only: tl.sum(tiles, 0) row tiles (the "
            "schedule's count, empty experts give none) times tiles_n column tiles. A Triton "
            "for loop may have a tensor as its bound.",
            "range(pid, units, NUM_PROGS): consecutive units go to consecutive programs, and "
            "no unit is taken twice. Stepping by 1 makes every program redo its neighbours' "
            "units: two programs then store the same tile.",
            "group, start, end = locate(unit // tiles_n, starts, ends, tiles, cum, BLOCK_M, "
            "BLOCK_G); cols = (unit % tiles_n) * BLOCK_N + tl.arange(0, BLOCK_N).",
        ),
        wrong={
            "every program steps by 1": {"walk": '''
for unit in range(pid, tl.sum(tiles, 0) * tiles_n, 1):
    group, start, end = locate(unit // tiles_n, starts, ends, tiles, cum, BLOCK_M, BLOCK_G)
    rows = start + tl.arange(0, BLOCK_M)
    cols = (unit % tiles_n) * BLOCK_N + tl.arange(0, BLOCK_N)
'''},
            "row and column tile swapped": {"walk": '''
for unit in range(pid, tl.sum(tiles, 0) * tiles_n, NUM_PROGS):
    group, start, end = locate(unit % tiles_n, starts, ends, tiles, cum, BLOCK_M, BLOCK_G)
    rows = start + tl.arange(0, BLOCK_M)
    cols = (unit // tiles_n) * BLOCK_N + tl.arange(0, BLOCK_N)
'''},
            "the work list counted in row tiles only": {"walk": '''
for unit in range(pid, tl.sum(tiles, 0), NUM_PROGS):
    group, start, end = locate(unit // tiles_n, starts, ends, tiles, cum, BLOCK_M, BLOCK_G)
    rows = start + tl.arange(0, BLOCK_M)
    cols = (unit % tiles_n) * BLOCK_N + tl.arange(0, BLOCK_N)
'''},
        },
        shapes=(EMPTY_EXPERTS[1], EMPTY_EXPERTS[0]), dtypes=(torch.float32,),
        grade=_harness_and_races("grouped_gemm/v4"),
    ),
    KernelExercise(
        key="grouped_gemm_fp8/v0", module="kernels.moe.grouped_gemm_fp8.v0_one_launch",
        op="grouped_gemm_fp8", rung="v0",
        title="FP8 grouped GEMM: per-token and per-expert-channel scales in the epilogue",
        task="The K loop feeds the one-byte tiles to tl.dot as loaded and accumulates the raw "
             "FP8 products in fp32. Apply the scales once, in the epilogue: each row's token "
             "scale (sx, one per row of x) and this program's expert's channel scale (sw[group], "
             "one per output column). Rows past the expert's end and columns past N must not "
             "read a scale.",
        todo={"scales": "# TODO: multiply acc by the rows' token scales and the expert's column scales"},
        hints=(
            "The scales are constant along K, so (x·sx) @ (w[g]·sw[g]) = sx * (x @ w[g]) * sw[g]: "
            "one multiply of the fp32 accumulator per element after the K loop, instead of "
            "dequantizing every tile.",
            "sx is (T,) with stride stride_sx: load it at the tile's rows r64. sw is (G, N) with "
            "strides stride_swg and stride_swn: load row `group` (g64) at the tile's columns c64. "
            "Mask each load as the tile is masked: rows < end, cols < N.",
            "scale_x = tl.load(sx_ptr + r64 * stride_sx, mask=rows < end, other=0.0); scale_w "
            "likewise from sw_ptr + g64 * stride_swg + c64 * stride_swn; then "
            "acc = acc * scale_x[:, None] * scale_w[None, :].",
        ),
        wrong={
            "every expert takes expert 0's channel scales": {"scales": '''
scale_x = tl.load(sx_ptr + r64 * stride_sx, mask=rows < end, other=0.0)
scale_w = tl.load(sw_ptr + c64 * stride_swn, mask=cols < N, other=0.0)
acc = acc * scale_x[:, None] * scale_w[None, :]
'''},
            "token scales on the columns, channel scales on the rows": {"scales": '''
scale_x = tl.load(sx_ptr + r64 * stride_sx, mask=rows < end, other=0.0)
scale_w = tl.load(sw_ptr + g64 * stride_swg + c64 * stride_swn, mask=cols < N, other=0.0)
acc = acc * scale_x[None, :] * scale_w[:, None]
'''},
            "token scales loaded without the row mask": {"scales": '''
scale_x = tl.load(sx_ptr + r64 * stride_sx)
scale_w = tl.load(sw_ptr + g64 * stride_swg + c64 * stride_swn, mask=cols < N, other=0.0)
acc = acc * scale_x[:, None] * scale_w[None, :]
'''},
        },
        shapes=((37, 24, 40, 4, 0), EMPTY_EXPERTS[0]),
    ),
    KernelExercise(
        key="grouped_gemm_mxfp8/v0", module=_MX,
        op="grouped_gemm_mxfp8", rung="v0",
        title="MXFP8 grouped GEMM: the expert's block scales inside the dot",
        task="x and w hold this K step's e4m3 tiles (one byte each) of the tile's rows and of this "
             "program's expert. Every 32 elements along K have their own e8m0 scale byte, so the "
             "scales go into the dot, not the epilogue. Load this step's scales of the rows "
             "(BLOCK_M x BLOCK_K/32, from sx_ptrs) and of the expert's columns (BLOCK_N x "
             "BLOCK_K/32, from sw_ptrs), masked like the tiles, and accumulate the scaled product.",
        todo={"scaled_dot": "# TODO: load this step's e8m0 scales and accumulate the scaled product\n"
                            "acc += 0.0"},
        hints=(
            "tl.dot_scaled(x, sx, \"e4m3\", w, sw, \"e4m3\", acc) takes the tiles and one scale byte "
            "per 32 elements of each row of x and each column of w, and applies them inside the dot.",
            "`blocks` scales are left along K (K may end inside one); a lane is real when its row is "
            "in the expert's rows (row_ok), or its column < N, and kb < blocks. Masked-off scales load 0.",
            "sx = tl.load(sx_ptrs, mask=row_ok & (kb[None, :] < blocks), other=0); sw likewise with "
            "cols[:, None] < N; then acc = tl.dot_scaled(x, sx, \"e4m3\", w, sw, \"e4m3\", acc).",
        ),
        wrong={
            "row and column scales swapped": source.variant(
                _MX, "scaled_dot", ("(x, sx, \"e4m3\", w, sw, ", "(x, sw, \"e4m3\", w, sx, ")),
            "the last partial scale block left out": source.variant(
                _MX, "scaled_dot", ("(kb[None, :] < blocks)", "(kb[None, :] < left // 32)")),
            "block scales left out": source.variant(
                _MX, "scaled_dot", ("(x, sx, \"e4m3\", w, sw, ", "(x, None, \"e4m3\", w, None, ")),
        },
        shapes=((37, 40, 24, 4, 0), EMPTY_EXPERTS[0]),
    ),
    KernelExercise(
        key="moe/v0", module="kernels.moe.layer_ladder.v0_loop", op="moe", rung="v0",
        title="The MoE layer as a loop over experts",
        task="The router has chosen top_k experts per token (ids) with renormalized weights. "
             "Write the expert loop: for each expert find the (token, slot) pairs that chose it, "
             "run its SwiGLU MLP silu(x·gate[e]) * (x·up[e]), then ·down[e], on those tokens' "
             "rows, and write each result into its (token, slot) of the (T, top_k, dim) buffer "
             "`slots`. Return each token's slots summed with its routing weights, in float32, "
             "cast to x's dtype.",
        todo={"experts": 'raise NotImplementedError("TODO: the loop over experts and the weighted '
                         'sum of each token\'s slots")'},
        hints=(
            "(ids == e).nonzero(as_tuple=True) gives two index tensors: the tokens and the slots "
            "that chose expert e; x[token] gathers their rows. An expert nobody chose has none: "
            "skip it.",
            "SwiGLU: the gate projection goes through SiLU and multiplies the up projection "
            "elementwise; only then comes the down projection.",
            "slots[token, slot] = (F.silu(rows @ gate[e]) * (rows @ up[e])) @ down[e]; at the "
            "end, weights once: (slots.float() * weights.unsqueeze(-1)).sum(dim=1).to(x.dtype).",
        ),
        wrong={
            "gate and up swapped": {"experts": '''
for e in range(router.shape[0]):
    token, slot = (ids == e).nonzero(as_tuple=True)
    if token.numel():
        rows = x[token]
        slots[token, slot] = (F.silu(rows @ up[e]) * (rows @ gate[e])) @ down[e]
return (slots.float() * weights.unsqueeze(-1)).sum(dim=1).to(x.dtype)
'''},
            "routing weights not applied": {"experts": '''
for e in range(router.shape[0]):
    token, slot = (ids == e).nonzero(as_tuple=True)
    if token.numel():
        rows = x[token]
        slots[token, slot] = (F.silu(rows @ gate[e]) * (rows @ up[e])) @ down[e]
return slots.float().sum(dim=1).to(x.dtype)
'''},
            "routing weights applied twice": {"experts": '''
for e in range(router.shape[0]):
    token, slot = (ids == e).nonzero(as_tuple=True)
    if token.numel():
        rows = x[token]
        out = (F.silu(rows @ gate[e]) * (rows @ up[e])) @ down[e]
        slots[token, slot] = out * weights[token, slot, None].to(out.dtype)
return (slots.float() * weights.unsqueeze(-1)).sum(dim=1).to(x.dtype)
'''},
        },
        shapes=((29, 24, 20, 5, 2, 1),), dtypes=(torch.float32,),
    ),
    KernelExercise(
        key="moe/v2", module="kernels.moe.layer_ladder.v2_grouped", op="moe", rung="v2",
        title="The MoE layer on grouped GEMMs: permute, three grouped GEMMs, unpermute",
        task="Replace v0's loop over experts by sorting the work: permute sorts the token-slots "
             "by expert and gathers x in that order (and gives the offsets), gate and up are "
             "grouped GEMMs over all experts at once, SwiGLU is elementwise, down is a third "
             "grouped GEMM, and unpermute brings every row back to its token and sums each "
             "token's k rows with the routing weights.",
        todo={"grouped": 'raise NotImplementedError("TODO: permute, gate/up grouped GEMMs, SwiGLU, '
                         'down grouped GEMM, unpermute")'},
        hints=(
            "permute(x, ids, gate.shape[0], check_ids=False) returns (x_sorted, offsets, "
            "permutation); the offsets are the row ends grouped_gemm takes, every expert's rows "
            "contiguous.",
            "grouped_gemm(a, w, offsets, check_offsets=False) multiplies each expert's rows by "
            "its weight in one call; SwiGLU is F.silu(gate projection) * (up projection).",
            "return unpermute(grouped_gemm(hidden, down, offsets, check_offsets=False), "
            "permutation, weights, check_permutation=False): unpermute applies the routing "
            "weights itself, and permute's permutation needs no host check.",
        ),
        wrong={
            "gate and up swapped": {"grouped": '''
x_sorted, offsets, permutation = permute(x, ids, gate.shape[0], check_ids=False)
hidden = (F.silu(grouped_gemm(x_sorted, up, offsets, check_offsets=False))
          * grouped_gemm(x_sorted, gate, offsets, check_offsets=False))
return unpermute(grouped_gemm(hidden, down, offsets, check_offsets=False), permutation, weights,
                 check_permutation=False)
'''},
            "SiLU of the product": {"grouped": '''
x_sorted, offsets, permutation = permute(x, ids, gate.shape[0], check_ids=False)
hidden = F.silu(grouped_gemm(x_sorted, gate, offsets, check_offsets=False)
                * grouped_gemm(x_sorted, up, offsets, check_offsets=False))
return unpermute(grouped_gemm(hidden, down, offsets, check_offsets=False), permutation, weights,
                 check_permutation=False)
'''},
            "routing weights not applied": {"grouped": '''
x_sorted, offsets, permutation = permute(x, ids, gate.shape[0], check_ids=False)
hidden = (F.silu(grouped_gemm(x_sorted, gate, offsets, check_offsets=False))
          * grouped_gemm(x_sorted, up, offsets, check_offsets=False))
return unpermute(grouped_gemm(hidden, down, offsets, check_offsets=False), permutation,
                 weights.new_ones(weights.shape), check_permutation=False)
'''},
        },
        shapes=((21, 24, 16, 4, 2, 0),), dtypes=(torch.float32,),
    ),
    KernelExercise(
        key="moe/v3", module="kernels.moe.layer_ladder.v3_fused", op="moe", rung="v3",
        title="Fused gather + SwiGLU, and the weighted scatter to each token's slot",
        task="Kernel 1 loads its A rows straight from x: sorted row i is the token-slot "
             "slots[i] = t·k + j, so its row of x is token t. Write that gather, and the SwiGLU "
             "epilogue that turns the fp32 accumulators g (x·gate) and u (x·up) into h. In "
             "kernel 2's epilogue, scale each row of h·down[e] by its slot's routing weight "
             "(weight_ptr holds the (T, k) weights flat) and point its store at the slot's row "
             "of the (T·k, dim) buffer.",
        todo={"gather": "tokens = rows  # TODO: the token (row of x) of each sorted row",
              "swiglu": "h = g * u  # TODO: SwiGLU of the gate and up accumulators",
              "weight": "slots = rows  # TODO: each sorted row's slot t*k + j; scale acc by its routing weight",
              "scatter": "out_ptrs = out_ptr + rows.to(tl.int64)[:, None] * stride_os + cols.to(tl.int64)[None, :] "
                         "* stride_on  # TODO: the slot's row, not the sorted row"},
        hints=(
            "slot_ptr holds, per sorted row, the slot it came from; load it at the tile's rows "
            "(masked by rows < end). A slot t·k + j belongs to token t: integer division by "
            "TOP_K. Kernel 2 needs the slot itself: it is both the weight's index and the row "
            "the result goes to.",
            "SwiGLU is silu(gate) * up, and silu(g) = g · sigmoid(g): the gate accumulator goes "
            "through the sigmoid, not the up one.",
            "tokens = tl.load(slot_ptr + rows, mask=rows < end, other=0) // TOP_K; "
            "h = g * tl.sigmoid(g) * u; in kernel 2 slots = tl.load(slot_ptr + rows, ...) and "
            "acc = acc * tl.load(weight_ptr + slots, mask=rows < end, other=0.0)[:, None], "
            "before the bf16 rounding; out_ptrs takes slots where it had rows.",
        ),
        wrong={
            "token = slot % k": {"gather": "tokens = tl.load(slot_ptr + rows, mask=rows < end, other=0) % TOP_K"},
            "gate and up swapped": {"swiglu": "h = u * tl.sigmoid(u) * g"},
            "routing weight not applied": {"weight": "slots = tl.load(slot_ptr + rows, mask=rows < end, other=0)"},
            "weight indexed by the sorted row": {"weight": """
slots = tl.load(slot_ptr + rows, mask=rows < end, other=0)
acc = acc * tl.load(weight_ptr + rows, mask=rows < end, other=0.0)[:, None]
"""},
            "stored at the sorted row, not the slot": {"scatter": """
out_ptrs = out_ptr + rows.to(tl.int64)[:, None] * stride_os + cols.to(tl.int64)[None, :] * stride_on
"""},
        },
        shapes=((33, 24, 17, 5, 2, 1),), dtypes=(torch.float32,),
        grade=_harness_and_races("moe/v3"),
    ),
)
