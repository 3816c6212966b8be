"""The FP8 grouped GEMM (``grouped_gemm_fp8`` v0): grouped GEMM v2's one launch and schedule
(:mod:`.grouped_gemm`) with one-byte e4m3 operands on the FP8 matrix cores and a bf16 output.

Its tile is v2's with BLOCK_K = 128 (:func:`kernels.moe.grouped_gemm_fp8.v0_one_launch.config`),
its weight K-contiguous (its ``aot``); the row and column scales, read once per tile in
the epilogue, are not charged. The clock under an FP8 MFMA load is MAF2's where measured
(MI300X, MI325X), else the spec's; on sm_90 (H100, H200) the config is v0's "cuda" one, the loop
the PTX's e4m3 ``wgmma`` (:mod:`.ptx_loop`) and the clock the tensor peaks' 1830 MHz.
"""
from __future__ import annotations

from kernels.gemm_fp8.formats import fp8_dtype
from kernels.moe.grouped_gemm import spec
from kernels.moe.grouped_gemm_fp8 import v0_one_launch
from kernels.moe.grouped_gemm_fp8.spec import SPEC

from .. import isa
from . import gemm, grouped_gemm
from .prediction import NotCovered, Prediction

RUNGS = ("v0",)
OUT_BYTES = 2     # bf16, the output its aot compiles


def predict(label: str, shape, dtype: str, chip_spec) -> Prediction:
    """FP8 grouped GEMM rung ``label`` at ``shape`` (T, K, N, G, routing)."""
    shape = grouped_gemm.check(shape)
    if dtype != "fp8":
        raise NotCovered(f"dtype {dtype!r}: the FP8 grouped GEMM model covers fp8 (e4m3 operands, bf16 output)")
    if label not in RUNGS:
        raise NotCovered(f"the model covers grouped_gemm_fp8 rungs {', '.join(RUNGS)}, not {label}")
    cfg = v0_one_launch.config(gemm.backend_of(chip_spec.target), chip_spec.target)
    report = isa.inspect_launch("grouped_gemm_fp8", label, 0, target=chip_spec.target,   # the forward
                                dtype=fp8_dtype(chip_spec.target))
    sizes = grouped_gemm.group_rows(shape)
    return grouped_gemm.tile_prediction(
        "grouped_gemm_fp8", label, shape, sizes, cfg, report, dtype, chip_spec, 1, OUT_BYTES, SPEC.flops(shape),
        f"grouped_gemm_fp8 {label}'s config (one per backend)", schedule="v2",
        **{"rows per group": (sizes, f"routing {spec.ROUTINGS[shape[4]]!r}, one seed-0 draw (model input)"),
           "tile order": ("grouped GEMM v2's one launch", "v0_one_launch's docstring")})
