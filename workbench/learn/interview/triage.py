"""Interview family: triaging a slow kernel the way rocprof-compute does, without the GPU.

rocprof-compute starts at the speed-of-light and roofline panels, then drills into the
pipelines. Here the roofline position comes from the op specs and datasheets (model) and
the pipeline mix from a compiled hot loop; the counters themselves need a GPU.
"""
from __future__ import annotations

import torch

import kernels
import roofline

from ...isa import parse as isa_parse
from ..flashcards import Card
from ...harness.table import html_table
from .occupancy import dkdv

FAMILY = "Triaging a slow kernel (rocprof-compute)"
DECODE = "decode M=16 (4096x14336)"


def decode_row() -> dict:
    gemm, gpu = kernels.spec("gemm"), roofline.spec("MI300X")
    shape = gemm.bench_shapes[DECODE]
    intensity = gemm.flops(shape) / gemm.bytes_moved(shape, torch.bfloat16)
    return {"shape": f"{DECODE} {shape}", "FLOP/byte": round(intensity, 1),
            "MI300X bf16 ridge": round(gpu.ridge("bf16")), "bound (model)": roofline.bound(gpu, intensity, "bf16"),
            "attainable TFLOP/s (model)": round(roofline.attainable(gpu, intensity, "bf16")),
            "share of bf16 peak": f"{roofline.attainable(gpu, intensity, 'bf16') / gpu.peak('bf16'):.1%}"}


def _decode_card() -> Card:
    def answer():
        row = decode_row()
        return (f"HBM bandwidth. The {DECODE} bf16 GEMM does {row['FLOP/byte']} FLOP per byte "
                f"against a ridge at {row['MI300X bf16 ridge']}: {row['bound (model)']}-bound, and "
                f"its roof is {row['attainable TFLOP/s (model)']} TFLOP/s, {row['share of bf16 peak']} of "
                "the bf16 peak (model). A low MFMA utilization in rocprof-compute's speed-of-light "
                "panel is then expected, not the problem: compare the achieved HBM bandwidth with "
                f"the {roofline.spec('MI300X').hbm_tbps:g} TB/s roof, then look at the memory chart "
                "(vector L1 / L2 hit rates, whether loads are 16 bytes wide).")

    def claims():
        bound = decode_row()["bound (model)"]
        return {"Achieved HBM bandwidth against its roof": bound == "hbm",
                "MFMA utilization against the bf16 peak": bound == "compute",
                "LDS bandwidth against its roof": bound == "lds"}

    return Card("Triage: a slow decode GEMM",
                f"rocprof-compute on a bf16 GEMM with M=16 (`{DECODE}`) on MI300X shows low MFMA "
                "utilization. Which number do you judge the kernel by first?",
                answer, lambda: [html_table([decode_row()], caption="roofline (model), MI300X datasheet")],
                claims, FAMILY)


def pipeline_rows() -> list[dict]:
    """Instructions in attention v5's dK/dV hot loop on gfx942, by unit."""
    report = dkdv()
    ops = [isa_parse.mnemonic(line) for line in report.hot_loop.splitlines()]
    ops = [op for op in ops if op]
    mfma = sum(op.startswith("v_mfma") for op in ops)
    valu = sum(op.startswith("v_") and not op.startswith("v_mfma") for op in ops)
    return [{"kernel": report.kernel_name, "MFMA": mfma, "other VALU": valu,
             "LDS": sum(op.startswith("ds_") for op in ops), "scalar": sum(op.startswith("s_") for op in ops)}]


def _valu_card() -> Card:
    def answer():
        row = pipeline_rows()[0]
        return (f"The vector ALU. The hot loop of attention v5's dK/dV kernel on gfx942 issues "
                f"{row['other VALU']} VALU instructions against {row['MFMA']} MFMAs (compiled, "
                "counted): recomputing P = exp2(...) from the saved log-sum-exp, dS = P ∘ (dP - Δ), "
                "and conversions to bf16 are element-wise work on every score, "
                f"{row['other VALU'] / row['MFMA']:.1f} VALU instructions per MFMA. The matrix core "
                "runs an MFMA while the SIMD issues other work, so the loop lasts as long as the "
                "longer stream; when rocprof-compute shows VALU busy and MFMA idle here, the fix "
                "is less element-wise work per score (fewer conversions, exp2 on pre-scaled "
                "inputs), not a bigger tile.")

    def claims():
        row = pipeline_rows()[0]
        return {"VALU instructions outnumber the MFMAs": row["other VALU"] > row["MFMA"],
                "MFMAs outnumber everything else": row["MFMA"] > row["other VALU"] + row["LDS"],
                "LDS instructions outnumber the MFMAs": row["LDS"] > row["MFMA"] >= row["other VALU"]}

    return Card("Triage: a backward kernel full of MFMAs that is not MFMA-bound",
                "rocprof-compute on attention's dK/dV backward kernel shows the matrix cores idle "
                "much of the time. What does the compiled hot loop point at?",
                answer, lambda: [html_table(pipeline_rows(), caption="gfx942 compile, hot loop instructions")],
                claims, FAMILY)


def cards() -> list[Card]:
    return [_decode_card(), _valu_card()]
