"""Interview family: whiteboarding the MFMA C fragment (which lane holds which output).

The layout is the documented one (AMD's matrix instruction calculator; ROCm blog "AMD
matrix cores"): for a 16x16 output block lane l holds column l % 16 and rows
4·(l // 16) + i in its registers i = 0..3; for 32x32, column l % 32 and rows
8·(i // 4) + 4·(l // 32) + i % 4 in registers i = 0..15. What the compile shows agrees:
the width of each MFMA's destination register range.
"""
from __future__ import annotations

import re
from collections import Counter

from ... import isa
from ..flashcards import Card, one_of
from ...harness.table import html_table
from .evidence import gemm_v4_config, instruction_shape

FAMILY = "MFMA C-fragment layout"
LANES = 64


def c_element(m: int, lane: int, register: int) -> tuple[int, int]:
    """(row, column) of the C element that ``lane``'s accumulator ``register`` holds, for
    an m x m fp32 output block (m = 16 or 32) of a 64-lane wave."""
    if m == 16:
        return 4 * (lane // 16) + register, lane % 16
    if m == 32:
        return 8 * (register // 4) + 4 * (lane // 32) + register % 4, lane % 32
    raise ValueError(f"m must be 16 or 32, got {m!r}")


def covers_once(m: int) -> bool:
    """Whether the layout gives every element of the m x m block to exactly one (lane, register)."""
    owners = Counter(c_element(m, lane, r) for lane in range(LANES) for r in range(m * m // LANES))
    return len(owners) == m * m and set(owners.values()) == {1}


def destination_widths(report) -> dict[str, int]:
    """Each matrix instruction of a compiled kernel -> registers in its destination range."""
    widths = {}
    for name, first, last in re.findall(r"(v_mfma_\w+)\s+[av]\[(\d+):(\d+)\]", report.asm):
        widths.setdefault(name, int(last) - int(first) + 1)
    return widths


def width_rows() -> list[dict]:
    rows = []
    for rung in ("v3", "v4"):
        for name, width in destination_widths(isa.inspect("gemm", rung, "gfx942")).items():
            m, n, _ = instruction_shape(name)
            rows.append({"rung": rung, "instruction": name, "C registers per lane (compiled)": width,
                         "M·N / 64 lanes": m * n // LANES, "layout covers C once": covers_once(m)})
    return rows


def _registers_card() -> Card:
    def widths():
        return {instruction_shape(r["instruction"])[0]: r["C registers per lane (compiled)"] for r in width_rows()}

    def answer():
        w = widths()
        return (f"32x32: {w[32]} fp32 registers per lane; 16x16: {w[16]}. A wave's 64 lanes "
                "share the M·N accumulators evenly (32·32/64 and 16·16/64), which is what the "
                "gfx942 compile shows: GEMM v3's `v_mfma_f32_32x32x8_bf16` writes a range of "
                f"{w[32]} registers, v4's `v_mfma_f32_16x16x16_bf16` one of {w[16]}."
                "\n\n"
                "Why it matters at the whiteboard: the accumulators of a 128x128 tile over 8 waves "
                "are 128·128/(8·64) = 32 registers per lane whatever the instruction, but the "
                "epilogue, the row reductions of a softmax and the registers live per instruction "
                "follow the fragment: 16x16 keeps four rows of one column per lane, 32x32 sixteen.")

    def claims():
        w = widths()
        return one_of((w[32], w[16]), ((16, 4), (32, 8), (8, 4), (16, 16)), "{0[0]} and {0[1]}")

    return Card("MFMA: accumulator registers per lane",
                "How many fp32 C registers does each lane hold for one `v_mfma_f32_32x32x8_bf16`, "
                "and for one `v_mfma_f32_16x16x16_bf16`?",
                answer, lambda: [html_table(width_rows(), caption="gfx942 compiles: destination ranges "
                                                                  "of the MFMAs; documented layout")],
                claims, FAMILY)


LANE, REGISTER = 21, 3


def _element_card() -> Card:
    def candidates() -> dict[str, tuple[int, int]]:
        row, col = c_element(16, LANE, REGISTER)
        flat = LANE * 4 + REGISTER
        return {"the documented layout": (row, col), "its transpose": (col, row),
                "registers interleaved": (REGISTER * 4 + LANE // 16, LANE % 16),
                "lanes row-major": (flat // 16, flat % 16)}

    def answer():
        row, col = c_element(16, LANE, REGISTER)
        return (f"C[{row}][{col}]. Lane l holds column l % 16 = {col}; the lanes come in four groups "
                f"of 16 and group l // 16 = {LANE // 16} holds rows 4·{LANE // 16} to 4·{LANE // 16} + 3, "
                f"one per register, so register {REGISTER} is row {row}."
                "\n\n"
                "So a row of C is spread over 16 lanes (one register each): a row max or row sum "
                "of a softmax on this fragment is a reduction across lanes, while the four rows a "
                "lane holds need none. Source: AMD's matrix instruction calculator "
                "(amd_matrix_instruction_calculator, `--detail-instruction`), and the "
                "check that this layout covers the 16x16 block exactly once (table).")

    def evidence():
        rows = [{"lane": lane, **{f"register {r}": "C[%d][%d]" % c_element(16, lane, r) for r in range(4)}}
                for lane in (0, 1, 15, 16, LANE, 47, 63)]
        return [html_table(rows, caption=f"16x16 output block, documented layout; covers it once: "
                                         f"{covers_once(16)}")]

    def claims():
        right = c_element(16, LANE, REGISTER)
        return {"C[%d][%d]" % rc: rc == right for rc in candidates().values()}

    return Card("MFMA: whiteboard the 16x16 C fragment",
                f"Draw the C fragment of `v_mfma_f32_16x16x16_bf16` on a 64-lane wave. Which element "
                f"of the 16x16 block does lane {LANE} hold in its accumulator register {REGISTER}?",
                answer, evidence, claims, FAMILY)


def mfma_per_step() -> dict:
    cfg = gemm_v4_config()
    report = isa.inspect("gemm", "v4", "gfx942")
    (name,) = report.matrix_instructions
    m, n, k = instruction_shape(name)
    per_wave = cfg["BLOCK_M"] * cfg["BLOCK_N"] * cfg["BLOCK_K"] // (cfg["num_warps"] * m * n * k)
    in_loop = sum(1 for line in report.hot_loop.splitlines() if name in line)
    return {"tile": f"{cfg['BLOCK_M']}x{cfg['BLOCK_N']}x{cfg['BLOCK_K']}", "waves": cfg["num_warps"],
            "instruction": name, "MFMAs per wave per K step (arithmetic)": per_wave,
            "MFMAs in the compiled hot loop": in_loop}


def _per_step_card() -> Card:
    def answer():
        row = mfma_per_step()
        mnk = "·".join(map(str, instruction_shape(row["instruction"])))
        return (f"{row['MFMAs per wave per K step (arithmetic)']}: the {row['tile']} tile is "
                f"{row['waves']} waves' work, and each `{row['instruction']}` covers {mnk} of it, "
                f"so {row['tile'].replace('x', '·')} / ({row['waves']}·{mnk}). The compiled hot loop holds exactly "
                f"{row['MFMAs in the compiled hot loop']} of them: one K step per trip, no unrolling.")

    def claims():
        return one_of(mfma_per_step()["MFMAs in the compiled hot loop"], (8, 16, 32, 64, 128))

    return Card("MFMA: instructions per K step",
                "GEMM v4 on gfx942: a 128x128x64 bf16 tile, 8 waves, `v_mfma_f32_16x16x16_bf16`. "
                "How many MFMAs does each wave issue per K step?",
                answer, lambda: [html_table([mfma_per_step()], caption="GEMM v4, gfx942 compile")],
                claims, FAMILY)


def cards() -> list[Card]:
    return [_registers_card(), _element_card(), _per_step_card()]
