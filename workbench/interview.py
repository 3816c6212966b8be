"""Interview questions for AMD kernel and training engineers, answered by the workbench.

Each card's answer and evidence are computed when revealed: ISA facts from ahead-of-time
compiles (:mod:`workbench.isa`), hardware facts from the roofline specs, FP8 facts from
``torch.finfo`` and casts, collective times from the alpha-beta model (labelled model),
tuning stories from the shipped ``tuned_space.json`` tables. Performance numbers are
model numbers: ``workbench/recorded/`` holds the measured rows when there are some, and
the cards say how many there are.
"""
from __future__ import annotations

import kernels
import roofline
from kernels.comm.cost_model import ALGORITHMS

from . import isa, results
from .flashcards import Card, Deck
from .interview_evidence import (BANK_BYTES, BUCKET_BYTES, GPUS, REASONS, all_reduce_rows,
                                 dropped_configs, fp8_rows, gemm_roof_row, instruction_shape, lanes,
                                 lds_rows, matrix_instructions, mfma_size, operand_tiles_bytes,
                                 register_prefetch, ridges, tuning_rows, v3_v4)
from .table import html_table


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
        wave = lanes("gfx942")["lanes per wave"]
        return {f"{n} lanes": n == wave for n in (16, 32, 64)}

    return Card("CUDA to HIP: warp and wavefront",
                "A CUDA kernel full of `__shfl_xor_sync` and `__ballot_sync` moves to MI300X. "
                "How many lanes execute together there, and what breaks?",
                answer, evidence, claims)


def _lds_card() -> Card:
    def answer():
        mi300x, h200 = (next(r for r in lds_rows() if r["target"] == t) for t in ("gfx942", "sm_90"))
        v4 = isa.inspect("gemm", "v4", "gfx942")
        per_cu = int(mi300x["LDS KiB per CU (SM)"]) * 1024
        return (f"MI300X has {mi300x['LDS KiB per CU (SM)']:g} KiB of LDS per CU, "
                f"{mi300x['banks']} banks of {BANK_BYTES} bytes ({mi300x['LDS B/clk/CU']} B per "
                "clock per CU, the rate the spec's LDS roof is built from). An H200 SM has up "
                f"to {h200['LDS KiB per CU (SM)']:g} KiB of shared memory, so a CUDA tile "
                "config sized for it may not fit."
                "\n\n"
                f"GEMM v4 takes {v4.lds_bytes} bytes of LDS per workgroup on gfx942 (two "
                f"pipeline buffers), so at most {per_cu // v4.lds_bytes} of its workgroups "
                "fit in one CU's LDS. Bank conflicts: lanes that hit the same bank in one "
                "access serialise, as on NVIDIA; the padding or swizzle that avoids them "
                "assumes the bank count, so check it when porting.")

    def evidence():
        v4 = isa.inspect("gemm", "v4", "gfx942")
        return [html_table(lds_rows(), caption="roofline specs; banks = LDS bytes per clock / "
                                               f"{BANK_BYTES} B per bank (model)"),
                html_table([{"rung": v4.rung, "target": v4.target, "LDS bytes": v4.lds_bytes,
                             "occupancy": str(v4.occupancy)}], caption="GEMM v4 compiled for gfx942")]

    def claims():
        kib = roofline.spec("MI300X").lds_kib_per_cu
        known = sorted({roofline.spec(name).lds_kib_per_cu for name in roofline.gpus()} - {None})
        return {f"{n:g} KiB": n == kib for n in known}

    return Card("CUDA to HIP: LDS size and banks",
                "How much LDS does one MI300X CU have, and how many banks?",
                answer, evidence, claims)


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
                answer, evidence, claims)


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
                claims)


def _v4_card() -> Card:
    shape_name = "square 4096"

    def roof_row():
        return gemm_roof_row(shape_name)

    def answer():
        v3, v4 = v3_v4()
        roof = roof_row()
        recorded = results.recorded()
        return (f"Roofline: a {shape_name} bf16 GEMM does {roof['FLOP/byte']} FLOP per byte, "
                f"right of MI300X's ridge at {roof['MI300X bf16 ridge']}: it is "
                f"{roof['bound (model)']}-bound (model), so what counts is how busy the matrix "
                "cores stay, not how many bytes move."
                "\n\n"
                f"ISA (gfx942, compiled here): v3 (num_stages {v3.options['num_stages']}) loads a "
                "K step, writes it to LDS, waits, then runs its MFMAs; A and B take turns in one "
                f"{v3.lds_bytes}-byte LDS allocation. v4 (num_stages {v4.options['num_stages']}) "
                "issues the global loads of step k+1 before the MFMAs of step k; they wait in "
                f"registers ({v4.vgprs} VGPRs against {v3.vgprs}) and are written, after a barrier, "
                f"over the one LDS tile per operand ({v4.lds_bytes} bytes): no second LDS buffer, "
                "which only num_stages 3 adds. Its loop also has no K compare (the ragged step is "
                f"peeled). It has fewer waves per SIMD ({v4.occupancy.value} against "
                f"{v3.occupancy.value}: waves_per_eu=2 is a ceiling) and smaller MFMAs "
                f"({', '.join(v4.matrix_instructions)} against {', '.join(v3.matrix_instructions)})."
                "\n\n"
                "Whether v4 is faster at all is for a GPU to settle: the ISA shows the load "
                "latency overlapped within a wave, v3 hides it with twice the waves instead, "
                "and neither the roofline model nor the compiler says which wins. "
                f"Measured: {len(recorded)} recorded GPU result files ship with this copy"
                + (", see workbench/recorded/." if recorded else
                   ", so this card shows the mechanism and no measured speed-up."))

    def evidence():
        v3, v4 = v3_v4()
        keep = ("matrix instructions", "LDS bytes", "num_stages", "VGPRs", "VGPR spills", "SGPR spills",
                "occupancy", "LDS reads", "LDS writes", "global loads")
        return [html_table([row for row in isa.compare(v3, v4) if row["metric"] in keep],
                           caption="gfx942 ISA, v3 against v4"),
                html_table([roof_row()], caption="roofline (model)")]

    def claims():
        v3, v4 = v3_v4()
        return {"v4 keeps more waves per SIMD to hide latency": v4.occupancy.value > v3.occupancy.value,
                "v4 uses a larger MFMA instruction": mfma_size(v4) > mfma_size(v3),
                "v4 double-buffers LDS: it loads step k+1 into a second LDS tile":
                    v4.lds_bytes >= 2 * operand_tiles_bytes(),
                "v4 prefetches step k+1 into registers; only a GPU can say if that beats v3":
                    register_prefetch(v4) and not register_prefetch(v3)}

    return Card("GEMM: what v4 changes over v3 on MI300X",
                "GEMM v4 is v3 plus one idea. What do its gfx942 ISA and the roofline model show, "
                "and what can only a GPU settle?",
                answer, evidence, claims)


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
                answer, evidence, claims)


def _comm_card() -> Card:
    def answer():
        rows = all_reduce_rows()
        best = min(rows[:-1], key=lambda r: r["ms"])
        one_link = rows[-1]
        peak = roofline.spec("MI300X").peak("bf16") * 1e12
        params = BUCKET_BYTES / 2   # bf16 gradients
        tokens = best["ms"] * 1e-3 * peak / (4 * params)   # backward: 4 FLOP per parameter per token
        ladders = ", ".join(kernels.ops())
        return (f"Alpha-beta model, bandwidth-bound (latency not modelled): a 1 GiB all-reduce "
                f"on 8 MI300X is fastest as a {best['algorithm']} ({best['ms']:.2f} ms, model) "
                f"when it uses all {best['links used']} Infinity Fabric links. A single ring "
                f"reaches one link per direction: {one_link['ms']:.1f} ms (model). A trace "
                "with a long all-reduce and idle links points at the channel count, not the "
                "fabric."
                "\n\n"
                f"Overlap: the backward of those {params:.3g} bf16 parameters costs 4 FLOP "
                f"per parameter per token, so at MI300X's bf16 peak it takes {tokens:.0f} "
                "tokens per GPU before the compute is as long as the all-reduce it should hide "
                "(model); with fewer tokens the step waits for the network even with perfect "
                "overlap. The workbench has no distributed-training ladder yet (ladders: "
                f"{ladders}), so this is model arithmetic, not a profile.")

    def evidence():
        return [html_table(all_reduce_rows() + all_reduce_rows("H200"),
                           caption="all_reduce of 1 GiB on 8 GPUs (model: alpha-beta, datasheet fabrics)")]

    def claims():
        rows = all_reduce_rows()[:-1]
        best = min(rows, key=lambda r: r["ms"])["algorithm"]
        return {alg: alg == best for alg in ALGORITHMS["all_reduce"]}

    return Card("Distributed: all-reduce and overlap",
                "8 MI300X, a 1 GiB gradient all-reduce per step: which algorithm does the "
                "alpha-beta model favour, and when can the backward hide it?",
                answer, evidence, claims)


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
                "(`python -m workbench.tune_space`). A config that spills keeps registers in "
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
                answer, evidence, claims)


def deck() -> Deck:
    """The interview deck, in the order the issue lists its topics."""
    return Deck("Interview prep: AMD kernel and training engineering",
                (_wave_card(), _lds_card(), _matrix_card(), _ridge_card(), _v4_card(), _fp8_card(),
                 _comm_card(), _tuning_card("gemm", "matmul"), _tuning_card("attention", "flash_attention")))
