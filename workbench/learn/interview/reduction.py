"""Interview family: a reduction across the lanes of a wave (DPP, permutes, permlane).

The compiled evidence is attention v4's softmax (row max and row sum over an MFMA
fragment, i.e. across lanes). The butterfly is simulated here on a 64-lane vector, so the
step count is computed, not recalled.
"""
from __future__ import annotations

import re
from collections import Counter

import torch

from ... import isa
from ..flashcards import Card, one_of
from ...harness.table import html_table
from .evidence import CROSS_LANE, lanes

FAMILY = "Wave reductions: DPP and permlane"
DPP = "DPP modifiers"


def butterfly_steps(width: int) -> int:
    """Exchange steps of an XOR butterfly until every lane of ``width`` holds the sum,
    simulated on distinct values (not taken from log2)."""
    values = torch.arange(1, width + 1, dtype=torch.float64)
    total, steps, offset = values.sum(), 0, 1
    while not bool((values == total).all()):
        values = values + values[torch.arange(width) ^ offset]
        steps, offset = steps + 1, offset * 2
    return steps


def _steps_card() -> Card:
    def widths():
        return lanes("gfx942")["lanes per wave"], lanes("sm90")["lanes per wave"]

    def answer():
        amd, nv = widths()
        return (f"{butterfly_steps(amd)} on a {amd}-lane wavefront, {butterfly_steps(nv)} on a {nv}-lane warp "
                "(simulated: XOR offsets 1, 2, 4, ... until every lane holds the sum). The first "
                "four steps stay inside a row of 16 lanes, where DPP can feed a VALU operand from "
                "another lane for free (`quad_perm`, `row_shr`); offsets 16 and 32 cross rows, "
                "which on CDNA3 takes `ds_swizzle`/`ds_bpermute_b32` (an LDS-unit instruction, "
                "waited on with `s_waitcnt lgkmcnt`), DPP `row_bcast:15/31`, or "
                "`v_readlane` for a scalar result (AMD Instinct MI300 ISA reference, DPP and "
                "data-share chapters). A port of a 5-step warp reduction misses the last step "
                "and sums half the wave.")

    def claims():
        return one_of(tuple(butterfly_steps(w) for w in widths()), ((6, 5), (5, 5), (6, 6), (64, 32)),
                      "{0[0]} and {0[1]}")

    return Card("Reduction: butterfly steps on a wavefront",
                "An all-lane sum by XOR butterfly: how many exchange steps on an MI300X wavefront, "
                "and on a CUDA warp?",
                answer, lambda: [html_table([lanes("gfx942"), lanes("sm90")], caption="attention v4 compiled")],
                claims, FAMILY)


def cross_lane_rows() -> list[dict]:
    """Attention v4's cross-lane instructions on gfx942 and gfx950."""
    rows = []
    for target in ("gfx942", "gfx950"):
        asm = isa.inspect("attention", "v4", target).asm
        found = Counter(re.findall(CROSS_LANE, asm))
        rows.append({"target": target, **{name: found.get(name, 0) for name in sorted(
            {*found, "ds_bpermute_b32", "v_permlane16_swap_b32_e32", "v_permlane32_swap_b32_e32"})},
            DPP: len(re.findall(r"\b(?:quad_perm|row_\w+)\s*:", asm))})
    return rows


def _cross_lane_evidence() -> list[str]:
    return [html_table(cross_lane_rows(), caption="attention v4, cross-lane instructions")]


def _instructions(target: str) -> set[str]:
    row = next(r for r in cross_lane_rows() if r["target"] == target)
    return {name for name, count in row.items() if name not in ("target", DPP) and count}


def _dpp(target: str) -> int:
    return next(r for r in cross_lane_rows() if r["target"] == target)[DPP]


def _gfx942_card() -> Card:
    def answer():
        used = ", ".join(sorted(_instructions("gfx942")))
        return (f"`{used}`: Triton lowers the cross-lane steps of the softmax's row reductions "
                "to a permute through the LDS unit's crossbar (no LDS memory is allocated, but "
                "each one is an LDS-unit instruction with its latency and an `lgkmcnt` wait). "
                f"The compile has {_dpp('gfx942')} DPP modifiers. A hand-written CDNA3 reduction would use "
                "DPP for the steps inside 16-lane rows (the data moves inside the VALU operand "
                "path) and keep the permute for the rest.")

    def claims():
        used = _instructions("gfx942")
        return {"ds_bpermute_b32 (LDS-unit permute)": used == {"ds_bpermute_b32"},
                "DPP row_shr on v_max_f32": _dpp("gfx942") > 0 and not used,
                "v_permlane32_swap": "v_permlane32_swap_b32_e32" in used,
                "v_readlane_b32 then s_max": "v_readlane_b32" in used}

    return Card("Reduction: what Triton emits on gfx942",
                "Attention v4's softmax takes a row max and a row sum across the lanes of its MFMA "
                "fragments. Which instruction moves the values between lanes in the gfx942 compile?",
                answer, _cross_lane_evidence, claims, FAMILY)


def _gfx950_card() -> Card:
    def answer():
        new = ", ".join(sorted(_instructions("gfx950") - _instructions("gfx942")))
        return (f"`{new}` replace `ds_bpermute_b32` on gfx950 (CDNA4): VALU instructions that swap "
                "16-lane rows or 32-lane halves of the wave between two registers (AMD Instinct "
                "MI355X / CDNA4 ISA reference), so the row reduction no longer goes through the "
                "LDS unit and leaves it to the tiles. Same Triton source, different machine code: check the target's ISA "
                "before carrying a reduction trick from one generation to the next.")

    def claims():
        new = _instructions("gfx950") - _instructions("gfx942")
        return {"v_permlane16_swap and v_permlane32_swap": new == {"v_permlane16_swap_b32_e32",
                                                                   "v_permlane32_swap_b32_e32"},
                "ds_bpermute_b32, as on gfx942": _instructions("gfx950") == _instructions("gfx942"),
                "ds_swizzle_b32": "ds_swizzle_b32" in new}

    return Card("Reduction: what changes on gfx950",
                "The same attention v4 compiled for gfx950 (MI355X): what moves values between "
                "lanes in its softmax reductions?",
                answer, _cross_lane_evidence, claims, FAMILY)


def cards() -> list[Card]:
    return [_steps_card(), _gfx942_card(), _gfx950_card()]
