"""Interview family: MI300X against H100 and H200, from the datasheet specs (model numbers).

Each number is a spec field with its source (``roofline/specs/*.yaml``); ratios and fits
are arithmetic on them, never a measurement.
"""
from __future__ import annotations

import math

import roofline

from ..flashcards import Card
from ...harness.table import html_table
from .evidence import ridges

FAMILY = "MI300X against H100/H200"
RIVALS = ("MI300X", "H100", "H200")
WEIGHTS_GB, KV_GB = 140, 40   # a 70B-parameter model in bf16; room wanted for the KV cache


def _ridge_card() -> Card:
    def answer():
        gpu = roofline.spec("MI300X")
        return (f"{gpu.peak('bf16'):g} TFLOP/s bf16 over {gpu.hbm_tbps:g} TB/s of HBM: the "
                f"ridge is at {gpu.ridge('bf16'):.0f} FLOP per byte (model, datasheet numbers). "
                "A kernel with less arithmetic intensity is memory-bound on MI300X. fp8's "
                f"peak is {gpu.peak('fp8') / gpu.peak('bf16'):.0f}x bf16's over the same "
                f"bandwidth, so its ridge is at {gpu.ridge('fp8'):.0f}.")

    def claims():
        values = {row["GPU"]: row["bf16"] for row in ridges()}
        mine = values[roofline.spec("MI300X").name]
        return {f"{v} FLOP/byte": v == mine for v in dict.fromkeys(values.values())}

    return Card("Roofline: the MI300X ridge point",
                "Where does MI300X's HBM roof meet its dense bf16 peak?",
                answer, lambda: [html_table(ridges(), caption="ridge points, FLOP per HBM byte (model)")],
                claims, FAMILY)


def capacity_rows() -> list[dict]:
    return [{"GPU": roofline.spec(n).name, "HBM GB": roofline.spec(n).hbm_gb,
             "left after the weights": roofline.spec(n).hbm_gb - WEIGHTS_GB,
             "GPUs to hold the weights": math.ceil(WEIGHTS_GB / roofline.spec(n).hbm_gb)} for n in RIVALS]


def _capacity_card() -> Card:
    def fits():
        return [r["GPU"] for r in capacity_rows() if r["left after the weights"] >= KV_GB]

    def answer():
        rows = {r["GPU"]: r for r in capacity_rows()}
        mi, h100, h200 = (rows[roofline.spec(n).name] for n in RIVALS)
        return (f"{', '.join(fits())}: {mi['HBM GB']:g} GB holds the {WEIGHTS_GB} GB of weights with "
                f"{mi['left after the weights']:g} GB left for the KV cache. An H200's {h200['HBM GB']:g} GB "
                f"leaves {h200['left after the weights']:g} GB, an H100 needs "
                f"{h100['GPUs to hold the weights']} GPUs for the weights alone, so tensor parallelism "
                "and its all-reduces start earlier. Capacity is MI300X's clearest datasheet lead; "
                "per-GPU throughput then depends on the kernels.")

    def claims():
        right = fits()
        options = {roofline.spec(n).name: [roofline.spec(n).name] == right for n in RIVALS}
        options["None of them: every GPU needs two"] = not right
        return options

    return Card("MI300X vs H100/H200: memory capacity",
                f"Serving a 70B-parameter model in bf16 ({WEIGHTS_GB} GB of weights) on one GPU with at "
                f"least {KV_GB} GB left for the KV cache: which GPU can?",
                answer, lambda: [html_table(capacity_rows(), caption="roofline specs (datasheets)")],
                claims, FAMILY)


def bandwidth_rows() -> list[dict]:
    mi = roofline.spec("MI300X")
    return [{"GPU": roofline.spec(n).name, "HBM TB/s": roofline.spec(n).hbm_tbps,
             "bf16 TFLOP/s": roofline.spec(n).peak("bf16"),
             "MI300X / it, HBM": round(mi.hbm_tbps / roofline.spec(n).hbm_tbps, 2),
             "MI300X / it, bf16 peak": round(mi.peak("bf16") / roofline.spec(n).peak("bf16"), 2)}
            for n in RIVALS[1:]]


def _bandwidth_card() -> Card:
    def ratios():
        return [(r["MI300X / it, HBM"], r["MI300X / it, bf16 peak"]) for r in bandwidth_rows()]

    def answer():
        (h100_hbm, h100_peak), (h200_hbm, h200_peak) = ratios()
        return (f"{h100_hbm:g}x over H100 and {h200_hbm:g}x over H200: a memory-bound decode step "
                "scales with HBM bandwidth (model, datasheet). The bf16 peak ratios "
                f"({h100_peak:g}x and {h200_peak:g}x) do not apply to it: a decode GEMM sits far "
                "left of every ridge. H200 is an H100 with more and faster HBM (same compute), so "
                "against it MI300X's bandwidth lead shrinks while its compute lead stays.")

    def claims():
        (h100_hbm, h100_peak), (h200_hbm, h200_peak) = ratios()
        return {f"{h100_hbm:g}x and {h200_hbm:g}x": True,
                f"{h100_peak:g}x and {h200_peak:g}x": (h100_peak, h200_peak) == (h100_hbm, h200_hbm),
                "1x and 1x: all three use HBM3-class memory": (h100_hbm, h200_hbm) == (1, 1)}

    return Card("MI300X vs H100/H200: memory-bound decode",
                "For a memory-bound decode step, by what factor does MI300X's datasheet bound beat "
                "H100's, and H200's?",
                answer, lambda: [html_table(bandwidth_rows(), caption="roofline specs (model)")],
                claims, FAMILY)


def cards() -> list[Card]:
    return [_ridge_card(), _capacity_card(), _bandwidth_card()]
