"""Occupancy from a kernel's resources: waves per SIMD on CDNA, blocks per SM on Hopper.

CDNA3/CDNA4 (gfx942, gfx950) rules, as LLVM's AMDGPU backend applies them
(llvm/lib/Target/AMDGPU/Utils/AMDGPUBaseInfo.cpp, functions named below):

* one register file of 512 VGPRs per SIMD lane, shared by arch VGPRs and AGPRs
  (``getTotalNumVGPRs``: 512 with FeatureGFX90AInsts, which gfx942/gfx950 have);
* allocated in granules of 8 (``getVGPRAllocGranule``: 8 with FeatureGFX90AInsts);
* at most 8 waves per SIMD (``getMaxWavesPerEU``: 8 for the gfx90a family);
* waves = min(512 // roundup(total, 8), 8) (``getNumWavesPerEUWithNumVGPRs``);
* AGPRs start at an offset aligned to 4: total = alignTo(arch VGPRs, 4) + AGPRs when
  AGPRs are used (llvm/test/CodeGen/AMDGPU/agpr-register-count.ll: 9 VGPRs + 32 AGPRs
  -> TotalNumVgprs 44, Occupancy 8);
* SGPRs on GFX9: <= 80 -> 10, <= 88 -> 9, <= 100 -> 8, else 7 waves
  (``getOccupancyWithNumSGPRs``), capped at 8.

The compiler's ``; Occupancy:`` comment applies these register limits and the
``waves_per_eu`` option (Triton passes it as a cap: checked on gfx942, v4 with 166
VGPRs says 3 without it and 2 with waves_per_eu=2), unless the request is below the
waves per SIMD one workgroup implies (``getWavesPerEU``: a request under
ceil(num_warps / 4) falls back to the default, so waves_per_eu=1 with 8 warps caps
nothing). Two things it leaves out we add:

* LDS: Triton allocates it dynamically, so LLVM sees 0 bytes. A CU has 4 SIMDs and
  64 KiB LDS (gfx942) or 160 KiB (gfx950; reference/gpu-specs.yaml). The LDS
  allocation granule is not modelled.
* whole workgroups: a workgroup's ``num_warps`` waves are resident together, spread
  over the 4 SIMDs, so 8 waves per workgroup and room for 3 per SIMD leaves 2.

Hopper (sm90), per the CUDA occupancy calculator: 64K 32-bit registers per SM,
allocated per warp in units of 256 with a warp granularity of 4; 228 KiB shared
memory per SM, 1 KiB of it reserved per block; at most 64 warps and 32 blocks per SM.
"""
from __future__ import annotations

from dataclasses import dataclass, field

SIMDS_PER_CU = 4
CDNA_MAX_WAVES_PER_SIMD = 8
CDNA_VGPRS_PER_LANE = 512
CDNA_VGPR_GRANULE = 8
LDS_BYTES_PER_CU = {"gfx942": 64 * 1024, "gfx950": 160 * 1024}

HOPPER_REGISTERS_PER_SM = 64 * 1024
HOPPER_REGISTER_UNIT = 256          # registers per warp are rounded up to this
HOPPER_WARP_GRANULE = 4
HOPPER_SHARED_BYTES_PER_SM = 228 * 1024
HOPPER_SHARED_RESERVED_PER_BLOCK = 1024
HOPPER_MAX_WARPS_PER_SM = 64
HOPPER_MAX_BLOCKS_PER_SM = 32


@dataclass(frozen=True)
class Occupancy:
    """Derived occupancy, what limits it, and the compiler's own figure where it gives one."""

    value: int
    unit: str                          # "waves/SIMD" or "blocks/SM"
    limited_by: str                    # the resource with the smallest limit
    limits: dict[str, int] = field(default_factory=dict)
    compiler: int | None = None        # LLVM's "; Occupancy:" (see module doc for what it omits)

    @property
    def agrees_with_compiler(self) -> bool | None:
        """Whether the limits the compiler also applies give its figure (None: it gives none)."""
        if self.compiler is None:
            return None
        return min(v for k, v in self.limits.items() if k != "LDS") == self.compiler

    def __str__(self) -> str:
        text = f"{self.value} {self.unit} (limited by {self.limited_by})"
        return text if self.compiler is None else f"{text}; compiler says {self.compiler}"


def unified_vgprs(arch_vgprs: int, agprs: int) -> int:
    """VGPRs a wave allocates on CDNA3/4: AGPRs follow the arch VGPRs at a 4-aligned offset."""
    return arch_vgprs if agprs == 0 else -(-arch_vgprs // 4) * 4 + agprs


def waves_per_simd_from_vgprs(arch_vgprs: int, agprs: int = 0) -> int:
    total = unified_vgprs(arch_vgprs, agprs)
    if total < CDNA_VGPR_GRANULE:
        return CDNA_MAX_WAVES_PER_SIMD
    rounded = -(-total // CDNA_VGPR_GRANULE) * CDNA_VGPR_GRANULE
    return min(max(CDNA_VGPRS_PER_LANE // rounded, 1), CDNA_MAX_WAVES_PER_SIMD)


def waves_per_simd_from_sgprs(sgprs: int) -> int:
    for bound, waves in ((80, 10), (88, 9), (100, 8)):
        if sgprs <= bound:
            return min(waves, CDNA_MAX_WAVES_PER_SIMD)
    return 7


def waves_per_simd_from_lds(lds_bytes: int, num_warps: int, arch: str) -> int:
    if lds_bytes == 0:
        return CDNA_MAX_WAVES_PER_SIMD
    workgroups = LDS_BYTES_PER_CU[arch] // lds_bytes
    return min(workgroups * num_warps // SIMDS_PER_CU, CDNA_MAX_WAVES_PER_SIMD)


def _smallest(limits: dict[str, int], unit: str, compiler: int | None = None) -> Occupancy:
    name = min(limits, key=limits.get)  # first wins a tie: dicts keep insertion order
    return Occupancy(limits[name], unit, name, dict(limits), compiler)


def whole_workgroups(waves_per_simd: int, num_warps: int) -> int:
    """Waves per SIMD left when only whole workgroups (at least one) can be resident."""
    workgroups = max(waves_per_simd * SIMDS_PER_CU // num_warps, 1)
    return workgroups * num_warps // SIMDS_PER_CU


def cdna(arch: str, arch_vgprs: int, agprs: int, sgprs: int, lds_bytes: int, num_warps: int,
         waves_per_eu: int = 0, compiler: int | None = None) -> Occupancy:
    limits = {"VGPRs": waves_per_simd_from_vgprs(arch_vgprs, agprs),
              "LDS": waves_per_simd_from_lds(lds_bytes, num_warps, arch),
              "SGPRs": waves_per_simd_from_sgprs(sgprs),
              "max": CDNA_MAX_WAVES_PER_SIMD}
    if waves_per_eu >= -(-num_warps // SIMDS_PER_CU):
        limits["waves_per_eu option"] = waves_per_eu   # below that LLVM drops the request
    found = _smallest(limits, "waves/SIMD", compiler)
    resident = whole_workgroups(found.value, num_warps)
    if resident < found.value:
        return Occupancy(resident, found.unit, f"{found.limited_by}, whole workgroups of "
                         f"{num_warps} waves", found.limits, compiler)
    return found


def hopper(registers: int, shared_bytes: int, num_warps: int) -> Occupancy:
    per_warp = -(-registers * 32 // HOPPER_REGISTER_UNIT) * HOPPER_REGISTER_UNIT
    warps = HOPPER_REGISTERS_PER_SM // per_warp if per_warp else HOPPER_MAX_WARPS_PER_SM
    warps -= warps % HOPPER_WARP_GRANULE
    per_block = shared_bytes + HOPPER_SHARED_RESERVED_PER_BLOCK
    limits = {"registers": warps // num_warps,
              "shared memory": HOPPER_SHARED_BYTES_PER_SM // per_block,
              "warps": HOPPER_MAX_WARPS_PER_SM // num_warps,
              "max": HOPPER_MAX_BLOCKS_PER_SM}
    return _smallest(limits, "blocks/SM")
