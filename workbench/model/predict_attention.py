"""The attention forward's prediction: each compiled key loop weighed per round, each
program's iterations of each, the programs dealt to the CUs as they free up, and the
bytes of each memory level.

Per program (query block ``i`` of one head) the time is ``2L`` plus storing its O tile,
plus, per key loop, its iterations x the loop's round time (:func:`.combine.round_time`
with the rung's occupancy: the exp2 on the VALU at the transcendental rate against the
MFMAs of QKᵀ and PV). Programs are dispatched query block fastest, then head (the grid's
x, then y), each to the first slot of ``CUs x resident`` that frees up: a causal launch's
uneven programs leave slots idle at the end, which the breakdown shows as "idle slots".

Traffic: every program requests its Q tile, its K/V tiles and writes its O tile (and v3's
and v4's LSE) through L2; per XCD, the Infinity Cache serves the K/V extent of each head
the XCD's programs read; HBM reads Q, K and V once and writes O (K/V are taken to stay in
the caches between the programs of a head).

Known limits: the kernel is compiled once, causal, at S = 4096 (the rungs' aot launch): a
non-causal launch is taken to run the same unmasked loop, and a shape whose S or S_k is not
a multiple of the tiles the same loops (the JIT compiles masked loads there); a tail of
fewer resident programs is timed at the full residency.
"""
from __future__ import annotations

import heapq

import torch

from kernels.attention import spec as attention_spec

from .. import isa, isa_parse
from ..isa_occupancy import SIMDS_PER_CU
from . import attention, combine, loop
from . import chip as chip_model
from .predict_gemm import LATENCY, OVERLAP
from .prediction import NotCovered, Prediction

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
LOOP_NAMES = ("unmasked key loop", "masked key loop")
DISPATCH = "query block fastest, then head; each program to the first free slot (assumption)"


def predict(label: str, shape, dtype: str, chip_spec) -> Prediction:
    """Attention forward rung ``label`` at ``shape`` (B, Hq, Hkv, S, S_k, D, causal)."""
    shape = attention.check_shape(shape)
    if dtype not in DTYPES:
        raise NotCovered(f"dtype {dtype!r}: the attention model covers {', '.join(DTYPES)}")
    b, hq, hkv, s, sk, d, causal = shape
    plan = attention.plan(label, shape, chip_spec.target)
    kernel = plan.rung                  # v5's forward: v3's kernel
    report = isa.inspect("attention", kernel, target=chip_spec.target, dtype=DTYPES[dtype],
                         overrides=plan.overrides or None)
    loops = isa_parse.matrix_loops(isa_parse.code_lines(report.asm, "amdgcn"), "amdgcn")
    if len(loops) != attention.LOOPS[kernel]:
        raise ValueError(f"attention {kernel}'s compile has {len(loops)} key loops with MFMAs, "
                         f"the model expects {attention.LOOPS[kernel]}")
    mixes = [loop.mix("\n".join(lines), chip_spec.target, chip_spec.wave_size) for lines in loops]
    cfg = plan.cfg
    num_warps, stages = report.options["num_warps"], report.options.get("num_stages", 1)
    resident = max(report.occupancy.value * SIMDS_PER_CU // num_warps, 1)
    chip, clock_input = chip_model.chip(chip_spec, dtype)
    costs = [combine.round_costs(mix, num_warps, resident, chip) for mix in mixes]
    rounds = [combine.round_time(c, resident * num_warps / SIMDS_PER_CU, resident, stages, chip.latency_cycles)
              for c in costs]
    elem = DTYPES[dtype].itemsize
    bm, bn = cfg["BLOCK_M"], cfg["BLOCK_N"]
    ends = 2 * chip.latency_cycles + resident * bm * d * elem / chip.l1_bytes_per_clk
    blocks = -(-s // bm)
    per_block = [attention.trips(kernel, cfg, i, s, sk, causal) for i in range(blocks)]
    cycles = [ends + sum(n * r[0] for n, r in zip(t, rounds)) for t in per_block]
    slots = chip.compute_units * resident
    makespan = _makespan([cycles[i] for _ in range(b * hq) for i in range(blocks)], slots)
    programs = b * hq
    breakdown: dict[str, float] = {}
    for k, (mix_costs, (_, _, floor)) in enumerate(zip(costs, rounds)):
        iters = programs * sum(t[k] for t in per_block) / slots / chip.clock_hz
        for name, value in mix_costs.items():
            breakdown[name] = breakdown.get(name, 0.0) + iters * value
        breakdown["memory latency"] = breakdown.get("memory latency", 0.0) + iters * floor
    busy = programs * sum(cycles) / slots
    breakdown["prologue + epilogue"] = programs * blocks * ends / slots / chip.clock_hz
    breakdown["idle slots (uneven programs, last wave)"] = (makespan - busy) / chip.clock_hz
    memory = {combine.LEVEL_NAMES[level]: nbytes / chip.bandwidth[level]
              for level, nbytes in _traffic(kernel, shape, cfg, per_block, elem, chip.xcds).items()
              if level in chip.bandwidth}
    breakdown.update(memory)
    seconds = makespan / chip.clock_hz
    by_loop = [programs * sum(t[k] for t in per_block) * rounds[k][0] for k in range(len(mixes))]
    bound = rounds[max(range(len(mixes)), key=by_loop.__getitem__)][1]
    slowest = max(memory, key=memory.get)
    if memory[slowest] > seconds:
        seconds, bound = memory[slowest], slowest
    computed = programs * sum(sum(t) for t in per_block) * bm * bn
    inputs = {
        **chip_model.spec_inputs(chip_spec),
        "engine clock under MFMA load (MHz)": clock_input,
        **chip_model.loop_inputs(mixes, chip_spec.target),
        "config": (cfg, f"attention {kernel}'s choice for this shape" + (" (v4's untimed prior)" if kernel == "v4" else "")
                   + (f" ({label}'s forward pass is {kernel}'s launch; its backward is not modelled)"
                      if kernel != label else "")),
        "compiled kernel": (f"{report.kernel_name} @ {report.target}, causal, S = 4096",
                            "ahead-of-time compile (workbench.isa): the rung's aot launch"),
        **{f"{LOOP_NAMES[k]} per wave and iteration": (chip_model.mix_summary(mix), "the compiled loop")
           for k, mix in enumerate(mixes)},
        "MFMA work per iteration / the tile's QKᵀ + PV": (
            round(mixes[0].mfma_flops * num_warps / (4 * bm * bn * cfg["BLOCK_D"]), 3),
            "the compiled loop: above 1, waves repeat MFMAs (a tile split the MFMA shape does not fit)"),
        "occupancy": (str(report.occupancy), "workbench.isa_occupancy"),
        "programs resident per CU": (resident, "occupancy x 4 SIMDs / num_warps"),
        "programs": (programs * blocks, "grid: query blocks x B x Hq"),
        "key tiles computed / visible (query, key) pairs": (
            round(computed / (b * hq * attention_spec.visible_pairs(s, sk, causal)), 3),
            "model: the loops' bounds against the mask (1: no wasted tile work)"),
        "dispatch": (DISPATCH, "assumption"),
        "overlap rule": (OVERLAP, "assumption"),
        "latency rule": (LATENCY, "assumption"),
    }
    flops = attention_spec.flops(shape)
    return Prediction("attention", label, shape, dtype, chip_spec.name, seconds, flops / seconds / 1e12,
                      bound, breakdown, inputs)


def _makespan(durations: list[float], slots: int) -> float:
    """When the last program ends, each program taken in order by the first free slot."""
    free = [0.0] * min(slots, len(durations))
    for duration in durations:
        heapq.heapreplace(free, free[0] + duration)
    return max(free)


def _traffic(label: str, shape: tuple, cfg: dict, per_block: list, elem: int, xcds: int) -> dict[str, float]:
    """Bytes per memory level of the launch (the rule in the module docstring)."""
    b, hq, hkv, s, sk, d, _ = shape
    bm, bn = cfg["BLOCK_M"], cfg["BLOCK_N"]
    lse = 0 if label == "v2" else 2 * 4                 # v3, v4: two fp32 LSE parts per row
    q_and_o = b * hq * s * d * (2 * elem) + b * hq * s * lse
    extent = [min(sum(t) * bn, sk) for t in per_block]   # keys each query block reads
    l2 = q_and_o + b * hq * sum(extent) * d * 2 * elem
    group, blocks = hq // hkv, len(per_block)
    reach: dict[tuple, int] = {}                        # (XCD, batch, KV head) -> keys read
    for p in range(b * hq * blocks):
        bh, i = divmod(p, blocks)
        key = (p % xcds, bh // hq, (bh % hq) // group)
        reach[key] = max(reach.get(key, 0), extent[i])
    llc = q_and_o + sum(reach.values()) * d * 2 * elem
    hbm = q_and_o + b * hkv * sk * d * 2 * elem
    return {"l2": l2, "llc": llc, "hbm": hbm}
