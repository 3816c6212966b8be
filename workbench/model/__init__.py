"""A performance model of the rungs, read from the code the compiler makes (labelled "model").

    >>> from workbench.model import predict
    >>> p = predict("gemm", "v4", (8192, 8192, 8192), "bf16", "MI300X")   # doctest: +SKIP
    >>> p                                                                  # doctest: +SKIP
    Prediction[model](gemm v4 8192x8192x8192 bf16 on MI300X: ... ms, ... TFLOP/s, ... bound)
    >>> p.breakdown, p.inputs                                              # doctest: +SKIP

The rung is compiled ahead of time for the GPU's target as the JIT compiles it, with the
config the rung picks at that shape (:mod:`.gemm`); its hot loop is weighed per wave and
iteration (:mod:`.loop`, cycles and rates in ``machine.yaml``); programs are laid out in
waves over the CUs and XCDs with the traffic of each wave (:mod:`.tiles`); the rule of
:mod:`.combine` turns these into a time. Every number that goes in is listed in
``Prediction.inputs`` with its source; every number that comes out is a model number.

Covered: the GEMM rungs with an ahead-of-time compile (v2-v6, and split-K beside v6), on
AMD GPUs of targets gfx942 (MI300X, MI325X) and gfx950 (MI355X), in bf16, fp16 and fp32.
"""
from __future__ import annotations

import roofline
import torch

import kernels
from kernels.gemm import spec as gemm_spec

from .. import isa
from ..isa_occupancy import SIMDS_PER_CU
from . import combine, gemm, loop, machine, tiles
from .prediction import Prediction

__all__ = ["Prediction", "predict"]

TARGETS = ("gfx942", "gfx950")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
OVERLAP = "max of the round's resources; 1 - 1/(waves per SIMD) of the rest hidden behind it"
LATENCY = "prefetch d = num_stages - 1: round >= L / d; d = 0: round >= L + own share"


def predict(op: str, rung: int | str, shape, dtype="bf16", gpu: str = "MI300X") -> Prediction:
    """Modelled time of ``op``'s ``rung`` at ``shape`` (the op's shape order) on ``gpu``."""
    if op != "gemm":
        raise NotImplementedError(f"the model covers op 'gemm' (rungs {', '.join(gemm.RUNGS)}), not {op!r}")
    chip_spec = roofline.spec(gpu)
    if chip_spec.target not in TARGETS:
        raise NotImplementedError(f"the model covers AMD targets {', '.join(TARGETS)}; "
                                  f"{chip_spec.name} is {chip_spec.target}")
    if (not isinstance(shape, (tuple, list)) or len(shape) != 3
            or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape)):
        raise ValueError(f"shape must be three positive ints (M, N, K), got {shape!r}")
    shape = tuple(shape)
    name = roofline.dtype_name(dtype)
    if name not in DTYPES:
        raise ValueError(f"dtype {dtype!r}: the GEMM model covers {', '.join(DTYPES)}")
    label = kernels.get(op, rung).label
    if label not in gemm.RUNGS:
        raise NotImplementedError(f"the model covers GEMM rungs {', '.join(gemm.RUNGS)}, not {label}")
    plan = gemm.plan(label, shape, chip_spec.target, chip_spec.compute_units)
    report = isa.inspect(op, label, target=chip_spec.target, dtype=DTYPES[name],
                         overrides=plan.overrides or None)
    mix = loop.mix(report.hot_loop, chip_spec.target, chip_spec.wave_size)
    steps = gemm.steps_per_iteration(plan.cfg, mix.mfma_flops)
    num_warps, stages = report.options["num_warps"], report.options.get("num_stages", 1)
    resident = max(report.occupancy.value * SIMDS_PER_CU // num_warps, 1)
    if plan.persistent is not None:
        resident = min(resident, -(-plan.persistent // chip_spec.compute_units))
    chip, clock_input = _chip(chip_spec, name)
    elem = DTYPES[name].itemsize
    block = (plan.cfg["BLOCK_M"], plan.cfg["BLOCK_N"])
    waves = plan.waves(shape, chip.compute_units * resident, chip.xcds)
    seconds, bound, breakdown = combine.launch(
        mix, num_warps, stages, resident, waves, lambda k: gemm.trips(k, plan.cfg, steps),
        block[0] * block[1] * elem, lambda wave: tiles.traffic(wave, shape, block, elem, chip.xcds), chip)
    inputs = {
        **_spec_inputs(chip_spec),
        "engine clock under MFMA load (MHz)": clock_input,
        **{f"MFMA cycles {op_name}": (machine.mfma_cycles(op_name, chip_spec.target), "S4")
           for op_name in mix.mfma},
        **{name_: (c.value, c.source) for name_, c in
           ((n, machine.constant(n)) for n in ("valu_cycles", "salu_cycles", "lds_bytes_per_clk",
                                               "lds_bank_bytes", "memory_latency_cycles"))},
        "config": (plan.cfg, f"gemm {label}'s choice for this shape"),
        "compiled kernel": (f"{report.kernel_name} @ {report.target}", "ahead-of-time compile (workbench.isa)"),
        "hot loop per wave and iteration": (_mix_summary(mix), "the compiled hot loop"),
        "K steps per iteration": (steps, "the compiled hot loop"),
        "occupancy": (str(report.occupancy), "workbench.isa_occupancy"),
        "programs resident per CU": (resident, "occupancy x 4 SIMDs / num_warps"),
        "waves of programs": (len(waves), "model: programs / (CUs x resident)"),
        "overlap rule": (OVERLAP, "assumption"),
        "latency rule": (LATENCY, "assumption"),
    }
    flops = gemm_spec.flops(shape)
    return Prediction(op, label, shape, name, chip_spec.name, seconds, flops / seconds / 1e12, bound,
                      breakdown, inputs)


def _chip(chip_spec, dtype: str) -> tuple[combine.Chip, tuple]:
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
        lds_bytes_per_clk=machine.constant("lds_bytes_per_clk").value,
        valu_cycles=machine.constant("valu_cycles").value,
        salu_cycles=machine.constant("salu_cycles").value,
        latency_cycles=machine.constant("memory_latency_cycles").value,
        bandwidth={level: chip_spec.memory_levels[level] * 1e12 * scaled.get(level, 1.0)
                   for level in ("hbm", "llc", "l2") if level in chip_spec.memory_levels}), clock_input


def _spec_inputs(chip_spec) -> dict[str, tuple]:
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


def _mix_summary(mix: loop.LoopMix) -> dict:
    return {"MFMAs": mix.mfma, "MFMA cycles": mix.mfma_cycles, "VALU": mix.valu, "SALU": mix.salu,
            "LDS ops": mix.lds_ops, "LDS bytes": mix.lds_bytes, "LDS bank-slot bytes": mix.lds_slot_bytes,
            "global bytes": mix.global_bytes}
