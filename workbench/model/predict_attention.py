"""The attention forward's prediction: each compiled key loop weighed per round, each
program's iterations of each, the programs dealt to the CUs as they free up
(:mod:`.uneven`), and the bytes of each memory level.

Per program (query block ``i`` of one head) the time is ``2L`` plus storing its O tile,
plus, per key loop, its iterations x the loop's round time (:func:`.combine.round_time`
with the rung's occupancy: the exp2 on the VALU at the transcendental rate against the
MFMAs of QKᵀ and PV). Programs are dispatched query block fastest, then head (the grid's
x, then y), each to the first slot of ``CUs x resident`` that frees up.

Traffic: every program requests its Q tile, its K/V tiles and writes its O tile (and v3's
and v4's LSE) through L2; per XCD, the Infinity Cache serves the K/V extent of each head
the XCD's programs read; HBM reads Q, K and V once and writes O (K/V are taken to stay in
the caches between the programs of a head).

Known limits: the kernel is compiled once, causal, at S = 4096 (the rungs' aot launch): a
non-causal launch is taken to run the same unmasked loop, and a shape whose S or S_k is not
a multiple of the tiles the same loops (the JIT compiles masked loads there).
"""
from __future__ import annotations

import torch

from kernels.attention import spec as attention_spec

from .. import isa
from . import attention, uneven
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
    cfg = plan.cfg
    mixes = uneven.loops(report, attention.LOOPS[kernel], chip_spec.target, chip_spec.wave_size)
    chip, clock_input = chip_model.chip(chip_spec, dtype)
    elem = DTYPES[dtype].itemsize
    bm, bn = cfg["BLOCK_M"], cfg["BLOCK_N"]
    per_block = [attention.trips(kernel, cfg, i, s, sk, causal) for i in range(-(-s // bm))]
    programs = b * hq
    launch = uneven.run(report, mixes, per_block, programs, bm * d * elem, chip)
    seconds, bound, breakdown = uneven.with_memory(
        launch, _traffic(kernel, shape, cfg, per_block, elem, chip.xcds), chip)
    computed = programs * sum(sum(t) for t in per_block) * bm * bn
    inputs = {
        **chip_model.spec_inputs(chip_spec),
        "engine clock under MFMA load (MHz)": clock_input,
        **chip_model.loop_inputs(mixes, chip_spec.target),
        "config": (cfg, f"attention {kernel}'s choice for this shape" + (" (v4's untimed prior)" if kernel == "v4" else "")
                   + (f" ({label}'s forward pass is {kernel}'s launch; its backward: predict_backward)"
                      if kernel != label else "")),
        "compiled kernel": (f"{report.kernel_name} @ {report.target}, causal, S = 4096",
                            "ahead-of-time compile (workbench.isa): the rung's aot launch"),
        "compile options": chip_model.compile_options(report),
        **{f"{LOOP_NAMES[k]} per wave and iteration": (chip_model.mix_summary(mix), "the compiled loop")
           for k, mix in enumerate(mixes)},
        "MFMA work per iteration / the tile's QKᵀ + PV": (
            round(mixes[0].mfma_flops * report.options["num_warps"] / (4 * bm * bn * cfg["BLOCK_D"]), 3),
            "the compiled loop: above 1, waves repeat MFMAs (a tile split the MFMA shape does not fit)"),
        "occupancy": (str(report.occupancy), "workbench.isa.occupancy"),
        "programs resident per CU": (launch.resident, chip_model.RESIDENT_RULE),
        "programs": (programs * len(per_block), "grid: query blocks x B x Hq"),
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
