"""One GPU as the model sees it: its spec (``roofline``) at the clock it runs under an MFMA load.

Shared by every op's prediction: :func:`chip` gives the numbers the combination rule
needs, :func:`spec_inputs` lists the spec fields behind them with their sources.
"""
from __future__ import annotations

from . import combine, machine


def chip(chip_spec, dtype: str) -> tuple[combine.Chip, tuple]:
    """The chip at its clock under an MFMA load. Per-clock rates (LDS, L1, L2: the spec
    derives them as bytes per clock x clock) follow the clock; HBM and the Infinity
    Cache, on other clocks, keep the spec's bandwidth."""
    peak_clock = chip_spec.clock_ghz * 1e9
    measured = machine.load_clock_mhz(chip_spec.name, dtype)
    if measured is None:
        clock_input = (chip_spec.clock_ghz * 1e3, f"{chip_spec.name} spec clock_ghz: no measured "
                       f"clock under a {dtype} MFMA load in machine.yaml")
        clock = peak_clock
    else:
        clock_input, clock = measured, measured[0] * 1e6
    scaled = {"l2": clock / peak_clock}
    return combine.Chip(
        clock_hz=clock, compute_units=chip_spec.compute_units, xcds=chip_spec.xcds or 1,
        l1_bytes_per_clk=chip_spec.bandwidth("l1") * 1e12 / chip_spec.compute_units / peak_clock,
        lds_bytes_per_clk=machine.lds_bytes_per_clk(chip_spec.target).value,
        valu_cycles=machine.constant("valu_cycles").value,
        transcendental_cycles=machine.constant("transcendental_cycles").value,
        salu_cycles=machine.constant("salu_cycles").value,
        latency_cycles=machine.constant("memory_latency_cycles").value,
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
    out = {f"MFMA cycles {op}": (machine.mfma_cycles(op, target), "S4") for op in ops}
    for name in ("valu_cycles", "transcendental_cycles", "salu_cycles", "lds_bank_bytes", "memory_latency_cycles"):
        c = machine.constant(name)
        out[name] = (c.value, c.source)
    lds = machine.lds_bytes_per_clk(target)
    out["lds_bytes_per_clk"] = (lds.value, lds.source)
    return out


def mix_summary(mix) -> dict:
    """A hot loop's weighed mix, as ``Prediction.inputs`` shows it."""
    return {"MFMAs": mix.mfma, "MFMA cycles": mix.mfma_cycles, "VALU": mix.valu,
            "of them transcendental": mix.transcendental, "SALU": mix.salu, "LDS ops": mix.lds_ops,
            "LDS bytes": mix.lds_bytes, "LDS bank-slot bytes": mix.lds_slot_bytes,
            "global bytes": mix.global_bytes}
