"""Interview family: porting a CUDA kernel to HIP on MI300X.

What changes under a port that compiles cleanly: the wave width, the LDS size and banks,
the matrix instruction, and the chiplet layout (XCDs with private L2s). Every answer
reads a compile or a spec.
"""
from __future__ import annotations

import roofline
from kernels.gemm.v3_grouped_order import xcd_remap

from ..flashcards import Card, one_of
from ...harness.table import html_table
from .evidence import BANK_BYTES, instruction_shape, lanes, lds_rows, matrix_instructions, v4_lds_by_stages

FAMILY = "Porting CUDA to HIP"


def _wave_card() -> Card:
    def answer():
        amd, nv = lanes("gfx942"), lanes("sm90")
        return (f"A wavefront on MI300X has {amd['lanes per wave']} lanes; a CUDA warp has "
                f"{nv['lanes per wave']}. The compile shows it: gfx942's kernel metadata says "
                f"`.wavefront_size: {amd['lanes per wave']}` and its compares write each lane "
                f"mask to a 64-bit SGPR pair ({amd['lane-mask instructions']}; one bit per lane). "
                "sm90's softmax "
                f"shuffles lanes with `{nv['first of them']}`: a butterfly inside a "
                f"{nv['lanes per wave']}-lane warp."
                "\n\n"
                f"The same reduction exchanges lanes with {amd['cross-lane instructions']} on "
                f"gfx942 and {nv['cross-lane instructions']} on sm90. Porting: every constant "
                "32 is suspect: 32-bit ballot or lane masks, butterflies that stop at offset "
                "16, per-warp arrays of 32. Use `warpSize` and 64-bit masks.")

    def evidence():
        return [html_table([lanes("gfx942"), lanes("sm90")],
                           caption="attention v4 (softmax row reductions), compiled ahead of time")]

    def claims():
        return one_of(lanes("gfx942")["lanes per wave"], (16, 32, 64), "{} lanes")

    return Card("CUDA to HIP: warp and wavefront",
                "A CUDA kernel full of `__shfl_xor_sync` and `__ballot_sync` moves to MI300X. "
                "How many lanes execute together there, and what breaks?",
                answer, evidence, claims, FAMILY)


def _lds_card() -> Card:
    def answer():
        mi300x, h200 = (next(r for r in lds_rows() if r["target"] == t) for t in ("gfx942", "sm_90"))
        v4 = next(row for row in v4_lds_by_stages() if row["num_stages"] == 2)
        per_cu = int(mi300x["LDS KiB per CU (SM)"]) * 1024
        return (f"MI300X has {mi300x['LDS KiB per CU (SM)']:g} KiB of LDS per CU, "
                f"{mi300x['banks']} banks of {BANK_BYTES} bytes ({mi300x['LDS B/clk/CU']} B per "
                "clock per CU, the rate the spec's LDS roof is built from). An H200 SM has up "
                f"to {h200['LDS KiB per CU (SM)']:g} KiB of shared memory, so a CUDA tile "
                "config sized for it may not fit."
                "\n\n"
                f"GEMM v4 takes {v4['LDS bytes']} bytes of LDS per workgroup on gfx942 "
                f"({v4['A+B tile pairs']:g} A+B tile pair at num_stages 2), so at most "
                f"{per_cu // v4['LDS bytes']} of its workgroups fit in one CU's LDS. Bank "
                "conflicts: lanes that hit the same bank in one access serialise, as on NVIDIA; "
                "the padding or swizzle that avoids them assumes the bank count, so check it "
                "when porting.")

    def evidence():
        return [html_table(lds_rows(), caption="roofline specs; banks = LDS bytes per clock / "
                                               f"{BANK_BYTES} B per bank (model)"),
                html_table(v4_lds_by_stages(), caption="GEMM v4 compiled for gfx942")]

    def claims():
        kib = roofline.spec("MI300X").lds_kib_per_cu
        known = sorted({roofline.spec(name).lds_kib_per_cu for name in roofline.gpus()} - {None})
        return {f"{n:g} KiB": n == kib for n in known}

    return Card("CUDA to HIP: LDS size and banks",
                "How much LDS does one MI300X CU have, and how many banks?",
                answer, evidence, claims, FAMILY)


def _matrix_card() -> Card:
    def by_target():
        return {row["target"]: row for row in matrix_instructions()}

    def answer():
        rows = by_target()
        return (f"On gfx942 GEMM v4 runs `{rows['gfx942']['matrix instructions']}`: MFMA, the "
                "matrix-core instruction of CDNA (Instinct), one wave of "
                f"{rows['gfx942']['lanes per wave']} lanes. gfx950 (MI355X) runs "
                f"`{rows['gfx950']['matrix instructions']}`: K "
                f"{instruction_shape(rows['gfx950']['matrix instructions'])[2]} per instruction against "
                f"{instruction_shape(rows['gfx942']['matrix instructions'])[2]}. WMMA is the Radeon "
                f"(RDNA3, gfx1100) instruction: `{rows['gfx1100']['matrix instructions']}` in "
                f"waves of {rows['gfx1100']['lanes per wave']}. Hopper's counterpart is "
                f"`{rows['sm90']['matrix instructions']}`."
                "\n\n"
                "So a CUDA `wmma`/`mma` tile layout does not carry over: MFMA operand "
                f"layouts are per {rows['gfx942']['lanes per wave']}-lane wave, and the "
                "instruction shape (16x16 or 32x32) is a tuning knob (`matrix_instr_nonkdim` "
                "in Triton).")

    def evidence():
        return [html_table(matrix_instructions(), caption="GEMM v4 (bf16) compiled for each target")]

    def claims():
        rows = by_target()
        return {rows[t]["matrix instructions"]: t == "gfx942" for t in ("gfx942", "gfx950", "gfx1100", "sm90")}

    return Card("CUDA to HIP: MFMA and WMMA",
                "Which matrix instruction does the GEMM's pipelined rung (v4) use on gfx942?",
                answer, evidence, claims, FAMILY)


def xcd_rows(tiles: int = 64) -> list[dict]:
    """Where the first 8 tiles of a grouped GEMM order run on MI300X, without and with
    v3's remap: the XCD that runs each, hence the L2 that caches what they share."""
    xcds = roofline.spec("MI300X").xcds
    placed = {xcd_remap(pid, tiles, xcds): pid % xcds for pid in range(tiles)}
    return [{"tile": t, "XCD, ids dealt round robin": t % xcds, "XCD after v3's remap": placed[t]}
            for t in range(8)]


def _xcd_card() -> Card:
    def spread():
        rows = xcd_rows()
        return (len({r["XCD, ids dealt round robin"] for r in rows}),
                len({r["XCD after v3's remap"] for r in rows}))

    def answer():
        gpu = roofline.spec("MI300X")
        plain, remapped = spread()
        return (f"MI300X is {gpu.xcds} XCDs of {gpu.compute_units // gpu.xcds} CUs, each XCD with its "
                f"own {gpu.l2_mib / gpu.xcds:g} MiB L2, and the command processor deals consecutive "
                "workgroup ids to the XCDs round robin. Eight neighbouring tiles of a grouped order, "
                f"which share rows of A, land on {plain} XCDs: the shared rows are fetched into "
                f"{plain} L2s. On NVIDIA GPUs every SM reaches the one L2, so a CUDA kernel never needed to care."
                "\n\n"
                "GEMM v3 remaps the id (`xcd_remap`: XCD x gets a contiguous run of tiles), and "
                f"the same eight tiles then run on {remapped} XCD: the sharing stays inside one L2. "
                "The remap needs the XCD count the process sees (8 on MI300X; 1 in CPX partition "
                "mode), `kernels.xcd.num_xcds`.")

    def claims():
        plain, _ = spread()
        return {f"{n} L2{'s' if n > 1 else ''}": n == plain for n in (1, 2, 4, 8)}

    return Card("CUDA to HIP: XCDs and the L2",
                "A GEMM walks its tiles in grouped order, so tiles 0-7 share rows of A. Launched "
                "on MI300X without a remap, into how many L2 caches are those rows fetched?",
                answer, lambda: [html_table(xcd_rows(), caption="kernels.gemm.v3_grouped_order.xcd_remap, 64 tiles, "
                                                                "MI300X spec")],
                claims, FAMILY)


def cards() -> list[Card]:
    return [_wave_card(), _lds_card(), _matrix_card(), _xcd_card()]
