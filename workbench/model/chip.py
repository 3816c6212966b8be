"""One GPU as the model sees it: its spec (``roofline``) at the clock it runs under an MFMA load.

Shared by every op's prediction: :func:`chip` gives the numbers the combination rule
needs, :func:`spec_inputs` lists the spec fields behind them with their sources,
:func:`weigh` reads a compiled loop in its target's dialect (AMDGCN: :mod:`.loop`; PTX:
:mod:`.ptx_loop`) and :func:`programs_per_cu` turns a compile's occupancy into programs.
On an NVIDIA target an SM stands for a CU and its four sub-partitions for the four SIMDs.
"""
from __future__ import annotations

from ..isa.occupancy import SIMDS_PER_CU
from . import combine, loop, machine, ptx_loop


def weigh(loop_text: str, target: str, wave_size: int) -> loop.LoopMix:
    """A compiled loop's mix per wave (warp) and iteration, on ``target`` (a spec's target)."""
    return (ptx_loop if machine.nvidia(target) else loop).mix(loop_text, target, wave_size)


RESIDENT_RULE = "occupancy x 4 SIMDs / num_warps (AMD); blocks per SM (NVIDIA)"


def programs_per_cu(report) -> int:
    """Programs resident per CU (SM) at the compile's occupancy: waves per SIMD x 4 SIMDs /
    ``num_warps`` on AMD; blocks per SM as they are on NVIDIA."""
    if report.occupancy.unit == "blocks/SM":
        return max(report.occupancy.value, 1)
    return max(report.occupancy.value * SIMDS_PER_CU // report.options["num_warps"], 1)


def _clock(chip_spec, dtype: str) -> tuple[float, tuple]:
    """(Hz, input) the chip is modelled at: a measured clock under an MFMA load (AMD), the
    clock the tensor peaks are quoted at (NVIDIA), else the spec's peak clock."""
    target = chip_spec.target
    known = (machine.tensor_clock_mhz(chip_spec.name, target) if machine.nvidia(target)
             else machine.load_clock_mhz(chip_spec.name, dtype))
    if known is None:
        return chip_spec.clock_ghz * 1e9, (chip_spec.clock_ghz * 1e3, f"{chip_spec.name} spec clock_ghz: no "
                                           f"clock under a {dtype} matrix load in machine.yaml")
    return known[0] * 1e6, known


def chip(chip_spec, dtype: str) -> tuple[combine.Chip, tuple]:
    """The chip at its clock under an MFMA load. Per-clock rates (LDS, L1, L2: the spec
    derives them as bytes per clock x clock) follow the clock; HBM and the Infinity
    Cache, on other clocks, keep the spec's bandwidth. A spec without an L1 bandwidth
    (NVIDIA's) takes machine.yaml's per-target ``l1_bytes_per_clk``."""
    peak_clock = chip_spec.clock_ghz * 1e9
    target = chip_spec.target
    clock, clock_input = _clock(chip_spec, dtype)
    l1 = (chip_spec.bandwidth("l1") * 1e12 / chip_spec.compute_units / peak_clock
          if "l1" in chip_spec.memory_levels else machine.constant("l1_bytes_per_clk", target).value)
    scaled = {"l2": clock / peak_clock}
    return combine.Chip(
        clock_hz=clock, compute_units=chip_spec.compute_units, xcds=chip_spec.xcds or 1,
        l1_bytes_per_clk=l1,
        lds_bytes_per_clk=machine.lds_bytes_per_clk(target).value,
        valu_cycles=machine.constant("valu_cycles", target).value,
        transcendental_cycles=machine.constant("transcendental_cycles", target).value,
        salu_cycles=machine.constant("salu_cycles", target).value,
        latency_cycles=machine.constant("memory_latency_cycles", target).value,
        bandwidth={level: chip_spec.memory_levels[level] * 1e12 * scaled.get(level, 1.0)
                   for level in ("hbm", "llc", "l2") if level in chip_spec.memory_levels}), clock_input


def spec_inputs(chip_spec) -> dict[str, tuple]:
    def source(path: str) -> str:
        return f"{chip_spec.name} spec {path} [{', '.join(chip_spec.provenance[path].source)}]"

    out = {"peak clock (GHz)": (chip_spec.clock_ghz, source("clock_ghz")),
           "compute units": (chip_spec.compute_units, source("compute_units"))}
    if chip_spec.xcds:
        out["XCDs"] = (chip_spec.xcds, source("xcds"))
    for level, value in chip_spec.memory_levels.items():
        if level in ("hbm", "llc", "l2", "l1"):
            out[f"{level} bandwidth (TB/s)"] = (value, source(f"bandwidth_tbps.{level}"))
    return out


def loop_inputs(mixes, target: str) -> dict[str, tuple]:
    """The per-instruction numbers a hot loop was weighed with, with their sources."""
    ops = sorted({op for mix in mixes for op in mix.mfma})
    nvidia = machine.nvidia(target)
    out = {f"{'tensor-core' if nvidia else 'MFMA'} cycles {op}": (
        machine.mfma_cycles(op, target), "S4" if not nvidia else "H100-PEAK" if not machine.warp_product(op)
        else "H100-PEAK, an upper bound: mma.sync on its sub-partition at a quarter of the SM's wgmma rate")
        for op in ops}
    names = ["valu_cycles", "transcendental_cycles", "salu_cycles", "lds_bank_bytes", "memory_latency_cycles"]
    for name in names + (["l1_bytes_per_clk"] if nvidia else []):
        c = machine.constant(name, target)
        out[name] = (c.value, c.source)
    lds = machine.lds_bytes_per_clk(target)
    out["lds_bytes_per_clk"] = (lds.value, lds.source)
    return out


def compile_options(report) -> tuple[dict, str]:
    """What the compile a prediction reads got (``num_warps``, ``num_stages``, the AMD knobs
    the target takes; ``"dropped"``: settings its backend does not take, AMD's on sm_90), as
    ``Prediction.inputs`` shows it beside the config the model assumed."""
    return ({**report.options, **({"dropped": list(report.dropped_options)} if report.dropped_options else {})},
            "the ahead-of-time compile (workbench.isa)")


def mix_summary(mix) -> dict:
    """A hot loop's weighed mix, as ``Prediction.inputs`` shows it."""
    return {"MFMAs": mix.mfma, "MFMA cycles": mix.mfma_cycles, "VALU": mix.valu,
            "of them transcendental": mix.transcendental, "SALU": mix.salu, "LDS ops": mix.lds_ops,
            "LDS bytes": mix.lds_bytes, "LDS bank-slot bytes": mix.lds_slot_bytes,
            "global bytes": mix.global_bytes}
