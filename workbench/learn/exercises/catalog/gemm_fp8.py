"""FP8 GEMM exercises: the scales in the epilogue (v0), the FP8 matrix core (v1), scales per K
block on the accumulator (v2), the format.

The inputs come with per-tensor scales for even seeds and per-row/per-column ones for odd
seeds (:func:`kernels.gemm_fp8.spec.make_inputs`), so the kernel exercises check both.
v1 is right with v0's fp16 upcast too; its grade compiles the learner's file for gfx942
and looks for the FP8 MFMA. v2's scales per K block only matter on block-scaled inputs,
which the seeds do not give: its grade judges those too (1 x 128 and 128 x 128 / 128 x 1).
"""
from __future__ import annotations

import torch

from ..grading import harness_verdict, with_idea
from ..model import AnswerExercise, KernelExercise, Verdict
from ..source import variant

UPCAST_MODULE = "kernels.gemm_fp8.v0_triton_upcast"

SEEDS = (0, 1)   # per-tensor scales, then per-row/per-column scales
SHAPES = ((37, 29, 53),)
DTYPES = (torch.float8_e4m3fnuz,)


def _grade_fp8_dot(module, captured) -> Verdict:
    """The harness, then the learner's gfx942 code: the MFMA must read FP8 operands."""
    from .... import isa

    verdict = harness_verdict(FP8_DOT, captured)
    if not verdict.passed:
        return verdict
    report = isa.inspect("gemm_fp8", "v1", "gfx942", source=module.__file__)
    fp8 = [name for name in report.matrix_instructions if "fp8" in name]
    found = ", ".join(report.matrix_instructions) or "no matrix instruction"
    return with_idea(verdict, not fp8 and f"your kernel does not use the FP8 matrix cores: on "
                                          f"gfx942 it compiles to {found}",
                     f"on gfx942 your kernel runs {', '.join(fp8)}")


BLOCKWISE_MODULE = "kernels.gemm_fp8.v2_triton_blockwise"
BLOCK_SHAPES = ((37, 29, 259),)   # three K blocks, the last one partial


def _grade_blockwise(module, captured) -> Verdict:
    """The harness on the seeds' per-tensor and per-channel scales, then on block scales."""
    import kernels

    from ....harness.check import judge

    verdict = harness_verdict(BLOCKWISE, captured)
    if not verdict.passed:
        return verdict
    entry = next(r for r in captured if r.op == "gemm_fp8" and r.label == "v2")
    spec = kernels.spec("gemm_fp8")
    for granularity in ("block128x128", "block128x1"):
        for shape in BLOCK_SHAPES:
            inputs = spec.make_inputs(shape, DTYPES[0], device=kernels.backend.current().device,
                                      seed=2, granularity=granularity)
            ((_, fields),) = judge(entry, spec, inputs, seed=2)
            if not fields["passed"]:
                return Verdict(False, f"per-tensor and per-channel scales pass, but {granularity} "
                                      f"scales at {shape} do not: error {fields['error']:.2e} > allowed "
                                      f"{fields['allowed']:.2e}, {fields['mismatches']} elements off",
                               verdict.reports)
    return with_idea(verdict, None, "and with 1 x 128 / 128 x 128 and 128 x 1 block scales")


def _gfx942_fp8_max() -> float:
    from kernels.gemm_fp8 import fp8_dtype
    return float(torch.finfo(fp8_dtype("gfx942")).max)


UPCAST = KernelExercise(
    key="gemm_fp8/v0", module=UPCAST_MODULE, op="gemm_fp8", rung="v0",
    title="Dequantize in the epilogue: the scales after the K loop",
    task="acc holds the tile of A_fp8 @ B_fp8 in fp32. Apply the dequantization scales: C = "
         "s_a * (A_fp8 @ B_fp8) * s_b, with one scale per row of A (s_a) and one per column of "
         "B (s_b). A per-tensor scale arrives as the same kind of vector read with stride 0, so "
         "one piece of code serves both.",
    todo={"scales": "# TODO: multiply acc by this tile's scales of A (per row) and B (per column)"},
    hints=(
        "The scales are constant along K, so (A s_a) @ (B s_b) = s_a * (A @ B) * s_b: once per "
        "output element, after the loop, not inside it.",
        "Load BLOCK_M scales for the rows (sa_ptr + rows * stride_sa) and BLOCK_N for the "
        "columns (sb_ptr + cols * stride_sb), masked to the rows and columns that exist.",
        "acc = acc * scale_a[:, None] * scale_b[None, :]: the row scale broadcast along "
        "columns, the column scale along rows.",
    ),
    wrong={
        "scales divided out instead of multiplied": variant(
            UPCAST_MODULE, "scales", ("acc * scale_a[:, None] * scale_b[None, :]",
                                      "acc / scale_a[:, None] / scale_b[None, :]")),
        "A's scale read per column": variant(
            UPCAST_MODULE, "scales", ("rows.to(tl.int64) * stride_sa, mask=rows < M",
                                      "cols.to(tl.int64) * stride_sa, mask=cols < N")),
        "B's scale forgotten": variant(UPCAST_MODULE, "scales", (" * scale_b[None, :]", "")),
    },
    shapes=SHAPES, dtypes=DTYPES, seeds=SEEDS,
)

FP8_DOT = KernelExercise(
    key="gemm_fp8/v1", module="kernels.gemm_fp8.v1_triton_fp8_dot", op="gemm_fp8", rung="v1",
    title="FP8 tiles straight into the matrix cores",
    task="This loop is v0's: each FP8 tile is widened to fp16 before tl.dot, so the kernel runs "
         "on the fp16 matrix cores at half the FP8 rate. Give the dot what it needs to use the "
         "FP8 ones, accumulating in fp32. The result is the same; the checker compiles your file "
         "for gfx942 and reads which MFMA it runs.",
    todo={"dot": "acc = tl.dot(a.to(tl.float16), b.to(tl.float16), acc)  # TODO: the FP8 matrix cores"},
    hints=(
        "tl.dot picks the matrix instruction from its operands' types: fp16 operands give "
        "v_mfma_f32_16x16x16_f16 on gfx942.",
        "The scales are applied after the loop, so nothing inside it needs a wider type than "
        "the FP8 tiles as loaded.",
        "acc = tl.dot(a, b, acc): FP8 tiles in, fp32 accumulator; check it with "
        'workbench.isa.inspect("gemm_fp8", "v1", source="exercises/gemm_fp8_v1.py").',
    ),
    wrong={
        "widened to fp32": {"dot": "acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc)"},
    },
    shapes=SHAPES, dtypes=DTYPES, seeds=SEEDS, grade=_grade_fp8_dot,
)

BLOCKWISE = KernelExercise(
    key="gemm_fp8/v2", module=BLOCKWISE_MODULE, op="gemm_fp8", rung="v2",
    title="Scales per K block: on the accumulator, inside the loop",
    task="With DeepSeek-V3's fine-grained scaling every 128 elements of K have their own scales "
         "(A per row and 1 x 128 tile, B per column or 128 x 128 block), so v1's epilogue cannot "
         "apply them. In the SCALES_ALONG_K branch, load this K step's scales of A (one per row, "
         "from sa_ptrs) and of B (one per column, from sb_ptrs), and add the scaled FP8 product "
         "of the two tiles to the fp32 accumulator.",
    todo={"block_scales": "acc = tl.dot(a, b, acc)  # TODO: this K block's scales"},
    hints=(
        "The scales are constant inside a block of SCALE_K elements of K, so the product of a "
        "block can be scaled as a whole: dot(a, b) in fp32, then times sa[row] * sb[col].",
        "This step's block is k0 // SCALE_K; its scales are at sa_ptrs + block * stride_sak and "
        "sb_ptrs + block * stride_sbk, masked to the rows (columns) that exist.",
        "acc += tl.dot(a, b) * (scale_a[:, None] * scale_b[None, :]): a fresh partial product per "
        "block, scaled, then accumulated in fp32.",
    ),
    wrong={
        "the first K block's scales for every block": variant(
            BLOCKWISE_MODULE, "block_scales", ("block * stride_sak", "0 * stride_sak"),
            ("block * stride_sbk", "0 * stride_sbk")),
        "the scales multiply the running sum": variant(
            BLOCKWISE_MODULE, "block_scales",
            ("acc += tl.dot(a, b) * (scale_a[:, None] * scale_b[None, :])",
             "acc = tl.dot(a, b, acc) * (scale_a[:, None] * scale_b[None, :])")),
    },
    shapes=BLOCK_SHAPES, dtypes=DTYPES, seeds=SEEDS, grade=_grade_blockwise,
)

FNUZ_MAX = AnswerExercise(
    key="gemm_fp8/format", title="The FP8 format of MI300X's matrix cores",
    question="On MI300X (gfx942) v1 takes A and B in the e4m3 format its matrix cores read "
             "(kernels.gemm_fp8.fp8_dtype(\"gfx942\")). quantize_fp8 scales each tensor so its "
             "largest magnitude lands on the format's largest value. What is that value?",
    answer=_gfx942_fp8_max,
    hints=(
        "Two e4m3 formats exist: OCP e4m3fn (gfx950, Hopper) and e4m3fnuz (gfx942).",
        "fnuz has no negative zero and no inf, and its exponent bias is 8, not 7.",
        "torch.finfo(kernels.gemm_fp8.fp8_dtype(\"gfx942\")).max",
    ),
    wrong=(448.0, 57344.0),
    explain="Scaling to OCP's 448 on gfx942 would overflow: the fnuz cast turns values past its "
            "max into NaN rather than saturating.",
)

EXERCISES = (UPCAST, FP8_DOT, BLOCKWISE, FNUZ_MAX)
