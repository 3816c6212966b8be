"""Interview family: FP8 on MI300X: formats, recipes, and OCP checkpoints on fnuz hardware.

Every fact is computed on this machine from torch's float8 dtypes (``torch.finfo``,
casts, bytes viewed as each dtype) and from the project's quantizer.
"""
from __future__ import annotations

import math

import torch

import roofline
from kernels.gemm_fp8 import quantize_fp8

from ..flashcards import Card
from ...harness.table import html_table
from .evidence import GPUS, fp8_rows

FAMILY = "FP8 recipes and OCP to fnuz"


def _fp8_card() -> Card:
    def answer():
        fnuz, ocp = fp8_rows()
        return (f"{fnuz['native on']} (MI300X) takes {fnuz['format']}: max {fnuz['max']:g}; -0.0 "
                f"casts to the byte {fnuz['-0.0 cast, byte']} (no negative zero) and the byte 0x80 "
                f"decodes to {fnuz['byte 0x80']}. {ocp['native on']} (MI355X, Hopper) take "
                f"{ocp['format']}: max {ocp['max']:g}, 0x80 is {ocp['byte 0x80']:g}. The same byte "
                f"0x40 is {fnuz['byte 0x40']:g} in fnuz and {ocp['byte 0x40']:g} in OCP (the "
                "exponent biases differ): bytes cannot move between the two without "
                f"re-quantizing, and a scale computed for {ocp['max']:g} overflows {fnuz['max']:g}."
                "\n\n"
                f"A cast of 1000 gives {fnuz['1000 cast']:g} in fnuz and {ocp['1000 cast']:g} in "
                "OCP on this machine, so `kernels.gemm_fp8.quantize_fp8` clamps to the format's "
                "max before casting: both formats then saturate alike.")

    def evidence():
        specs = [{"GPU": roofline.spec(n).name, "fp8 formats (spec)": roofline.spec(n).formats.get("fp8")}
                 for n in GPUS]
        return [html_table(fp8_rows(), caption="torch.finfo and casts, on this machine"),
                html_table(specs, caption="roofline specs")]

    def claims():
        return {f"{row['format']}, max {row['max']:g}": "gfx942" in row["native on"].split(", ")
                for row in fp8_rows()}

    return Card("FP8: fnuz against OCP",
                "Which e4m3 format do MI300X's matrix cores take, and what is its largest value?",
                answer, evidence, claims, FAMILY)


def byte_rows() -> list[dict]:
    """All 256 bytes decoded as OCP e4m3fn and as e4m3fnuz, in classes."""
    bits = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    fn, fnuz = bits.view(torch.float8_e4m3fn).float(), bits.view(torch.float8_e4m3fnuz).float()
    both = fn.isfinite() & fnuz.isfinite() & (fn != 0)
    ratios = sorted(set((fn[both] / fnuz[both]).tolist()))
    return [{"bytes": "finite, nonzero in both", "count": int(both.sum()), "OCP value / fnuz value": ratios},
            {"bytes": "0x80", "count": 1, "OCP": fn[0x80].item(), "fnuz": fnuz[0x80].item()},
            {"bytes": "0x7f, 0xff", "count": 2, "OCP": [fn[0x7F].item(), fn[0xFF].item()],
             "fnuz": [fnuz[0x7F].item(), fnuz[0xFF].item()]}]


def _convert_card() -> Card:
    def facts():
        finite, zero, top = byte_rows()
        return finite["OCP value / fnuz value"], zero["fnuz"], top["fnuz"]

    def answer():
        ratios, zero, top = facts()
        return (f"Keep the bytes, double the scale, and map the byte 0x80 to 0x00. Decoded both ways, "
                f"every byte that is finite and nonzero in both formats is worth exactly "
                f"{ratios[0]:g}x more in OCP than in fnuz (the exponent bias is 7 against 8), so "
                "x = fp8_ocp · s = fp8_fnuz · 2s with the same bits. The exceptions: 0x80 is -0 in "
                f"OCP but {zero} in fnuz (hence the remap), and 0x7f/0xff are NaN in OCP but "
                f"{top[0]:g}/{top[1]:g} in fnuz (a checkpoint holds no NaN). OCP's largest "
                "value 448 lands on 224, inside fnuz's 240: no clipping. No dequantize, no "
                "re-rounding: the conversion is exact, which is how ROCm inference stacks load OCP "
                "FP8 checkpoints on MI300X.")

    def claims():
        ratios, zero, _ = facts()
        exact = len(ratios) == 1
        return {"Keep the bytes, double the scale, map 0x80 to 0": exact and ratios[0] == 2 and math.isnan(zero),
                "Keep the bytes and the scale: both are e4m3": exact and ratios[0] == 1,
                "Dequantize to bf16 and quantize again: no exact shortcut": not exact}

    return Card("FP8: converting an OCP checkpoint to fnuz",
                "An FP8 checkpoint in OCP e4m3fn with per-tensor scales must run on MI300X, "
                "whose matrix cores take e4m3fnuz. What is the exact, cheapest conversion?",
                answer, lambda: [html_table(byte_rows(), caption="torch: the 256 bytes viewed as each dtype")],
                claims, FAMILY)


OUTLIERS = (100, 1_000, 10_000)


def granularity_rows() -> list[dict]:
    """Median relative error of the ordinary rows of a seeded 64x256 weight whose row 0 is
    ``outlier`` times larger, quantized to e4m3fnuz with one scale per tensor or per row."""
    rows = []
    for outlier in OUTLIERS:
        w = torch.randn(64, 256, generator=torch.Generator().manual_seed(0))
        w[0] *= outlier
        row = {"outlier row": f"{outlier}x"}
        for granularity in ("tensor", "row"):
            q, scale = quantize_fp8(w, torch.float8_e4m3fnuz, granularity)
            err = (q.float() * scale - w).norm(dim=1) / w.norm(dim=1)
            row[f"per-{granularity} scale: error of the other rows"] = err[1:].median().item()
        row["ratio"] = row["per-tensor scale: error of the other rows"] / row["per-row scale: error of the other rows"]
        rows.append(row)
    return rows


def _granularity_card() -> Card:
    def ratios():
        return [row["ratio"] for row in granularity_rows()]

    def answer():
        rows = granularity_rows()
        low, high = rows[0], rows[-1]
        return (f"Barely: with a {low['outlier row']} outlier the per-tensor scale leaves the other "
                f"rows {low['ratio']:.2f}x the error of per-row scales "
                f"({low['per-tensor scale: error of the other rows']:.4f} against "
                f"{low['per-row scale: error of the other rows']:.4f}, median relative error, "
                "`kernels.gemm_fp8.quantize_fp8`, seeded matrix). e4m3 is floating point: its "
                "relative error is set by the 3 mantissa bits for any value in the normal range, "
                "wherever the scale puts it. The int8 intuition (an outlier steals the other rows' "
                f"levels) does not carry over until the other rows fall below the smallest normal, "
                f"{torch.finfo(torch.float8_e4m3fnuz).tiny:g} x scale: at {high['outlier row']} the "
                f"ratio is {high['ratio']:.2f}x. Per-row (A) and per-column (B) scales are free in a "
                "GEMM's epilogue (`kernels.matmul_fp8` takes them, as `torch._scaled_mm` does), so "
                "recipes use them anyway, and block scales (DeepSeek-V3: 128-wide) for wider ranges.")

    def claims():
        first = ratios()[0]
        return {"Barely: e4m3 keeps ~3 mantissa bits of relative precision": first < 1.1,
                "The other rows lose ~100x in precision, as with int8": first > 50,
                "Only a per-row scale keeps them from rounding to zero": (
                    granularity_rows()[0]["per-tensor scale: error of the other rows"] > 0.9)}

    return Card("FP8: how much does a per-tensor scale cost",
                "A weight matrix has one row 100x larger than the others. Quantized to e4m3fnuz "
                "with one scale for the whole tensor instead of one per row, how much precision "
                "do the other rows lose?",
                answer, lambda: [html_table(granularity_rows(), caption="64x256, seeded, e4m3fnuz")],
                claims, FAMILY)


def _eps(dtype) -> float:
    """The gap from 1 to the next value, read from the bytes rather than ``torch.finfo``
    (whose eps for float8_e5m2fnuz is a 3-bit mantissa's in torch 2.13)."""
    one = torch.tensor([1.0]).to(dtype).view(torch.uint8)
    return (one + 1).view(dtype).float().item() - 1


def format_rows() -> list[dict]:
    return [{"format": str(d).removeprefix("torch."), "max": torch.finfo(d).max, "eps": _eps(d),
             "torch.finfo eps": torch.finfo(d).eps, "smallest normal": torch.finfo(d).tiny}
            for d in (torch.float8_e4m3fnuz, torch.float8_e5m2fnuz, torch.float8_e4m3fn, torch.float8_e5m2)]


def _e5m2_card() -> Card:
    def fnuz():
        e4, e5 = format_rows()[:2]
        return e4, e5

    def answer():
        e4, e5 = fnuz()
        finfo = ("" if e5["torch.finfo eps"] == e5["eps"] else
                 f"; `torch.finfo` says {e5['torch.finfo eps']:g} for e5m2fnuz, which is wrong")
        return (f"Range: e5m2 trades a mantissa bit for an exponent bit. In the fnuz pair the "
                f"largest value is {e5['max']:g} against {e4['max']:g} and the smallest normal "
                f"{e5['smallest normal']:g} against {e4['smallest normal']:g}, at a precision (eps) "
                f"of {e5['eps']:g} against {e4['eps']:g} (from the bytes{finfo}). Gradients span more "
                "orders of magnitude than weights and activations and tolerate coarser rounding, "
                "hence the hybrid recipe: e4m3 forward, e5m2 for gradients. Per-tensor delayed "
                "scaling (from an amax history) keeps either inside its range.")

    def claims():
        e4, e5 = fnuz()
        return {f"e5m2 has the range: max {e5['max']:g} against {e4['max']:g}": e5["max"] > e4["max"],
                "e5m2 is more precise than e4m3": e5["eps"] < e4["eps"],
                "Both have the same range; e5m2 is faster": e5["max"] == e4["max"]}

    return Card("FP8: e4m3 or e5m2 for gradients",
                "An FP8 training recipe casts weights and activations to e4m3 but gradients to "
                "e5m2. Why?",
                answer, lambda: [html_table(format_rows(), caption="torch.finfo")], claims, FAMILY)


def cards() -> list[Card]:
    return [_fp8_card(), _convert_card(), _granularity_card(), _e5m2_card()]
