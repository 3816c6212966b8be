"""``workbench comm``: the kernels.comm rungs timed beside the library, on gloo ranks or on GPUs.

One command, one module, two backends (``--backend``; ``auto`` takes NCCL/RCCL on a node with
two GPUs or more, else gloo):

**gloo** (:func:`report`): ranks on this machine's CPU (``backend: gloo/CPU`` in every row),
the alpha-beta fit of those timings, and the model's 8-GPU predictions. The timings compare
the rungs with the library and test the model's shape, and are never GPU performance. The
predictions are arithmetic on datasheet fabrics, labelled ``model``.

**nccl** (:func:`run`, :func:`main`): the ring rungs against RCCL/NCCL, in bus bandwidth, on
one node.

Bus bandwidth (nccl-tests' "busbw") is the bytes one rank's link carries per second: the
algorithm's volume from the alpha-beta model (2(p-1)/p·n for all-reduce, (p-1)/p·n for
reduce-scatter and all-gather) over the measured time. It does not depend on the world
size, and a bandwidth-optimal ring reaches the link's own bandwidth, so the ring rungs and
the library compare on one scale. The goal: the ring rungs reach at least 0.8x the
library's bus bandwidth at 256 MB.

It also times the expert-parallel MoE layer (:mod:`workbench.comm.ep_overlap`, one rank per
GPU) unchunked (``ref``) and with its dispatch/combine pipelined over chunks, at a size
where the unchunked layer's communication and compute are of one order (the events of
the ``ref`` run say how balanced they were, and the verdict prints it; the size was
chosen without a GPU): the goal is
1.3x the unchunked layer.

It needs two GPUs or more (one NCCL/RCCL rank per GPU, in spawned processes, through
:func:`kernels.comm.measure.measure`); with fewer it says so and records nothing. Rows are
:class:`workbench.results.ResultRow` (``gbps`` is the bus bandwidth, ``ratio_to_ref`` the
library's time over the rung's, ``shape`` is ranks x bytes), so they load, save and ship in
``workbench/recorded/`` like every other result.
"""
from __future__ import annotations

import torch

from kernels.comm.cost_model import cost
from kernels.comm.measure import fit_rows, measure
from kernels.comm.overlap import phase_seconds

from ..harness.bench import RowMaker
from ..harness.results import Recorder, ResultRow, table
from ..harness.table import format_table
from .ep_overlap import measure as measure_ep
from .model import prediction_table

BACKENDS = ("auto", "gloo", "nccl")
# Each collective's rungs, the library first (it is every ratio's denominator).
RUNGS = {
    "all_reduce": ("library", "ring", "ring_chunked"),
    "reduce_scatter": ("library", "ring", "ring_chunked"),
    "all_gather": ("library", "ring", "ring_chunked"),
    "all_to_all": ("library", "pairwise", "direct"),
}
GLOO_SIZES = (1 << 12, 1 << 16, 1 << 20)   # gloo ranks: up to 1 MiB per call
MODEL_SIZES = (1 << 20, 1 << 26, 1 << 30)


def bench_rows(world=3, sizes=GLOO_SIZES, collectives=tuple(RUNGS), repeats=3, timeout=300.0):
    """Measured rows with ``ratio_to_library`` (time / the library's time at that size)."""
    unknown = [c for c in collectives if c not in RUNGS]
    if unknown:
        raise ValueError(f"unknown collective(s) {unknown}; known: {', '.join(RUNGS)}")
    pairs = [(c, a) for c in collectives for a in RUNGS[c]]
    rows = measure(pairs, world, sizes, repeats=repeats, timeout=timeout)
    library = {(r["collective"], r["bytes"]): r["seconds"] for r in rows
               if r["algorithm"] == "library"}
    for r in rows:
        r["ms"] = r.pop("seconds") * 1e3
        r["ratio_to_library"] = r["ms"] / 1e3 / library[r["collective"], r["bytes"]]
    return rows


def report(world=3, sizes=GLOO_SIZES, collectives=tuple(RUNGS), repeats=3) -> str:
    rows = bench_rows(world, sizes, collectives, repeats)
    fitted = fit_rows([{**r, "seconds": r["ms"] / 1e3} for r in rows])
    model = [r for r in prediction_table(MODEL_SIZES) if r["collective"] in collectives]
    for r in model:
        r["ms"] = r.pop("seconds") * 1e3
    lines = [
        f"measured: {world} gloo ranks on this machine's CPU (not GPU performance)",
        format_table(rows, ["collective", "algorithm", "bytes", "ms", "ratio_to_library",
                            "backend"]),
        "",
        f"alpha-beta fit of the rungs above (gloo/CPU): alpha = {fitted.alpha * 1e6:.3g} us, "
        f"1/beta = {fitted.bandwidth_gbps:.3g} GB/s, relative rms error {fitted.rel_rms:.2g}",
        "",
        "model: 8 GPUs, datasheet fabric bandwidth, latency not modelled (a lower bound)",
        format_table(model, ["label", "gpu", "collective", "algorithm", "bytes", "ms",
                             "send_gbps"]),
    ]
    return "\n".join(lines)


MIN_GPUS = 2
COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather")
GPU_SIZES = (1 << 20, 1 << 24, 1 << 28)   # 1 MiB .. 256 MiB per call
GOAL = 0.8
EP_GOAL = 1.3
# Per rank: top-8 over 8 experts per GPU, sized so that the all-to-all and the expert
# GEMMs may be of one order on one node; not measured yet: the printed balance says.
EP_SHAPE = dict(tokens=8192, dim=4096, hidden=2048, top_k=8)
EP_CHUNKS = (1, 4)


def bus_gbps(collective: str, world: int, nbytes: int, seconds: float) -> float:
    """nccl-tests' bus bandwidth: the ring's per-rank volume (cost model) over the time."""
    return cost(collective, "ring", world, nbytes).volume / seconds / 1e9


def result_rows(measured: list[dict]) -> list[ResultRow]:
    """Rows of :func:`~kernels.comm.measure.measure` as result rows, the library as ``ref``."""
    library = {(r["collective"], r["bytes"]): r["seconds"] for r in measured
               if r["algorithm"] == "library"}
    rows = []
    for r in measured:
        make, ref_s = RowMaker(r["collective"]), library.get((r["collective"], r["bytes"]))
        rows.append(ResultRow(
            op=r["collective"], rung="ref" if r["algorithm"] == "library" else r["algorithm"],
            name=r["algorithm"], shape=f"{r['world']}x{r['bytes']}", dtype="float32",
            ms=r["seconds"] * 1e3, tflops=0.0,
            gbps=bus_gbps(r["collective"], r["world"], r["bytes"], r["seconds"]),
            ratio_to_ref=None if ref_s is None else ref_s / r["seconds"],
            **make.common))
    return rows


def verdict(rows: list[ResultRow], nbytes: int = GPU_SIZES[-1]) -> list[str]:
    """One line per ring rung at ``nbytes``: its bus bandwidth over the library's, against the goal."""
    lines = []
    for r in rows:
        if r.rung != "ref" and r.shape.endswith(f"x{nbytes}") and r.ratio_to_ref is not None:
            met = "meets" if r.ratio_to_ref >= GOAL else "misses"
            lines.append(f"{r.op} {r.rung} at {nbytes >> 20} MiB: {r.ratio_to_ref:.2f}x the "
                         f"library's bus bandwidth ({met} the {GOAL}x goal)")
    return lines


def ep_rows(measured: list[dict], world: int, shape: dict) -> list[ResultRow]:
    """The EP layer's rows: one chunk is ``ref``, each pipelined chunk count a rung."""
    make = RowMaker("ep_moe")
    base = next(r for r in measured if r["chunks"] == 1)
    ref_s = max(base["seconds_per_rank"])
    rows = []
    for r in measured:
        seconds = max(r["seconds_per_rank"])   # the layer is done when its slowest rank is
        rows.append(ResultRow(
            op="ep_moe", rung="ref" if r["chunks"] == 1 else f"chunks{r['chunks']}",
            name=f"{r['chunks']} chunk{'s' if r['chunks'] > 1 else ''}",
            shape=f"{world}x{shape['tokens']}x{shape['dim']}x{shape['hidden']}x{shape['top_k']}",
            dtype="float32", ms=seconds * 1e3, tflops=0.0, gbps=0.0,
            ratio_to_ref=ref_s / seconds, **make.common))
    return rows


def ep_verdict(rows: list[ResultRow], measured: list[dict]) -> list[str]:
    base = next(r for r in measured if r["chunks"] == 1)
    comm, compute = phase_seconds(base["events"])
    lines = [f"ep_moe unchunked: communication {comm * 1e3:.2f} ms vs compute {compute * 1e3:.2f} ms "
             f"(summed over ranks, {base['clock']} clock; balanced near 1:1)"]
    for r in rows:
        if r.rung != "ref":
            met = "meets" if r.ratio_to_ref >= EP_GOAL else "misses"
            lines.append(f"ep_moe {r.name}: {r.ratio_to_ref:.2f}x the unchunked layer ({met} the "
                         f"{EP_GOAL}x goal)")
    return lines


def run(out=None, sizes=GPU_SIZES, collectives=COLLECTIVES, repeats=20, timeout=900.0,
        ep_shape: dict | None = EP_SHAPE):
    """Time every ring rung and the library, then the EP layer unchunked and pipelined (unless
    ``ep_shape`` is None), on all of this node's GPUs: ``(rows, verdict lines)``, or None
    with fewer than two GPUs."""
    world = torch.cuda.device_count()
    if world < MIN_GPUS:
        return None
    unknown = [c for c in collectives if c not in COLLECTIVES]
    if unknown:
        raise ValueError(f"comm --backend nccl times {', '.join(COLLECTIVES)}; got {unknown}")
    pairs = [(c, a) for c in collectives for a in RUNGS[c]]
    recorder = Recorder(out)
    for row in result_rows(measure(pairs, world, sizes, repeats=repeats, timeout=timeout,
                                   backend="nccl")):
        recorder.add(row)
    lines = verdict(recorder.rows, sizes[-1])
    if ep_shape is not None:
        shape = dict(ep_shape, experts=ep_shape.get("experts", 8 * world))
        measured = measure_ep(world, EP_CHUNKS, backend="nccl", repeats=5, timeout=timeout, **shape)
        rows = ep_rows(measured, world, shape)
        for row in rows:
            recorder.add(row)
        lines += ep_verdict(rows, measured)
    return recorder.rows, lines


def main(backend="auto", out=None, world=3, collectives=None, repeats=None) -> int:
    """The CLI's ``comm``. On gloo: :func:`report` (``out`` is refused: CPU timings are not
    recorded). On NCCL/RCCL: :func:`run`; exit 0 with a message and no file on fewer than two GPUs."""
    if backend not in BACKENDS:
        raise ValueError(f"backend {backend!r}: choose one of {', '.join(BACKENDS)}")
    if backend == "auto":
        backend = "nccl" if torch.cuda.device_count() >= MIN_GPUS else "gloo"
    if backend == "gloo":
        if out:
            raise ValueError("--out records GPU rows; gloo ranks on a CPU are not GPU performance "
                             "and are not recorded (use --backend nccl on 2+ GPUs)")
        print(report(world=world, collectives=collectives or tuple(RUNGS), repeats=repeats or 3))
        return 0
    measured = run(out=out, collectives=collectives or COLLECTIVES, repeats=repeats or 20)
    if measured is None:
        print(f"workbench comm --backend nccl: needs at least {MIN_GPUS} GPUs, this machine has "
              f"{torch.cuda.device_count()}; nothing measured, nothing recorded")
        return 0
    rows, lines = measured
    print(format_table(table(rows, ("op", "rung", "shape", "ms", "gbps", "vs_ref"))))
    print("\n(shape: ranks x bytes, ep_moe: ranks x tokens x dim x hidden x top-k per rank; gbps: bus "
          "bandwidth; vs_ref: the library's (the unchunked layer's) time / the rung's)")
    print("\n".join(lines))
    if out:
        print(f"wrote {out}")
    return 0
