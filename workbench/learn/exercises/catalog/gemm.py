"""GEMM ladder exercises: each rung's one idea, from one thread per element to the persistent kernel.

v3's program order and v4's K loop leave the result right without the idea, so their
grades check the idea itself after the harness: v3's traces which tile each program of the
learner's kernel writes, v4's compiles the learner's file for gfx942 and reads its hot
loop. The knobs and tables around the kernels (v4's waves_per_eu and LDS banks, v5's pruned
space, v6's split of the last wave) are questions whose answers the workbench computes.
"""
from __future__ import annotations

import functools
import importlib

import torch

import kernels

from .. import source, tiles
from ..grading import harness_verdict, with_idea
from ..model import AnswerExercise, KernelExercise, Verdict
from ..source import variant

NAIVE_MODULE = "kernels.gemm.v0_simt_naive"
TILED_MODULE = "kernels.gemm.v1_simt_lds_tiled"
TILE_MODULE = "kernels.gemm.v2_triton_tile"
ORDER_MODULE = "kernels.gemm.v3_grouped_order"
PIPELINE_MODULE = "kernels.gemm.v4_lds_pipeline"
AUTOTUNED_MODULE = "kernels.gemm.v5_autotuned"
PERSISTENT_MODULE = "kernels.gemm.v6_persistent"

ORDER_SHAPE = (91, 125, 9)    # 3 x 4 tiles of TRACE_TILE: with GROUP_M 2 the last group is partial
ORDER_XCDS = (1, 5)           # 5 XCDs do not divide 12 programs: the remap's uneven case
UNITS_SHAPE = (37, 67, 100)   # 2 x 3 tiles on 4 programs: 4 whole tiles, 2 tail tiles in 2 K ranges
TRACE_TILE = {"BLOCK_M": 32, "BLOCK_N": 32}  # the interpreter's tiles, pinned on a GPU too


def _trace(module, rung, kernel: str, shape, overrides: dict) -> list:
    a, b = kernels.spec("gemm").make_inputs(shape, torch.float32, kernels.backend.current().device, seed=0)
    with tiles.traced(module, kernel) as order:
        rung.fn(a, b, overrides=overrides)
    return order


@functools.lru_cache(maxsize=None)
def _package_trace(label: str, kernel: str, shape, overrides: tuple) -> tuple:
    """The package's rung: the tiles each program writes (traced once per process)."""
    rung = kernels.get("gemm", label)
    return tuple(_trace(importlib.import_module(rung.module), rung, kernel, shape, dict(overrides)))


def _tiles(written) -> str:
    return ("no tile of its own" if not written else
            ", ".join(f"tile (row {r}, col {c})" for r, c in written))


def _same_tiles(exercise, module, captured, kernel: str, shape, settings: tuple[dict, ...],
                what: str) -> Verdict:
    """The harness, then: every program writes the tiles the package's rung has it write."""
    verdict = harness_verdict(exercise, captured)
    if not verdict.passed:
        return verdict
    rung = next(r for r in captured if r.label == exercise.rung)
    for overrides in settings:
        mine = _trace(module, rung, kernel, shape, overrides)
        theirs = _package_trace(exercise.rung, kernel, shape, tuple(sorted(overrides.items())))
        pid = tiles.first_difference(mine, theirs)
        if pid is not None:
            setting = ", ".join(f"{k} {v}" for k, v in overrides.items())
            return with_idea(verdict, f"not {exercise.rung}'s {what}: for M, N = {shape[0]}, "
                                      f"{shape[1]} ({setting}), program {pid} writes "
                                      f"{_tiles(mine[pid])}; {exercise.rung} has it write "
                                      f"{_tiles(theirs[pid])}", "")
    return with_idea(verdict, None, f"every program writes {exercise.rung}'s tiles")


def _grade_order(module, captured) -> Verdict:
    """v3: the learner's program -> tile map against v3's, with and without the XCD remap."""
    return _same_tiles(GROUPED_ORDER, module, captured, "_gemm_grouped_kernel", ORDER_SHAPE,
                       tuple({**TRACE_TILE, "GROUP_M": 2, "NUM_XCDS": x} for x in ORDER_XCDS),
                       "program order")


def _grade_units(module, captured) -> Verdict:
    """v6: each persistent program writes the whole tiles of its own turns, no more."""
    return _same_tiles(PERSISTENT, module, captured, "_gemm_persistent_kernel", UNITS_SHAPE,
                       ({**TRACE_TILE, "BLOCK_K": 32, "NUM_XCDS": 1, "NUM_PROGS": 4},),
                       "share of the work units")


def _grade_peel(module, captured) -> Verdict:
    """The harness, then the learner's own gfx942 hot loop: no K test left in it."""
    from .... import isa
    from ....isa import parse as isa_parse

    verdict = harness_verdict(LDS_PIPELINE, captured)
    if not verdict.passed:
        return verdict
    report = isa.inspect("gemm", "v4", "gfx942", source=module.__file__)
    compares = [line.strip() for line in report.hot_loop.splitlines()
                if (isa_parse.mnemonic(line) or "").startswith("v_cmp")]
    return with_idea(verdict, compares and f"your gfx942 hot loop still tests every K step: "
                                           f"{compares[0]} ({len(compares)} vector compares in the loop)",
                     "your gfx942 hot loop holds no vector compare")


def _v0_bytes_read(shape, dtype: torch.dtype) -> float:
    """Every thread reads K elements of A and K of B: 2 M N K loads, one per multiply-add."""
    return kernels.spec("gemm").flops(shape) * dtype.itemsize


def _v2_mfma_per_step() -> int:
    from .... import isa
    from ....isa import parse as isa_parse
    loop = isa.inspect("gemm", "v2", "gfx942").hot_loop.splitlines()
    return sum((isa_parse.mnemonic(line) or "").startswith("v_mfma") for line in loop)


def _v4_waves_per_simd(waves_per_eu: int) -> int:
    from .... import isa
    return isa.inspect("gemm", "v4", "gfx942", overrides={"waves_per_eu": waves_per_eu}).occupancy.value


def _banks_passes(xor_rows: int) -> int:
    from ....isa import lds_banks
    lanes = range(lds_banks.WAVE)
    return lds_banks.passes(lds_banks.tile_addresses([i % 16 for i in lanes], [i // 16 for i in lanes],
                                                     row_bytes=128, xor_rows=xor_rows))


def _v5_configs_timed(shape) -> int:
    from kernels.gemm import configs
    return len(configs.prune(configs.space("hip", "gfx942"), *shape))


def _v6_split(shape, tile) -> list[int]:
    import roofline
    from kernels.gemm.v6_persistent import schedule
    plan = schedule(*shape, *tile, roofline.spec("mi300x").compute_units)
    return [plan.sk_tiles, plan.splits]


NAIVE = KernelExercise(
    key="gemm/v0", module=NAIVE_MODULE, op="gemm", rung="v0",
    title="One thread, one element of C",
    task="Thread (row, col) of the grid computes C[row, col]: walk K, accumulate "
         "A[row, k] * B[k, col] in an fp32 register, write C once. The grid is rounded up to "
         "whole 16 x 16 blocks, so some threads fall outside C and must do nothing.",
    todo={"element": 'raise NotImplementedError("TODO: compute C[row, col]")'},
    hints=(
        "C has c.shape[0] rows and c.shape[1] columns; a thread whose row or col is beyond "
        "them must not read or write anything.",
        "acc = float32(0.0), then for k in range(a.shape[1]) add float32(a[row, k]) * "
        "float32(b[k, col]): fp16 inputs are widened before the multiply.",
        "if row < c.shape[0] and col < c.shape[1]: the loop, then c[row, col] = acc, inside the if.",
    ),
    wrong={
        "off-by-one bound check": variant(
            NAIVE_MODULE, "element", ("row < c.shape[0] and col < c.shape[1]", "row <= c.shape[0] and col <= c.shape[1]")),
        "B indexed as if transposed": variant(NAIVE_MODULE, "element", ("b[k, col]", "b[col, k]")),
        "K loop over the columns of C": variant(NAIVE_MODULE, "element", ("range(a.shape[1])", "range(c.shape[1])")),
    },
    shapes=((19, 21, 37),), dtypes=(torch.float32,),
)

V0_BYTES = AnswerExercise(
    key="gemm/v0-bytes", title="What v0 reads from global memory",
    question="v0 computes a 4096 x 4096 x 4096 fp32 GEMM, one thread per element of C, each "
             "thread reading its row of A and its column of B. Leaving caches aside, how many "
             "bytes does it read from global memory in all?",
    answer=lambda: _v0_bytes_read((4096, 4096, 4096), torch.float32),
    hints=(
        "Count per thread first: how many elements of A and of B does one thread load?",
        "There are M x N threads, each loading K elements of A and K of B, 4 bytes each.",
        "2 * M * N * K * 4 bytes: the same count as the FLOPs, times 4, so 0.25 FLOP/byte.",
    ),
    wrong=(3 * 4096**2 * 4, 4096**3 * 4, 2 * 4096**3),
    tolerance=0.01,
    explain="One load per multiply-add: 0.25 FLOP/byte, so the HBM roof alone caps v0 at a "
            "quarter of the bandwidth in FLOP/s (model), and the strided walk down B gets less.",
)

V2_MFMA = AnswerExercise(
    key="gemm/v2-mfma", title="MFMAs per K step in v2's hot loop",
    question="v2 computes a 128 x 128 tile with 8 wavefronts and BLOCK_K 64. How many MFMA "
             "instructions does one wavefront issue per K step on gfx942? Count them in "
             'workbench.isa.inspect("gemm", "v2").highlighted_loop().',
    answer=_v2_mfma_per_step,
    hints=(
        "The hot loop is one K step; the lines marked M are the matrix-core instructions.",
        "Check it by arithmetic: the tile's multiply-adds per K step, divided by one MFMA's "
        "(the instruction name says M x N x K), divided by the wavefronts.",
        "128 * 128 * 64 / (32 * 32 * 8) MFMAs per program, shared by 8 wavefronts.",
    ),
    wrong=(128, 8, 64),
    explain="Each v_mfma_f32_32x32x8 is a 32x32x8 multiply-add for a whole wavefront.",
)

GROUPED_ORDER = KernelExercise(
    key="gemm/v3", module=ORDER_MODULE, op="gemm", rung="v3",
    title="Grouped, XCD-aware program order",
    task="The grid is 1-D; map program id pid to a tile (pid_m, pid_n). First remap pid so that "
         "each of the NUM_XCDS L2 caches receives a contiguous run of ids (the hardware deals ids "
         "to XCDs round robin; xcd_remap above is the same arithmetic in Python, skipped when "
         "NUM_XCDS is 1). Then walk GROUP_M tile rows column by column before moving right. The "
         "result is right in any order: the checker traces which tile each of your programs writes.",
    todo={"order": "pid_m = pid // tiles_n  # TODO: v2's row-major order; remap for the XCDs, then group\n"
                   "pid_n = pid % tiles_n"},
    hints=(
        "Two steps. The XCD remap: per = tl.cdiv(tiles_m * tiles_n, NUM_XCDS) programs per XCD, "
        "tall = tiles_m * tiles_n - (per - 1) * NUM_XCDS XCDs get `per`, the others per - 1; "
        "xcd_remap() shows the formula.",
        "Grouping: a group is GROUP_M tile rows, group_size = GROUP_M * tiles_n programs. "
        "first_m = (pid // group_size) * GROUP_M; the last group may have fewer rows: "
        "rows_in_group = tl.minimum(tiles_m - first_m, GROUP_M).",
        "if NUM_XCDS > 1: xcd = pid % NUM_XCDS; pid = xcd * per - tl.maximum(xcd - tall, 0) + "
        "pid // NUM_XCDS. Then pid_m = first_m + (pid % group_size) % rows_in_group and "
        "pid_n = (pid % group_size) // rows_in_group.",
    ),
    wrong={
        "row-major inside each group": variant(
            ORDER_MODULE, "order", ("(pid % group_size) % rows_in_group", "(pid % group_size) // tiles_n"),
            ("(pid % group_size) // rows_in_group", "(pid % group_size) % tiles_n")),
        "last group assumed full": variant(
            ORDER_MODULE, "order", ("% rows_in_group", "% GROUP_M"), ("// rows_in_group", "// GROUP_M")),
        "XCD remap for an even split only": variant(
            ORDER_MODULE, "order", ("xcd * per - tl.maximum(xcd - tall, 0)", "xcd * per")),
    },
    shapes=((37, 45, 41),), dtypes=(torch.float32,), grade=_grade_order,
)

LDS_PIPELINE = KernelExercise(
    key="gemm/v4", module=PIPELINE_MODULE, op="gemm", rung="v4",
    title="A K loop the pipeliner can overlap: the ragged step peeled",
    task="The K loop below is v3's: every step masks its loads with the K bound. Rewrite it so "
         "the loop runs only over the full BLOCK_K steps, masking rows and columns only, and the "
         "ragged last step (when K is not a multiple of BLOCK_K) runs once after the loop with "
         "the K mask. The result is the same; the checker compiles your file for gfx942 and "
         "looks for the K compare in the hot loop.",
    todo={"peel": "# TODO: loop over the full BLOCK_K steps only, then peel the ragged one\n"
                  + source.blocks(source.module_source(ORDER_MODULE))["kloop"].text},
    hints=(
        "k_full = (K // BLOCK_K) * BLOCK_K is where the full steps end; inside range(0, k_full, "
        "BLOCK_K) no k is ever past K, so only the row and column masks remain.",
        "After the loop, `if k_full < K:` one more step: a_ptrs and b_ptrs already point at "
        "k_full, and its loads need the K mask ks + k_full < K besides the row/column masks.",
        "The peeled step is the loop body once more without the pointer steps, with "
        "mask=(rows[:, None] < M) & (ks[None, :] + k_full < K) for A and "
        "(ks[:, None] + k_full < K) & (cols[None, :] < N) for B.",
    ),
    wrong={
        "K bound rounded up": variant(
            PIPELINE_MODULE, "peel", ("k_full = (K // BLOCK_K) * BLOCK_K", "k_full = tl.cdiv(K, BLOCK_K) * BLOCK_K")),
        "peeled step without the K mask": variant(
            PIPELINE_MODULE, "peel", ("(rows[:, None] < M) & (ks[None, :] + k_full < K)", "rows[:, None] < M"),
            ("(ks[:, None] + k_full < K) & (cols[None, :] < N)", "cols[None, :] < N")),
        "off-by-one K mask in the peeled step": variant(
            PIPELINE_MODULE, "peel", ("ks[None, :] + k_full < K", "ks[None, :] + k_full <= K"),
            ("ks[:, None] + k_full < K", "ks[:, None] + k_full <= K")),
    },
    shapes=((37, 45, 41),), dtypes=(torch.float32,), grade=_grade_peel,
)

V4_WAVES = AnswerExercise(
    key="gemm/v4-waves", title="waves_per_eu: a floor and a ceiling on waves per SIMD",
    question="v4 compiles for gfx942 with waves_per_eu=2, which Triton hands to LLVM as "
             'amdgpu-waves-per-eu="2,2": at least and at most 2 waves per SIMD. v4 needs 120 VGPRs '
             "with or without it, room for 4 waves, so here the option only lowers occupancy, "
             "from 4 to 2, with the same VGPRs (compare with overrides={\"waves_per_eu\": 0}). "
             'Compile it with waves_per_eu=3 instead: workbench.isa.inspect("gemm", "v4", '
             'overrides={"waves_per_eu": 3}) (or your own copy: add source="exercises/gemm_v4.py"). '
             "How many waves per SIMD can then be resident on a CU? Answer with a whole number.",
    answer=lambda: _v4_waves_per_simd(3),
    hints=(
        "report.occupancy says it, with the resource that limits it; report.occupancy.limits "
        "has every limit, and report.occupancy.compiler is the compiler's own `; Occupancy:`.",
        "The registers do not bind: report.occupancy.limits[\"VGPRs\"] leaves room for 4 waves "
        "at 0, 2 and 3 alike. A workgroup's num_warps waves are resident together, spread over "
        "the CU's 4 SIMDs: the ceiling counts whole workgroups.",
        "v4 runs 8 waves per workgroup on hip, 2 per SIMD: how many whole workgroups fit under a "
        "ceiling of 3 waves per SIMD, and how many waves per SIMD is that?",
    ),
    wrong=(3, 4, 8),
    explain="The compiler's `; Occupancy: 3` counts single waves; whole workgroups of 8 waves "
            "round it down to 2, the same as waves_per_eu=2. The option raises occupancy only "
            "when a kernel's VGPRs would allow fewer waves than asked: the floor then makes the "
            "compiler fit the kernel in 512 / N VGPRs per lane, spilling what does not fit. v4 "
            "never gains: at waves_per_eu=5 it is pressed into 96 VGPRs and spills, and its 32 KiB "
            "of LDS still holds it at 4 waves per SIMD.",
)

V4_BANKS = AnswerExercise(
    key="gemm/v4-banks", title="LDS bank conflicts: one ds_read_b128, unswizzled",
    question="A bf16 tile of 64 columns sits row-major in LDS, 128 bytes per row, no padding, no "
             "swizzle. With one ds_read_b128, lane i of a wave reads the 16-byte chunk i // 16 of "
             "row i % 16. On gfx942 (32 banks of 4 bytes; a b128 access is served in 8 phases of 8 "
             "consecutive lanes) how many bank passes does the instruction take, counting per phase "
             "the busiest bank's distinct dwords? A conflict-free b128 read takes 8.",
    answer=lambda: _banks_passes(xor_rows=1),
    hints=(
        "Lanes 0-7 form the first phase: rows 0-7, chunk 0. Which banks does each lane's 16 bytes "
        "fall in? bank = (byte address // 4) % 32.",
        "Row r starts at byte 128 r: a multiple of 32 banks x 4 bytes, so every row's chunk 0 "
        "lands on banks 0-3. How many distinct dwords does bank 0 serve in that phase?",
        "8 lanes on the same 4 banks: 8 passes per phase, and every phase looks alike. "
        "workbench.isa.lds_banks.passes(addresses) counts it.",
    ),
    wrong=(8, 16, 1),
    explain="8-way conflicts: 64 passes instead of 8. Store chunk c of row r at c ^ (r % 8) and "
            "the same read takes 8 (workbench.isa.lds_banks.tile_addresses(..., xor_rows=8)); "
            "padding each row by 16 bytes does too, at the cost of 1/8 more LDS.",
)

AUTOTUNED = KernelExercise(
    key="gemm/v5", module=AUTOTUNED_MODULE, op="gemm", rung="v5",
    title="A K loop with no mask: wrapped rows and columns",
    task="The loads of v5's loop carry no mask at all. Compute the row and column offsets of "
         "this tile so that every load stays inside A and B: rows past M and columns past N must "
         "read real elements (their products are never stored: the store keeps its mask). "
         "Offsets in int64.",
    todo={"wrap": "rows = offs_m.to(tl.int64)  # TODO: rows past M must not leave A\n"
                  "cols = offs_n.to(tl.int64)  # TODO: columns past N must not leave B"},
    hints=(
        "Row offs_m[i] >= M does not exist, but the row (offs_m[i] mod M) does; its products land "
        "in rows of C that the masked store drops.",
        "The same for columns with N; cast to int64 after wrapping, so row * stride cannot "
        "overflow 32 bits on a large operand.",
        "rows = (offs_m % M).to(tl.int64) and cols = (offs_n % N).to(tl.int64).",
    ),
    wrong={
        "wrapped by the block size": variant(
            AUTOTUNED_MODULE, "wrap", ("offs_m % M", "offs_m % BLOCK_M"), ("offs_n % N", "offs_n % BLOCK_N")),
        "columns not wrapped": variant(AUTOTUNED_MODULE, "wrap", ("(offs_n % N)", "offs_n")),
    },
    shapes=((37, 45, 41),), dtypes=(torch.float32,),
)

V5_PRUNE = AnswerExercise(
    key="gemm/v5-prune", title="How many configs does v5 time for a decode GEMM?",
    question="On gfx942, v5's tuning space is what survived the ahead-of-time compile "
             "(kernels.gemm.configs.space), and configs.prune keeps, per shape, the few worth "
             "timing. For the decode GEMM M=16, N=14336, K=4096, how many configs does the "
             "first call time?",
    answer=lambda: _v5_configs_timed((16, 14336, 4096)),
    hints=(
        "from kernels.gemm import configs; the space for gfx942 is configs.space(\"hip\", \"gfx942\").",
        "configs.prune(space, m, n, k) returns the configs that will be timed.",
        "len(configs.prune(configs.space(\"hip\", \"gfx942\"), 16, 14336, 4096)); look at their "
        "BLOCK_M too.",
    ),
    wrong=(16, 1, 64),
    explain="A decode shape keeps only the skinny tiles (BLOCK_M 16 or 32): a 128-row tile "
            "would compute mostly rows that the store masks away.",
)

PERSISTENT = KernelExercise(
    key="gemm/v6", module=PERSISTENT_MODULE, op="gemm", rung="v6",
    title="Persistent programs: loop over the work units",
    task="NUM_PROGS programs run for the whole GEMM. Write the loop header and decode each work "
         "unit: units 0 .. DP_TILES-1 are whole tiles; each later unit is one of SPLITS K ranges "
         "(SPLIT_K long, the last one cut at K) of a tail tile DP_TILES + i. Program pid takes "
         "units pid, pid + NUM_PROGS, pid + 2 NUM_PROGS, ... Set split_unit, sk (the split "
         "unit's index from 0), tile, k_lo and k_hi.",
    todo={"units": """
for unit in range(pid, pid + 1):  # TODO: every unit of this program, not just its first
    # TODO: a unit past DP_TILES is one K range of a tail tile
    split_unit = unit < 0
    sk = 0
    tile = unit
    k_lo = 0
    k_hi = K
"""},
    hints=(
        "for unit in range(pid, num_units, NUM_PROGS): the programs take the units in turn. "
        "split_unit = unit >= DP_TILES.",
        "For a split unit sk = unit - DP_TILES: its tail tile is DP_TILES + sk // SPLITS and its "
        "K range is number sk % SPLITS. Use tl.where(split_unit, ..., ...) so whole tiles get "
        "tile = unit, k_lo = 0, k_hi = K (and tl.maximum(unit - DP_TILES, 0) for sk).",
        "k_lo = tl.where(split_unit, (sk % SPLITS) * SPLIT_K, 0); k_hi = tl.where(split_unit, "
        "tl.minimum(K, k_lo + SPLIT_K), K): the last range stops at K.",
    ),
    wrong={
        "split index and K range swapped": variant(
            PERSISTENT_MODULE, "units", ("DP_TILES + sk // SPLITS", "DP_TILES + sk % SPLITS"),
            ("(sk % SPLITS) * SPLIT_K", "(sk // SPLITS) * SPLIT_K")),
        "last K range not cut at K": variant(
            PERSISTENT_MODULE, "units", ("tl.minimum(K, k_lo + SPLIT_K)", "k_lo + SPLIT_K")),
        "every program takes every unit from its own on": variant(
            PERSISTENT_MODULE, "units", ("range(pid, num_units, NUM_PROGS)", "range(pid, num_units)")),
        "off-by-one: the first tail unit taken as a whole tile": variant(
            PERSISTENT_MODULE, "units", ("unit >= DP_TILES", "unit > DP_TILES")),
    },
    shapes=(UNITS_SHAPE,), dtypes=(torch.float32,), grade=_grade_units,
)

V6_SPLIT = AnswerExercise(
    key="gemm/v6-split", title="Which tiles does v6 split on MI300X?",
    question="A 4096 x 4096 x 4096 GEMM in 128 x 128 tiles with BLOCK_K 64 runs on MI300X with "
             "one persistent program per CU (roofline.spec(\"mi300x\").compute_units). How many "
             "tail tiles does v6 split along K, and into how many K ranges each? Answer "
             "[tail tiles, ranges].",
    answer=lambda: _v6_split((4096, 4096, 4096), (128, 128, 64)),
    hints=(
        "Count the tiles, then the full waves of one tile per program; the tiles left over are "
        "the tail.",
        "splits = min(K steps, programs // tail): the tail tiles share out all the programs.",
        "kernels.gemm.v6_persistent.schedule(m, n, k, block_m, block_n, block_k, programs) "
        "computes it: the answer is [sk_tiles, splits].",
    ),
    wrong=([208, 1], [0, 1], [112, 64]),
    explain="The tail would leave most CUs idle in the last wave; split in K ranges it keeps "
            "them busy, and a small fix-up kernel adds the partial tiles in a fixed order.",
)

EXERCISES = (
    NAIVE,
    V0_BYTES,
    KernelExercise(
        key="gemm/v1", module=TILED_MODULE, op="gemm", rung="v1",
        title="Stage tiles of A and B in shared memory (LDS)",
        task="Each block of TILE x TILE threads computes one tile of C. Write the K loop: every "
             "thread loads one element of A's tile and one of B's into a_tile / b_tile (zero "
             "outside the matrices), the block waits until both tiles are complete, each thread "
             "accumulates its row-times-column product from shared memory, and the block waits "
             "again before the next tiles overwrite these.",
        todo={"tiles": 'raise NotImplementedError("TODO: the K loop over shared-memory tiles")'},
        hints=(
            "Thread (ty, tx) loads a[row, k0 + tx] into a_tile[ty, tx] and b[k0 + ty, col] into "
            "b_tile[ty, tx]; a thread whose element is outside A or B stores 0.0 instead.",
            "A thread reads tile elements that other threads wrote: simt.syncthreads() after the "
            "loads, so every write is done before any read.",
            "A second simt.syncthreads() after the inner `for kk in range(TILE)` loop stops a fast "
            "thread from overwriting a tile that a slow thread is still reading.",
        ),
        wrong={
            "no barrier after the loads": variant(
                TILED_MODULE, "tiles", ("    simt.syncthreads()\n    for kk", "    for kk")),
            "no barrier before the next loads": variant(
                TILED_MODULE, "tiles", ("b_tile[kk, tx]\n    simt.syncthreads()", "b_tile[kk, tx]")),
            "off-by-one bound on K": variant(
                TILED_MODULE, "tiles", ("k0 + tx < k_total", "k0 + tx <= k_total"),
                ("k0 + ty < k_total", "k0 + ty <= k_total")),
        },
        shapes=((19, 21, 37),), dtypes=(torch.float32,),
    ),
    KernelExercise(
        key="gemm/v2", module=TILE_MODULE, op="gemm", rung="v2",
        title="Masked tile loads for any M, N, K",
        task="One Triton program computes a BLOCK_M x BLOCK_N tile of C with tl.dot. Load this "
             "K step's tiles of A and B so that shapes that are not multiples of the blocks work: "
             "a lane whose row, column or k is outside the matrix must not touch memory and must "
             "contribute 0 to the dot.",
        todo={"masks": "a = tl.load(a_ptrs)  # TODO: mask the lanes outside A\n"
                       "b = tl.load(b_ptrs)  # TODO: mask the lanes outside B"},
        hints=(
            "tl.load(ptrs, mask=..., other=0.0): masked-off lanes read nothing and give 0.0.",
            "For A the lane (i, j) is inside when rows[i] < M and k0 + ks[j] < K; build it with "
            "broadcasting, rows[:, None] and ks[None, :].",
            "For B the lane (i, j) is inside when k0 + ks[i] < K and cols[j] < N.",
        ),
        wrong={
            "off-by-one row mask": variant(TILE_MODULE, "masks", ("rows[:, None] < M", "rows[:, None] <= M")),
            "K tail not masked": variant(
                TILE_MODULE, "masks", ("(rows[:, None] < M) & (ks[None, :] + k0 < K)", "rows[:, None] < M"),
                ("(ks[:, None] + k0 < K) & (cols[None, :] < N)", "cols[None, :] < N")),
        },
        shapes=((37, 45, 41),), dtypes=(torch.float32,),
    ),
    V2_MFMA,
    GROUPED_ORDER,
    LDS_PIPELINE,
    V4_WAVES,
    V4_BANKS,
    AUTOTUNED,
    V5_PRUNE,
    PERSISTENT,
    V6_SPLIT,
)
