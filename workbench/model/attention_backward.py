"""Attention v5's backward pass: the Δ preprocess, the dK/dV launch and the dQ launch, one
after the other (:func:`kernels.attention.v5_backward.backward`), each compiled with its
prior config for the shape on the target's backend ("hip" on gfx*, "cuda" on sm_90: the
untimed first choice; on a GPU its tuner may time another). On sm_90 both priors' loops
compile to ``wgmma`` (:mod:`.ptx_loop`): dK/dV's at D = 128 a 16 x 128 tile on 8 warps, a
warpgroup per 64 keys (its 32 x 32 tile, the prior at 64 keys or fewer, has no 64-row
warpgroup shape and compiles to ``mma.sync``), dQ's 128 x 32 on 8 warps (64 x 32 on 4 at
64 keys or fewer).

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
from .gemm import backend_of
from .predict_attention import DTYPES, DISPATCH
from .pinned import pinned
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


def _launches(label: str, shape, dtype: str, chip_spec, tuned: str | None = None) -> dict:
    """Everything the pass and its launches are predicted from; ``tuned``: the launch whose
    config a tuner's pinned candidate replaces (:func:`.candidates.predict_config`)."""
    shape = attention.check_shape(shape)
    if label not in RUNGS:
        raise NotCovered(f"the model covers the attention backward of {', '.join(RUNGS)}, not {label}")
    if dtype not in DTYPES:
        raise NotCovered(f"dtype {dtype!r}: the attention model covers {', '.join(DTYPES)}")
    b, hq, hkv, s, sk, d, causal = shape
    cfgs = v5_backward.prior(backend_of(chip_spec.target), chip_spec.target, d, s, sk)
    if pinned() is not None:
        if tuned not in cfgs:
            raise NotImplementedError(f"attention {label}'s backward tunes {', '.join(cfgs)}: name the launch")
        cfgs[tuned] = dict(pinned())
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
    return {"shape": shape, "cfgs": cfgs, "reports": reports, "mixes": mixes, "chip": chip,
            "clock": clock_input, "launches": launches,
            "timed": {k: uneven.with_memory(launch, traffic[k], chip) for k, launch in launches.items()},
            "delta": q_rows * (2 * tile + 4) / chip.bandwidth["hbm"]}


def _inputs(label: str, chip_spec, found: dict, kernels: tuple[str, ...]) -> dict:
    return {
        **chip_model.spec_inputs(chip_spec),
        "engine clock under MFMA load (MHz)": found["clock"],
        **chip_model.loop_inputs([m for k in kernels for m in found["mixes"][k]], chip_spec.target),
        **{f"compiled kernel {k}": (f"{found['reports'][k].kernel_name} @ {found['reports'][k].target}, causal, "
                                    "S = 4096", "ahead-of-time compile") for k in kernels},
        **{f"{k} {LOOP_ORDER[k][i]} per wave and iteration": (chip_model.mix_summary(mix), "the compiled loop")
           for k in kernels for i, mix in enumerate(found["mixes"][k])},
        **{f"occupancy {k}": (str(found["reports"][k].occupancy), "workbench.isa.occupancy") for k in kernels},
        "dispatch": (DISPATCH.replace("query block", "block"), "assumption"),
        "overlap rule": (OVERLAP, "assumption"),
        "latency rule": (LATENCY, "assumption"),
    }


def launch(label: str, kernel: str, shape, dtype: str, chip_spec) -> Prediction:
    """One tuned launch of the backward, "dkdv" or "dq", as v5's tuner names it; TFLOP/s on
    the FLOPs of its products (dK/dV: four per visible pair, dQ: three)."""
    found = _launches(label, shape, dtype, chip_spec, kernel)
    if kernel not in found["timed"]:
        raise NotCovered(f"attention {label}'s backward launches {', '.join(found['timed'])}, not {kernel!r}")
    seconds, bound, parts = found["timed"][kernel]
    products = {"dkdv": 4, "dq": 3}[kernel]
    flops = products / 5 * attention_spec.backward_flops(found["shape"])
    inputs = {"config": (found["cfgs"][kernel], f"attention {label}'s {kernel} settings"),
              "compile options": chip_model.compile_options(found["reports"][kernel]),
              **_inputs(label, chip_spec, found, (kernel,))}
    return Prediction("attention", label, found["shape"], dtype, chip_spec.name, seconds, flops / seconds / 1e12,
                      bound, parts, inputs)


def predict(label: str, shape, dtype: str, chip_spec) -> Prediction:
    """The backward pass of attention rung ``label`` (v5) at ``shape``."""
    found = _launches(label, shape, dtype, chip_spec)
    seconds, breakdown, time_by = 0.0, {}, {}
    for k, (t, binds, parts) in found["timed"].items():
        time_by[binds] = time_by.get(binds, 0.0) + t
        seconds += t
        for name, value in parts.items():
            breakdown[f"{k}: {name}"] = value
    breakdown["Δ preprocess: HBM"] = found["delta"]
    seconds += found["delta"]
    inputs = {
        "pass": ("backward: Δ preprocess, then the dK/dV launch, then the dQ launch", "v5_backward.backward"),
        **{f"config {k}": (cfg, f"attention {label}'s prior for this shape (untimed)") for k, cfg in found["cfgs"].items()},
        **{f"compile options {k}": chip_model.compile_options(found["reports"][k]) for k in found["cfgs"]},
        **_inputs(label, chip_spec, found, tuple(found["cfgs"])),
        **{f"{k} launch (ms)": (round(run.seconds * 1e3, 4), "model") for k, run in found["launches"].items()},
    }
    flops = attention_spec.backward_flops(found["shape"])
    return Prediction("attention", label, found["shape"], dtype, chip_spec.name, seconds, flops / seconds / 1e12,
                      max(time_by, key=time_by.get), breakdown, inputs)
