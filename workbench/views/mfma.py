"""Matrix-core costs for the roofline notebook (``notebooks/10_roofline.ipynb``, sections 7 and 8).

Every number here is computed from data with a source (the model's ``machine.yaml``: MFMA
cycles and the clock under an MFMA load; ``published.yaml``: hipBLASLt's measured TFLOP/s;
the GPU specs) or read from a gfx942 compile, so that the notebook's prose states what
these functions return rather than typed numbers, and a change to the data shows up in
the notebook's checks.
"""
from __future__ import annotations

import re

import roofline

from .. import isa
from ..isa.occupancy import SIMDS_PER_CU
from ..model import loop, machine, validation

_SHAPE = re.compile(r"v_mfma_f32_(\d+)x(\d+)x(\d+)_(bf16|f16|f32|fp8_fp8)$")
_ELEMENT_BYTES = {"bf16": 2, "f16": 2, "f32": 4, "fp8_fp8": 1}
_DTYPE = {"bf16": "bf16", "f16": "fp16", "f32": "fp32", "fp8_fp8": "fp8"}
# GEMM v4 at its own setting and at the other MFMA size, next to v3 (32x32, one stage).
GEMM_BUILDS = (("v3", {}), ("v4", {}), ("v4", {"matrix_instr_nonkdim": 32}))


def _shape(mnemonic: str) -> tuple[int, int, int, str]:
    m = _SHAPE.match(mnemonic)
    if m is None:
        raise ValueError(f"{mnemonic!r} is not a dense MFMA with one input type (e.g. v_mfma_f32_32x32x8_bf16)")
    return int(m.group(1)), int(m.group(2)), int(m.group(3)), m.group(4)


def instruction_rows(gpus=("MI300X", "MI355X"), dtypes=("bf16", "fp8")) -> list[dict]:
    """Each MFMA of ``dtypes`` in the cycle table of each GPU's target: its cycles, FLOP per
    clock per CU (4 matrix cores, one per SIMD) and the chip peak that rate gives at the
    spec clock, next to the spec's peak."""
    rows = []
    for gpu in map(roofline.spec, gpus):
        for mnemonic, cycles in machine.mfma_table(gpu.target).items():
            m = _SHAPE.match(mnemonic)
            if m is None or _DTYPE[m.group(4)] not in dtypes:
                continue
            per_cu = machine.mfma_flops(mnemonic) // cycles * SIMDS_PER_CU
            chip = per_cu * gpu.compute_units * gpu.clock_ghz / 1e3
            rows.append({"GPU": gpu.name, "target": gpu.target, "instruction": mnemonic, "cycles": cycles,
                         "FLOP/instr": machine.mfma_flops(mnemonic), "FLOP/clk/CU": per_cu,
                         "TFLOP/s at spec clock (model)": round(chip, 1),
                         "spec peak": gpu.peak(_DTYPE[m.group(4)]),
                         "of spec peak": round(chip / gpu.peak(_DTYPE[m.group(4)]), 3)})
    return rows


def fragment(mnemonic: str, lanes: int = 64) -> dict:
    """What one MFMA reads and writes per lane of a wave: the A (M x K) and B (K x N)
    fragments are spread evenly over the lanes, as is the M x N fp32 accumulator."""
    rows, cols, depth, kind = _shape(mnemonic)
    a_bytes = rows * depth * _ELEMENT_BYTES[kind] // lanes
    b_bytes = depth * cols * _ELEMENT_BYTES[kind] // lanes
    macs = rows * cols * depth
    cycles = machine.mfma_cycles(mnemonic, "gfx942")
    return {"instruction": mnemonic, "A bytes/lane": a_bytes, "B bytes/lane": b_bytes,
            "MACs": macs, "operand bytes/MAC": lanes * (a_bytes + b_bytes) / macs,
            "gfx942 cycles": cycles, "operand bytes/clk": lanes * (a_bytes + b_bytes) // cycles,
            "C fp32 registers/lane": rows * cols // lanes}


def _accum_offset(asm: str) -> int:
    return int(re.search(r"\.amdhsa_accum_offset\s+(\d+)", asm).group(1))


def _lds_bytes(mix: loop.LoopMix, kind: str, lanes: int = 64) -> int:
    """Bytes a wave's ``kind`` ("ds_read" or "ds_write") instructions move in one loop trip."""
    total = 0
    for op, n in mix.lds_ops.items():
        if op.startswith(kind):
            count, width = loop.lds_access(op)
            total += lanes * n * count * width
    return total


def gemm_rows() -> list[dict]:
    """GEMM v3 and v4 compiled for gfx942 (and v4 at the other MFMA size): per wave and per
    hot-loop trip, the bytes read from LDS per MAC, the MFMA operand bytes per MAC, and
    where the accumulator lives (ArchVGPRs or AGPRs)."""
    rows = []
    for rung, overrides in GEMM_BUILDS:
        report = isa.inspect("gemm", rung, "gfx942", overrides=overrides or None)
        mix = loop.mix(report.hot_loop, "gfx942")
        (mnemonic, count), = mix.mfma.items()
        reads = _lds_bytes(mix, "ds_read")
        macs = mix.mfma_flops // 2
        rows.append({"rung": rung, "matrix_instr_nonkdim": report.options.get("matrix_instr_nonkdim", "-"),
                     "instruction": mnemonic, "MFMAs per trip": count, "MACs per trip": macs,
                     "LDS read bytes/MAC": reads / macs,
                     "LDS write bytes/MAC": _lds_bytes(mix, "ds_write") / macs,
                     "operand bytes/MAC": fragment(mnemonic)["operand bytes/MAC"],
                     "VGPRs": report.vgprs, "AGPRs": report.agprs,
                     "accum_offset": _accum_offset(report.asm), "occupancy": report.occupancy.value})
    return rows


def ceiling_rows() -> list[dict]:
    """The published library GEMM measurements (hipBLASLt, cuBLAS) against the datasheet peak
    and, where the clock was measured in the same run (same source), against that peak at the
    engine clock under that MFMA load (model: peak x clock ratio); another run's clock is not
    assumed."""
    rows = []
    for point in validation.points():
        if point["kind"] != "library" or point.get("op", "gemm") != "gemm":
            continue
        gpu = roofline.spec(point["gpu"])
        peak = gpu.peak(point["dtype"])
        clock = machine.load_clock_mhz(gpu.name, point["dtype"])
        clock = clock if clock is not None and clock[1] == point["source"] else None
        at_load = None if clock is None else peak * clock[0] / (gpu.clock_ghz * 1e3)
        rows.append({"GPU": gpu.name, "dtype": point["dtype"], "what": point["what"],
                     "shape": "x".join(map(str, point["shape"])) + f" {point['layout']}",
                     "datasheet peak": peak, "spec clock MHz": round(gpu.clock_ghz * 1e3),
                     "MFMA-load clock MHz": None if clock is None else clock[0],
                     "peak at load clock (model)": None if at_load is None else round(at_load, 1),
                     "measured TFLOP/s": point["tflops"],
                     "of datasheet": round(point["tflops"] / peak, 3),
                     "of peak at load clock": None if at_load is None else round(point["tflops"] / at_load, 3),
                     "source": point["source"]})
    return rows


def shown(rows: list[dict]) -> list[dict]:
    """Rows for ``format_table`` with floats as written (%g), so 1307.4 does not print as 1.31e+03."""
    return [{k: f"{v:g}" if isinstance(v, float) else v for k, v in row.items()} for row in rows]
