"""Attention v5's backward pass: the Δ preprocess, the dK/dV launch and the dQ launch, one
after the other (:func:`kernels.attention.v5_backward.backward`), each compiled with its
prior config for the shape (the untimed first choice; on a GPU its tuner may time another).

* dK/dV: one program per key block of ``BLOCK_N`` keys and KV head; it walks the query
  blocks of every query head of its GQA group, causal: a masked loop over the diagonal
  query blocks, then an unmasked one over the later ones (earlier ones see none of its
  keys). Four products per (query block, key block) pair.
* dQ: one program per query block and query head, an unmasked loop over the key blocks
  every row sees, then a masked one (the diagonal and a ragged last block). Three products.
* Δ = rowsum(dO ∘ O): read O and dO, write Δ; charged its HBM bytes alone.

Each launch is an uneven launch (:mod:`.uneven`) against its own bytes (L2: every tile
each program requests; HBM: each tensor once); the pass takes the sum of the three. The
FLOP count is the spec's ``backward_flops`` (five products per visible pair, FlashAttention-2's
count), so v5's two recomputed products show as lost throughput, as a measurement would.
Compiled causal at S = 4096 and D = 128 (v5's aot); a non-causal launch is taken to run the
same unmasked loops.
"""
from __future__ import annotations

from kernels.attention import spec as attention_spec
from kernels.attention import v5_backward

from .. import isa
from . import attention, uneven
from . import chip as chip_model
from .predict_attention import DTYPES, DISPATCH
from .predict_gemm import LATENCY, OVERLAP
from .prediction import NotCovered, Prediction

RUNGS = ("v5",)
LOOP_ORDER = {"dkdv": ("masked query loop", "unmasked query loop"),
              "dq": ("unmasked key loop", "masked key loop")}    # the loops in each compile's text order


def dkdv_trips(cfg: dict, block: int, s: int, group: int, causal: int) -> tuple[int, int]:
    """(masked, unmasked) query-block iterations of the dK/dV program of key block ``block``,
    over the ``group`` query heads of its KV head."""
    bm, n0 = cfg["BLOCK_M"], block * cfg["BLOCK_N"]
    lo = mid = 0
    if causal:
        lo = n0 // bm * bm
        mid = min(s, -(-(n0 + cfg["BLOCK_N"]) // bm) * bm)
    return group * -(-(mid - lo) // bm), group * -(-max(s - mid, 0) // bm)


def dq_trips(cfg: dict, block: int, sk: int, causal: int) -> tuple[int, int]:
    """(unmasked, masked) key-block iterations of the dQ program of query block ``block``."""
    bm, bn = cfg["BLOCK_M"], cfg["BLOCK_N"]
    mid, hi = sk // bn * bn, sk
    if causal:
        mid = min(mid, (block * bm + 1) // bn * bn)
        hi = min(sk, (block + 1) * bm)
    return -(-mid // bn), -(-max(hi - mid, 0) // bn)


def predict(label: str, shape, dtype: str, chip_spec) -> Prediction:
    """The backward pass of attention rung ``label`` (v5) at ``shape``."""
    shape = attention.check_shape(shape)
    if label not in RUNGS:
        raise NotCovered(f"the model covers the attention backward of {', '.join(RUNGS)}, not {label}")
    if dtype not in DTYPES:
        raise NotCovered(f"dtype {dtype!r}: the attention model covers {', '.join(DTYPES)}")
    b, hq, hkv, s, sk, d, causal = shape
    cfgs = v5_backward.prior("hip", chip_spec.target, d, s, sk)
    if any(cfg["BLOCK_D"] != attention.AOT_HEAD_BLOCK for cfg in cfgs.values()):
        raise NotCovered(f"the attention backward model covers head dims that pad to {attention.AOT_HEAD_BLOCK}")
    chip, clock_input = chip_model.chip(chip_spec, dtype)
    elem = DTYPES[dtype].itemsize
    reports = {k: isa.inspect("attention", label, target=chip_spec.target, dtype=DTYPES[dtype], overrides=cfg)
               for k, cfg in cfgs.items()}
    mixes = {k: uneven.loops(r, 2, chip_spec.target, chip_spec.wave_size) for k, r in reports.items()}
    kv, q = cfgs["dkdv"], cfgs["dq"]
    dkdv = [dkdv_trips(kv, j, s, hq // hkv, causal) for j in range(-(-sk // kv["BLOCK_N"]))]
    dq = [dq_trips(q, i, sk, causal) for i in range(-(-s // q["BLOCK_M"]))]
    tile = d * elem                                  # one row of Q, K, V, O, dO or a gradient
    stats = 3 * 4                                    # a row's two LSE parts and Δ, fp32
    q_rows, kv_rows = b * hq * s, b * hkv * sk
    launches = {
        "dkdv": uneven.run(reports["dkdv"], mixes["dkdv"], dkdv, b * hkv, 2 * kv["BLOCK_N"] * tile, chip),
        "dq": uneven.run(reports["dq"], mixes["dq"], dq, b * hq, q["BLOCK_M"] * tile, chip),
    }
    traffic = {
        "dkdv": {"l2": b * hkv * sum(sum(t) for t in dkdv) * kv["BLOCK_M"] * (2 * tile + stats)
                 + 4 * kv_rows * tile,
                 "hbm": q_rows * (2 * tile + stats) + 4 * kv_rows * tile},
        "dq": {"l2": b * hq * sum(sum(t) for t in dq) * q["BLOCK_N"] * 2 * tile + q_rows * (3 * tile + stats),
               "hbm": q_rows * (3 * tile + stats) + 2 * kv_rows * tile},
    }
    seconds, bound, breakdown, time_by = 0.0, "", {}, {}
    for k, launch in launches.items():
        t, binds, parts = uneven.with_memory(launch, traffic[k], chip)
        time_by[binds] = time_by.get(binds, 0.0) + t
        seconds += t
        for name, value in parts.items():
            breakdown[f"{k}: {name}"] = value
    delta = q_rows * (2 * tile + 4) / chip.bandwidth["hbm"]
    breakdown["Δ preprocess: HBM"] = delta
    seconds += delta
    bound = max(time_by, key=time_by.get)
    inputs = {
        **chip_model.spec_inputs(chip_spec),
        "engine clock under MFMA load (MHz)": clock_input,
        **chip_model.loop_inputs([m for ms in mixes.values() for m in ms], chip_spec.target),
        "pass": ("backward: Δ preprocess, then the dK/dV launch, then the dQ launch", "v5_backward.backward"),
        **{f"config {k}": (cfg, f"attention {label}'s prior for this shape (untimed)") for k, cfg in cfgs.items()},
        **{f"compiled kernel {k}": (f"{r.kernel_name} @ {r.target}, causal, S = 4096", "ahead-of-time compile")
           for k, r in reports.items()},
        **{f"{k} {LOOP_ORDER[k][i]} per wave and iteration": (chip_model.mix_summary(mix), "the compiled loop")
           for k, ms in mixes.items() for i, mix in enumerate(ms)},
        **{f"occupancy {k}": (str(r.occupancy), "workbench.isa.occupancy") for k, r in reports.items()},
        **{f"{k} launch (ms)": (round(launches[k].seconds * 1e3, 4), "model") for k in launches},
        "dispatch": (DISPATCH.replace("query block", "block"), "assumption"),
        "overlap rule": (OVERLAP, "assumption"),
        "latency rule": (LATENCY, "assumption"),
    }
    flops = attention_spec.backward_flops(shape)
    return Prediction("attention", label, shape, dtype, chip_spec.name, seconds, flops / seconds / 1e12,
                      bound, breakdown, inputs)
