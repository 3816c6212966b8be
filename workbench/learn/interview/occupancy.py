"""Interview family: occupancy arithmetic on CDNA3 (waves per SIMD from VGPRs, LDS, workgroups).

Every answer runs :mod:`workbench.isa.occupancy`, the rules LLVM's AMDGPU backend applies
(its docstring cites them), and where a compiled kernel is the example, its report.
"""
from __future__ import annotations

from ... import isa
from ...isa import occupancy as occ
from ..flashcards import Card, one_of
from ...harness.table import html_table
from .evidence import v4_lds_by_stages

FAMILY = "Occupancy arithmetic"
ARCH_VGPRS, AGPRS = 128, 64


def _vgpr_card() -> Card:
    def answer():
        total = occ.unified_vgprs(ARCH_VGPRS, AGPRS)
        return (f"{occ.waves_per_simd_from_vgprs(ARCH_VGPRS, AGPRS)}. On CDNA3 arch VGPRs and AGPRs "
                f"share one file of {occ.CDNA_VGPRS_PER_LANE} registers per lane: {ARCH_VGPRS} + {AGPRS} "
                f"= {total} (AGPRs start at a 4-aligned offset), rounded up to the granule of "
                f"{occ.CDNA_VGPR_GRANULE}, and {occ.CDNA_VGPRS_PER_LANE} // {total} = "
                f"{occ.CDNA_VGPRS_PER_LANE // total} waves fit, at most {occ.CDNA_MAX_WAVES_PER_SIMD}. "
                f"Counting the {ARCH_VGPRS} arch VGPRs alone would say "
                f"{occ.waves_per_simd_from_vgprs(ARCH_VGPRS)}: the AGPRs count too.")

    def claims():
        return one_of(occ.waves_per_simd_from_vgprs(ARCH_VGPRS, AGPRS), (1, 2, 3, 4), "{} waves per SIMD")

    return Card("Occupancy: VGPRs and AGPRs",
                f"A gfx942 kernel uses {ARCH_VGPRS} arch VGPRs and {AGPRS} AGPRs per lane, little LDS. "
                "How many of its waves fit on one SIMD?",
                answer, lambda: [], claims, FAMILY)


def _lds_card() -> Card:
    def stage3():
        return next(row for row in v4_lds_by_stages() if row["num_stages"] == 3)

    def answer():
        row = stage3()
        waves = occ.waves_per_simd_from_lds(row["LDS bytes"], 8, "gfx942")
        return (f"{waves}: a CU has {occ.LDS_BYTES_PER_CU['gfx942'] // 1024} KiB of LDS, so one "
                f"{row['LDS bytes'] // 1024} KiB workgroup fits; its 8 waves spread over "
                f"{occ.SIMDS_PER_CU} SIMDs are {waves} per SIMD. The compile agrees: GEMM v4 at "
                f"num_stages 3 reports {row['occupancy']}. One more pipeline stage cost the CU "
                "its second workgroup: the trade a `num_stages` sweep makes on MI300X.")

    def claims():
        return one_of(occ.waves_per_simd_from_lds(stage3()["LDS bytes"], 8, "gfx942"), (1, 2, 4, 8),
                      "{} waves per SIMD")

    return Card("Occupancy: LDS per workgroup",
                "GEMM v4 at num_stages 3 needs 64 KiB of LDS per workgroup of 8 waves on gfx942. "
                "How many waves per SIMD does LDS allow?",
                answer, lambda: [html_table(v4_lds_by_stages(), caption="GEMM v4, gfx942 compiles")],
                claims, FAMILY)


def _workgroup_card() -> Card:
    def answer():
        return (f"{occ.whole_workgroups(3, 8)}. Registers allow 3 waves on each of the "
                f"{occ.SIMDS_PER_CU} SIMDs, 12 per CU, but a workgroup's 8 waves are resident "
                f"together: one workgroup (8 waves) fits, a second (16) does not, so "
                f"{occ.whole_workgroups(3, 8)} waves per SIMD. With 4-wave workgroups the same "
                f"registers give {occ.whole_workgroups(3, 4)}: smaller workgroups waste less.")

    def claims():
        return one_of(occ.whole_workgroups(3, 8), (1, 2, 3, 4), "{} waves per SIMD")

    return Card("Occupancy: whole workgroups",
                "Registers allow 3 waves per SIMD; the kernel launches workgroups of 8 waves "
                "(num_warps=8). How many waves per SIMD are resident?",
                answer, lambda: [], claims, FAMILY)


RESOURCES = ("VGPRs", "LDS", "SGPRs")


def dkdv():
    return next(r for r in isa.inspect_all("attention", "v5", "gfx942") if "dkdv" in r.kernel_name)


def _backward_card() -> Card:
    def answer():
        report = dkdv()
        limits = report.occupancy.limits
        return (f"VGPRs: the dK/dV kernel holds {report.vgprs} arch VGPRs and {report.agprs} AGPRs, "
                f"{occ.unified_vgprs(report.vgprs, report.agprs)} of {occ.CDNA_VGPRS_PER_LANE} per "
                f"lane, so {limits['VGPRs']} wave per SIMD; LDS would allow {limits['LDS']} and SGPRs "
                f"{limits['SGPRs']}. (Its `waves_per_eu` option is {report.options.get('waves_per_eu')}, "
                "which asks for the same.) The dK and dV accumulators of a key block live in "
                "registers for the whole loop over query blocks: that is the design, and one wave "
                "per SIMD means no other wave hides its memory latency, which is what the "
                "software pipeline and the tile shape must do instead.")

    def claims():
        report = dkdv()
        return {name: report.occupancy.limits[name] == report.occupancy.value for name in RESOURCES}

    return Card("Occupancy: the attention backward",
                "Attention v5's dK/dV kernel on gfx942 runs 1 wave per SIMD. Which resource limits it?",
                answer, lambda: [html_table([dkdv().summary()], caption="attention v5 dK/dV, gfx942")],
                claims, FAMILY)


def cards() -> list[Card]:
    return [_vgpr_card(), _lds_card(), _workgroup_card(), _backward_card()]
