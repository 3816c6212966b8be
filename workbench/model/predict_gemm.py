"""The prediction of a GEMM-like launch: a K loop per output tile (:mod:`.loop`), tiles in
waves over the CUs (:mod:`.gemm`, :mod:`.grouped_gemm`, :mod:`.tiles`) and the combination
rule (:mod:`.combine`). The GEMM ladder and the grouped GEMM ladder share it."""
from __future__ import annotations

import torch

from kernels.gemm import spec as gemm_spec

from .. import isa
from . import chip as chip_model
from . import combine, gemm, tiles
from .prediction import NotCovered, Prediction

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
OVERLAP = ("max of the round's resources; 1 - 1/(waves per SIMD) of the rest hidden behind it "
           "(sm_90, a loop with a wgmma group in flight: tensor cores, shared memory and L1 wholly hidden)")
LATENCY = "prefetch d = num_stages - 1: round >= L / d; d = 0: round >= L + own share"


def check_shape(shape, names: tuple[str, ...]) -> tuple[int, ...]:
    if (not isinstance(shape, (tuple, list)) or len(shape) != len(names)
            or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape)):
        raise ValueError(f"shape must be {len(names)} positive ints ({', '.join(names)}), got {shape!r}")
    return tuple(shape)


def check_dtype(dtype: str, what: str) -> torch.dtype:
    if dtype not in DTYPES:
        raise NotCovered(f"dtype {dtype!r}: the {what} model covers {', '.join(DTYPES)}")
    return DTYPES[dtype]


def predict(label: str, shape, dtype: str, chip_spec) -> Prediction:
    """GEMM rung ``label`` at ``shape`` (M, N, K) in ``dtype`` on ``chip_spec``'s GPU."""
    shape = check_shape(shape, ("M", "N", "K"))
    torch_dtype = check_dtype(dtype, "GEMM")
    if label not in gemm.RUNGS:
        raise NotCovered(f"the model covers GEMM rungs {', '.join(gemm.RUNGS)}, not {label}")
    plan = gemm.plan(label, shape, chip_spec.target, chip_spec.compute_units, torch_dtype)
    report = isa.inspect("gemm", label, target=chip_spec.target, dtype=torch_dtype,
                         overrides=plan.overrides or None)
    block = (plan.cfg["BLOCK_M"], plan.cfg["BLOCK_N"])
    elem = torch_dtype.itemsize
    return tile_launch("gemm", label, shape, dtype, chip_spec, report, plan.cfg, plan.persistent, elem,
                       lambda slots, xcds: plan.waves(shape, slots, xcds),
                       lambda wave, xcds: tiles.traffic(wave, shape, block, elem, xcds),
                       gemm_spec.flops(shape), f"gemm {label}'s choice for this shape")


def matrix_loop(report, op: str, label: str, dtype: str, chip_spec):
    """The compiled hot loop of ``report``, weighed (:func:`.chip.weigh`); one without matrix
    instructions (an fp32 dot on sm_90 runs on the FMA units) is :class:`NotCovered`."""
    mix = chip_model.weigh(report.hot_loop, chip_spec.target, chip_spec.wave_size)
    if not mix.mfma:
        raise NotCovered(f"{op} {label} in {dtype} on {chip_spec.target} compiles to a hot loop without matrix "
                         f"instructions (the dot runs on the FMA units): the model weighs matrix-core loops only")
    return mix


def tile_launch(op: str, label: str, shape: tuple, dtype: str, chip_spec, report, cfg: dict,
                persistent: int | None, out_elem_bytes: int, waves_of, traffic_of, flops: float,
                config_source: str, products: int = 1, schedule_of=None, **extra_inputs) -> Prediction:
    """A launch of output tiles, each a K loop (``report``'s hot loop) with ``cfg``'s tile:
    ``waves_of(slots, xcds)`` lays them out, ``traffic_of(wave, xcds)`` gives each wave's
    bytes per memory level; ``persistent``: a persistent launch's program count;
    ``out_elem_bytes``: an output element's bytes (the tile each program stores);
    ``products``: tile products per K step (MoE's gate/up kernel: two, sharing A);
    ``schedule_of(chip, num_warps)``: the launch's device-side tile schedule
    (:class:`.combine.Schedule`), if it has one."""
    mix = matrix_loop(report, op, label, dtype, chip_spec)
    num_warps, stages = report.options["num_warps"], report.options.get("num_stages", 1)
    steps = gemm.steps_per_iteration(cfg, num_warps, mix.mfma_flops // products)
    resident = chip_model.programs_per_cu(report)
    if persistent is not None:
        resident = min(resident, -(-persistent // chip_spec.compute_units))
    chip, clock_input = chip_model.chip(chip_spec, dtype)
    waves = waves_of(chip.compute_units * resident, chip.xcds)
    schedule = None if schedule_of is None else schedule_of(chip, num_warps)
    seconds, bound, breakdown = combine.launch(
        mix, num_warps, stages, resident, waves, lambda k: gemm.trips(k, cfg, steps),
        cfg["BLOCK_M"] * cfg["BLOCK_N"] * out_elem_bytes, lambda wave: traffic_of(wave, chip.xcds), chip,
        schedule)
    inputs = {
        **chip_model.spec_inputs(chip_spec),
        "engine clock under MFMA load (MHz)": clock_input,
        **chip_model.loop_inputs([mix], chip_spec.target),
        "config": (cfg, config_source),
        "compiled kernel": (f"{report.kernel_name} @ {report.target}", "ahead-of-time compile (workbench.isa)"),
        "compile options": chip_model.compile_options(report),
        "hot loop per wave and iteration": (chip_model.mix_summary(mix), "the compiled hot loop"),
        "K steps per iteration": (steps, "the compiled hot loop"),
        "occupancy": (str(report.occupancy), "workbench.isa.occupancy"),
        "programs resident per CU": (resident, chip_model.RESIDENT_RULE),
        "waves of programs": (len(waves), "model: programs / (CUs x resident), per launch"),
        **extra_inputs,
        **({} if schedule is None else {"tile schedule (cycles)": (
            {"per tile": round(schedule.per_tile), "once": round(schedule.once), "surplus programs": schedule.surplus},
            "the compiled kernel's schedule.py lines (workbench.model.tile_schedule)")}),
        "overlap rule": (OVERLAP, "assumption"),
        "latency rule": (LATENCY, "assumption"),
    }
    return Prediction(op, label, shape, dtype, chip_spec.name, seconds, flops / seconds / 1e12, bound,
                      breakdown, inputs)
