"""FP8 GEMM exercises: the scales in the epilogue (v0), the FP8 matrix core (v1), scales per K
block on the accumulator (v2), the format; and the operands' way in, the fused quantize
kernel (:mod:`kernels.gemm_fp8.quantize_kernel`): a 1 x 128 group's scale, and MXFP8's e8m0 rule.

The inputs come with per-tensor scales for even seeds and per-row/per-column ones for odd
seeds (:func:`kernels.gemm_fp8.spec.make_inputs`), so the kernel exercises check both.
v1 is right with v0's fp16 upcast too; its grade compiles the learner's file for gfx942
and looks for the FP8 MFMA. v2's scales per K block only matter on block-scaled inputs,
which the seeds do not give: its grade judges those too (1 x 128 and 128 x 128 / 128 x 1).
The quantize kernel is not a rung: its exercises run the learner's ``launch`` and compare
every output, bit for bit, with :func:`kernels.gemm_fp8.quantize_ref.quantize_reference` on
a tensor with the groups that catch the usual slips (all zeros, an outlier, values near
fp32's smallest), naming the first group or element that differs.
"""
from __future__ import annotations

import torch

from ..grading import _root_cause, harness_verdict, with_idea
from ..guards import cpu_guards
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

QUANTIZE_MODULE = "kernels.gemm_fp8.quantize_kernel"
QUANTIZE_SHAPE = (130, 259)   # two row tiles and three column tiles, both ragged


def quantize_input(seed: int, dtype: torch.dtype) -> torch.Tensor:
    """Rows of different sizes with an all-zero 1 x 128 group (row 3) and 128 x 1 group
    (column 5), an outlier, and a 1 x 32 group of fp32 subnormals (row 101; in float32 only)."""
    gen = torch.Generator().manual_seed(seed)
    m, k = QUANTIZE_SHAPE
    x = torch.randn(m, k, generator=gen) * torch.randn(m, 1, generator=gen).exp()
    x[3, 128:256] = 0.0
    x[:, 5] = 0.0
    x[7, 9] = 3.0e4
    x[101, 32:64] = torch.randn(32, generator=gen) * 1e-39
    return x.to(dtype)


def _bits(t: torch.Tensor) -> torch.Tensor:
    """``t``'s bits as integers of its width: equal exactly where the two encodings are
    (-0.0 is not 0.0, a NaN equals the same NaN)."""
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def _describe(name: str, mine: torch.Tensor, want: torch.Tensor, amax: torch.Tensor | None) -> str:
    """Where ``mine`` first differs from ``want``: index, both values, and an all-zero group."""
    if mine.shape != want.shape or mine.dtype != want.dtype:
        return f"{name} is {tuple(mine.shape)} {mine.dtype}, expected {tuple(want.shape)} {want.dtype}"
    differ = _bits(mine) != _bits(want)
    index = tuple(int(i) for i in differ.nonzero()[0])
    def shown(t):
        value = t[index]
        if t.dtype == torch.uint8:
            return f"byte {int(value)} (2^{int(value) - 127})"
        return f"{float(value):.6g}"
    zero = amax is not None and float(amax[index]) == 0.0
    return (f"{name} differs in {int(differ.sum())} of {differ.numel()} entries; first at {index}: yours "
            f"{shown(mine)}, expected {shown(want)}{' (an all-zero group)' if zero else ''}")


def _grade_quantize(module, granularity: str, cases) -> Verdict:
    """The learner's ``launch`` against the reference on each (x dtype, fp8 dtype), with the
    transposed copy; outputs compared bit for bit, scales named first when they differ."""
    import kernels
    from kernels.gemm_fp8.quantize_ref import group_amax, quantize_reference

    device = kernels.backend.current().device
    for seed, (x_dtype, fp8) in enumerate(cases):
        x = quantize_input(seed, x_dtype)
        label = f"{granularity}, x {str(x_dtype).removeprefix('torch.')} -> {str(fp8).removeprefix('torch.')}"
        try:
            with cpu_guards("triton"):
                mine = [t.cpu() for t in module.launch(x.to(device), granularity, fp8, True)]
        except Exception as error:   # the learner's kernel broke: say how
            cause = _root_cause(error)
            return Verdict(False, f"{label}: {type(cause).__name__}: {cause}")
        want = quantize_reference(x, granularity, fp8, transpose=True)
        amaxes = (group_amax(x.float(), granularity), group_amax(x.float().t(), granularity))
        outputs = {"scale": (1, amaxes[0]), "scale_t": (3, amaxes[1]), "q": (0, None), "q_t": (2, None)}
        wrong = [_describe(name, mine[i], want[i], amax) for name, (i, amax) in outputs.items()
                 if mine[i].shape != want[i].shape or mine[i].dtype != want[i].dtype
                 or not torch.equal(_bits(mine[i]), _bits(want[i]))]
        if wrong:
            right = [name for name in outputs if not any(line.startswith(name + " ") for line in wrong)]
            return Verdict(False, f"{label}: {wrong[0]}" + (f" ({', '.join(right)} right)" if right else ""))
    return Verdict(True, f"q, scale, q_t and scale_t bit-exact against the reference at {QUANTIZE_SHAPE} for "
                         f"{len(cases)} format pairs, the all-zero, outlier and subnormal groups included")


def _grade_block_scale(module, captured) -> Verdict:
    return _grade_quantize(module, "block1x128", ((torch.bfloat16, torch.float8_e4m3fnuz),
                                                  (torch.float32, torch.float8_e4m3fn)))


def _grade_e8m0(module, captured) -> Verdict:
    return _grade_quantize(module, "mx32", ((torch.float32, torch.float8_e4m3fn),
                                            (torch.float32, torch.float8_e5m2)))


# the group's values times their scale instead of divided by it
_MULTIPLIED = ("tl.math.div_rn(tl.reshape(x, (BM, BK // G, G)), scale[:, :, None])",
               "tl.reshape(x, (BM, BK // G, G)) * scale[:, :, None]")

BLOCK_SCALE = KernelExercise(
    key="gemm_fp8/quantize", module=QUANTIZE_MODULE,
    title="Quantize per 1 x 128 group: the scale and the scaled values",
    task="DeepSeek-V3's recipe quantizes activations and gradients per 1 x 128 group of a row. "
         "In _grouped_along_k, amax holds the largest |x| of each group of G elements of the "
         "tile (shape BM x BK/G). Compute each group's scale, the dequantization scale the "
         "GEMM multiplies back (x ~= q * scale), and y, the group's values divided by it; the "
         "code after your block rounds y to FP8. The same function makes the transposed copy.",
    todo={"group_scale": "scale = amax * 0.0 + 1.0  # TODO: one dequantization scale per group, from its amax\n"
                         "y = tl.math.div_rn(tl.reshape(x, (BM, BK // G, G)), scale[:, :, None])"},
    hints=(
        "q = x / scale must fit the format: map the group's largest magnitude onto the format's "
        "largest value FMAX. A smaller scale saturates, a larger one wastes the top binades.",
        "So scale = amax / FMAX. A group of zeros has amax 0, so scale 0 and q = 0 / 0 = NaN: "
        "give it scale 1 (its q is 0 either way). Divide with tl.math.div_rn, as the y line does: "
        "the interpreter grading you rounds / correctly, and so does AMD, but on NVIDIA Triton's / "
        "is div.full.f32 (up to 2 ulp), and a scale one ulp off is not the reference's bits.",
        "scale = tl.where(amax > 0, tl.math.div_rn(amax, FMAX), 1.0): one scale per group, which "
        "the y line broadcasts over its G elements.",
    ),
    wrong={
        "no guard for an all-zero group": variant(
            QUANTIZE_MODULE, "group_scale", ("tl.where(amax > 0, tl.math.div_rn(amax, FMAX), 1.0)",
                                             "tl.math.div_rn(amax, FMAX)")),
        "the quantization scale stored (FMAX / amax)": variant(
            QUANTIZE_MODULE, "group_scale", ("tl.where(amax > 0, tl.math.div_rn(amax, FMAX), 1.0)",
                                             "tl.where(amax > 0, tl.math.div_rn(FMAX, amax), 1.0)"), _MULTIPLIED),
        "the scale multiplies instead of dividing": variant(
            QUANTIZE_MODULE, "group_scale", _MULTIPLIED),
    },
    grade=_grade_block_scale,
)

E8M0 = KernelExercise(
    key="gemm_fp8/mx-scale", module=QUANTIZE_MODULE,
    title="MXFP8's shared exponent: the e8m0 scale rule",
    task="MXFP8 (OCP MX) gives every 32 elements one power-of-two scale 2^e, stored as the byte "
         "e + 127 (e8m0). Complete _mx_exponent: from a group's amax (fp32), return e = "
         "floor(log2 amax) - EMAX, where 2^EMAX is the element format's largest binade (8 for "
         "e4m3fn, 15 for e5m2), clamped to e8m0's range [-127, 127]. Use amax's bits, not a log: "
         "the rule must be exact.",
    todo={"e8m0": "return (amax * 0.0).to(tl.int32)  # TODO: floor(log2 amax) - EMAX, clamped to [-127, 127]"},
    hints=(
        "amax / 2^e must land in [2^EMAX, 2^(EMAX+1)): the format's top binade, so the group's "
        "largest values use the format's full precision (and may saturate a little above its max).",
        "floor(log2 amax) is amax's unbiased exponent: bits 23..30 of the fp32, minus 127 "
        "(amax.to(tl.int32, bitcast=True)). An all-zero group has exponent field 0: the clamp "
        "turns it into e = -127, byte 0.",
        "binade = ((amax.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127, then "
        "return tl.minimum(tl.maximum(binade - EMAX, -127), 127).",
    ),
    wrong={
        "EMAX left out (amax lands on 1)": variant(QUANTIZE_MODULE, "e8m0", ("binade - EMAX", "binade")),
        "rounded up a binade (no saturation)": variant(QUANTIZE_MODULE, "e8m0", ("binade - EMAX", "binade + 1 - EMAX")),
        "no clamp to e8m0's range": variant(
            QUANTIZE_MODULE, "e8m0", ("return tl.minimum(tl.maximum(binade - EMAX, -127), 127)",
                                      "return binade - EMAX")),
    },
    grade=_grade_e8m0,
)

EXERCISES = (UPCAST, FP8_DOT, BLOCKWISE, FNUZ_MAX, BLOCK_SCALE, E8M0)
