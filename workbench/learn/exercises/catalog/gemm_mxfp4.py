"""MXFP4 GEMM exercises: the e8m0 block scales go into the dot, not the epilogue."""
from __future__ import annotations

from kernels.gemm_mxfp4.formats import FORMAT

from ..model import KernelExercise
from ..source import variant

MODULE = "kernels.gemm_mxfp4.v0_triton_dot_scaled"

DOT_SCALED = KernelExercise(
    key="gemm_mxfp4/v0", module=MODULE, op="gemm_mxfp4", rung="v0",
    title="Block scales inside the dot: tl.dot_scaled",
    task="a and b hold this K step's packed e2m1 tiles (two elements per byte). Every 32 "
         "elements along K have their own e8m0 scale, so unlike FP8 the scales cannot wait for "
         "the epilogue. Load this step's scales of A (BLOCK_M x BLOCK_K/32, from sa_ptrs) and of "
         "B (BLOCK_N x BLOCK_K/32, from sb_ptrs), masked like the tiles, and accumulate the "
         "scaled product into acc.",
    todo={"scaled_dot": "# TODO: load this step's e8m0 scales and accumulate the scaled product\n"
                        "acc += 0.0"},
    hints=(
        "tl.dot_scaled(a, a_scales, ELEMENTS, b, b_scales, ELEMENTS, acc) takes the packed tiles "
        "(ELEMENTS is the element format, \"e2m1\" here) and one scale byte per 32 elements, and "
        "applies the scales inside the dot.",
        "k_scales = cdiv(K - k0, 32) scales are left in this row; a lane is real when its row (or "
        "column) exists and ks < k_scales. Masked-off scales load 0.",
        "sa = tl.load(sa_ptrs, mask=(rows[:, None] < M) & (ks[None, :] < k_scales), other=0), "
        "sb the same with cols and N, then acc = tl.dot_scaled(a, sa, ELEMENTS, b, sb, ELEMENTS, acc).",
    ),
    wrong={
        "scales of A and B swapped": variant(
            MODULE, "scaled_dot", ("(a, sa, ELEMENTS, b, sb, ", "(a, sb, ELEMENTS, b, sa, ")),
        "scale rows not masked": variant(
            MODULE, "scaled_dot", ("(rows[:, None] < M) & (ks", "(ks"), ("(cols[:, None] < N) & (ks", "(ks")),
        "block scales left out": variant(
            MODULE, "scaled_dot", ("(a, sa, ELEMENTS, b, sb, ", "(a, None, ELEMENTS, b, None, ")),
    },
    shapes=((37, 29, 53), (5, 67, 96)), dtypes=(FORMAT,),
)

EXERCISES = (DOT_SCALED,)
