"""Interview family: tuning stories told by the compiler (pruned spaces, pipeline depth, v3 to v4).

What the ahead-of-time compile and the roofline model show is stated as such; a speed-up
is only a measurement on a GPU, and the cards say how many recorded results ship.
"""
from __future__ import annotations

import torch

from ...harness import results
from ..flashcards import Card, one_of
from ...isa.occupancy import LDS_BYTES_PER_CU
from ...harness.table import html_table
from .evidence import REASONS, dropped_configs, gemm_roof_row, gemm_v4_config, mfma_size, tuning_rows, v3_v4, v4_lds_by_stages

FAMILY = "Tuning stories"


def _tuning_card(op: str, public: str) -> Card:
    def gfx942():
        return next(r for r in tuning_rows(op) if r["target"] == "gfx942")

    def answer():
        row = gfx942()
        top = max(REASONS, key=lambda reason: row[reason])
        return (f"`kernels.{public}` times only configs its shipped table keeps. On gfx942 "
                f"{row['dropped']} of {row['kept'] + row['dropped']} candidates were dropped "
                f"before any timing, most because the config {top} ({row[top]}; a config "
                "may fail for several reasons), found by "
                "compiling every candidate ahead of time with the ISA inspector "
                "(`python -m workbench.isa.tune_space`). A config that spills keeps registers in "
                "scratch memory: it is never worth timing."
                "\n\n"
                "The other targets drop other configs (table): each has its own registers, "
                "LDS (shared memory) and instruction shapes, so each has its own table.")

    def evidence():
        dropped = dropped_configs(op)
        return [html_table(tuning_rows(op), caption=f"{op}: tuned_space.json (compiled, not timed)"),
                html_table(dropped[:4], caption=f"{op}: first configs dropped on gfx942")]

    def claims():
        row = gfx942()
        top = max(REASONS, key=lambda reason: row[reason])
        return {reason: reason == top for reason in REASONS}

    return Card(f"Tuning story: {op}",
                f"Before timing anything, the {op} tuning space for gfx942 was pruned. What "
                "removed most of the configs that were dropped?",
                answer, evidence, claims, FAMILY)


def _stages_card() -> Card:
    def kib():
        return tuple(row["LDS bytes"] // 1024 for row in v4_lds_by_stages())

    def answer():
        rows = {row["num_stages"]: row for row in v4_lds_by_stages()}
        one, two, three = (rows[s]["LDS bytes"] for s in (1, 2, 3))
        cfg = gemm_v4_config()
        a_tile, b_tile = (cfg[f"BLOCK_{x}"] * cfg["BLOCK_K"] * torch.bfloat16.itemsize // 1024 for x in "MN")
        return (f"{one} / {two} / {three} bytes. One A tile ({cfg['BLOCK_M']}x{cfg['BLOCK_K']} bf16, {a_tile} KiB) "
                f"plus one B tile ({b_tile} KiB) is {a_tile + b_tile} KiB: at num_stages 2 v4 holds "
                f"{rows[2]['A+B tile pairs']:g} such pair. "
                "The AMD stream pipeliner's two stages prefetch the next K step's tiles into "
                "registers (global loads issued before this step's MFMAs, written to LDS after "
                f"them); a second LDS buffer appears only at 3 ({rows[3]['A+B tile pairs']:g} pairs), "
                f"and then one workgroup fills the CU's {LDS_BYTES_PER_CU['gfx942'] // 1024} KiB: "
                f"{rows[3]['occupancy']}. At 1 the "
                f"compile takes {rows[1]['A+B tile pairs']:g} of a pair; the ISA shows the number, not "
                "the allocator's reason. \"Two stages = double-buffered LDS\" is the CUDA "
                "(cp.async) picture; on gfx942 the registers are the second buffer.")

    def claims():
        return one_of(kib(), ((16, 32, 64), (32, 64, 96), (32, 32, 64)), "{0[0]} / {0[1]} / {0[2]} KiB")

    return Card("Tuning story: the LDS of a deeper pipeline",
                "GEMM v4 on gfx942 (128x128x64 bf16 tiles, 8 waves): how much LDS does a workgroup "
                "take at num_stages 1, 2 and 3?",
                answer, lambda: [html_table(v4_lds_by_stages(), caption="GEMM v4, gfx942 compiles")],
                claims, FAMILY)


def vector_compares(report) -> int:
    return sum("v_cmp" in line for line in report.hot_loop.splitlines())


def v3_v4_rows() -> list[dict]:
    return [{"rung": r.rung, "num_stages": r.options["num_stages"], "LDS bytes": r.lds_bytes,
             "matrix instructions": ", ".join(r.matrix_instructions), "VGPRs": r.vgprs,
             "occupancy": str(r.occupancy), "v_cmp in the hot loop": vector_compares(r)} for r in v3_v4()]


def _v4_card() -> Card:
    shape_name = "square 4096"

    def answer():
        v3, v4 = v3_v4()
        roof = gemm_roof_row(shape_name)
        recorded = results.recorded()
        return (f"What the ISA shows: v4 issues the next K step's global loads before this step's "
                f"MFMAs (num_stages {v4.options['num_stages']} against {v3.options['num_stages']}), "
                f"its hot loop has {vector_compares(v4)} vector compares against v3's "
                f"{vector_compares(v3)} (the ragged K step is peeled), and it runs "
                f"{', '.join(v4.matrix_instructions)} where v3 runs {', '.join(v3.matrix_instructions)}. "
                f"It does not hold two LDS buffers ({v4.lds_bytes} bytes: one A+B pair) and it keeps "
                f"fewer waves per SIMD ({v4.occupancy.value} against {v3.occupancy.value})."
                "\n\n"
                f"What the model shows: a {shape_name} bf16 GEMM does {roof['FLOP/byte']} FLOP per byte, "
                f"right of MI300X's ridge at {roof['MI300X bf16 ridge']}: {roof['bound (model)']}-bound, "
                "so latency hiding can matter only if v3's matrix cores wait on its loads."
                "\n\n"
                "What only a GPU settles: whether they do, and how much v4 gains, since it gives up "
                "occupancy for the prefetch. "
                f"{len(recorded)} recorded GPU result files ship with this copy"
                + (": see workbench/recorded/." if recorded else ", so nobody here has measured it."))

    def claims():
        v3, v4 = v3_v4()
        return {"Loads a step ahead, no K test in the loop; only a timed GPU run settles the gain":
                    vector_compares(v4) < vector_compares(v3) and v4.options["num_stages"] > v3.options["num_stages"],
                "v4 double-buffers LDS": v4_lds_by_stages()[1]["A+B tile pairs"] >= 2,
                "v4 keeps more waves per SIMD to hide latency": v4.occupancy.value > v3.occupancy.value,
                "v4 uses a larger MFMA instruction": mfma_size(v4) > mfma_size(v3)}

    return Card("Tuning story: GEMM v3 to v4, what the ISA shows",
                "GEMM v4 is v3 plus software pipelining on MI300X. What does the gfx942 compile show "
                "changed, and what can it not tell you?",
                answer, lambda: [html_table(v3_v4_rows(), caption="gfx942 compiles"),
                                 html_table([gemm_roof_row(shape_name)], caption="roofline (model)")],
                claims, FAMILY)


def cards() -> list[Card]:
    return [_tuning_card("gemm", "matmul"), _stages_card(), _v4_card()]
