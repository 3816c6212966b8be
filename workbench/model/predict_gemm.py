"""The GEMM ladder's prediction: its hot loop (:mod:`.loop`), its tiles in waves
(:mod:`.gemm`, :mod:`.tiles`) and the combination rule (:mod:`.combine`)."""
from __future__ import annotations

import torch

from kernels.gemm import spec as gemm_spec

from .. import isa
from ..isa_occupancy import SIMDS_PER_CU
from . import chip as chip_model
from . import combine, gemm, loop, tiles
from .prediction import NotCovered, Prediction

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
OVERLAP = "max of the round's resources; 1 - 1/(waves per SIMD) of the rest hidden behind it"
LATENCY = "prefetch d = num_stages - 1: round >= L / d; d = 0: round >= L + own share"


def check_shape(shape) -> tuple[int, int, int]:
    if (not isinstance(shape, (tuple, list)) or len(shape) != 3
            or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape)):
        raise ValueError(f"shape must be three positive ints (M, N, K), got {shape!r}")
    return tuple(shape)


def predict(label: str, shape, dtype: str, chip_spec) -> Prediction:
    """GEMM rung ``label`` at ``shape`` (M, N, K) in ``dtype`` on ``chip_spec``'s GPU."""
    shape = check_shape(shape)
    if dtype not in DTYPES:
        raise NotCovered(f"dtype {dtype!r}: the GEMM model covers {', '.join(DTYPES)}")
    if label not in gemm.RUNGS:
        raise NotCovered(f"the model covers GEMM rungs {', '.join(gemm.RUNGS)}, not {label}")
    plan = gemm.plan(label, shape, chip_spec.target, chip_spec.compute_units)
    report = isa.inspect("gemm", label, target=chip_spec.target, dtype=DTYPES[dtype],
                         overrides=plan.overrides or None)
    mix = loop.mix(report.hot_loop, chip_spec.target, chip_spec.wave_size)
    steps = gemm.steps_per_iteration(plan.cfg, mix.mfma_flops)
    num_warps, stages = report.options["num_warps"], report.options.get("num_stages", 1)
    resident = max(report.occupancy.value * SIMDS_PER_CU // num_warps, 1)
    if plan.persistent is not None:
        resident = min(resident, -(-plan.persistent // chip_spec.compute_units))
    chip, clock_input = chip_model.chip(chip_spec, dtype)
    elem = DTYPES[dtype].itemsize
    block = (plan.cfg["BLOCK_M"], plan.cfg["BLOCK_N"])
    waves = plan.waves(shape, chip.compute_units * resident, chip.xcds)
    seconds, bound, breakdown = combine.launch(
        mix, num_warps, stages, resident, waves, lambda k: gemm.trips(k, plan.cfg, steps),
        block[0] * block[1] * elem, lambda wave: tiles.traffic(wave, shape, block, elem, chip.xcds), chip)
    inputs = {
        **chip_model.spec_inputs(chip_spec),
        "engine clock under MFMA load (MHz)": clock_input,
        **chip_model.loop_inputs([mix], chip_spec.target),
        "config": (plan.cfg, f"gemm {label}'s choice for this shape"),
        "compiled kernel": (f"{report.kernel_name} @ {report.target}", "ahead-of-time compile (workbench.isa)"),
        "hot loop per wave and iteration": (chip_model.mix_summary(mix), "the compiled hot loop"),
        "K steps per iteration": (steps, "the compiled hot loop"),
        "occupancy": (str(report.occupancy), "workbench.isa_occupancy"),
        "programs resident per CU": (resident, "occupancy x 4 SIMDs / num_warps"),
        "waves of programs": (len(waves), "model: programs / (CUs x resident)"),
        "overlap rule": (OVERLAP, "assumption"),
        "latency rule": (LATENCY, "assumption"),
    }
    flops = gemm_spec.flops(shape)
    return Prediction("gemm", label, shape, dtype, chip_spec.name, seconds, flops / seconds / 1e12, bound,
                      breakdown, inputs)
