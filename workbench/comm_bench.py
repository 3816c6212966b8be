"""``workbench comm``: the kernels.comm rungs timed beside the library, the alpha-beta fit
of those timings, and the model's 8-GPU predictions, in one report.

The timings come from gloo ranks on this machine's CPU (``backend: gloo/CPU`` in every
row): they compare the rungs with the library and test the model's shape, and are never
GPU performance. GPU numbers need several GPUs and RCCL/NCCL, which this helper does not
launch. The predictions are arithmetic on datasheet fabrics, labelled ``model``.
"""

from kernels.comm.measure import fit_rows, measure

from .comm_model import prediction_table
from .table import format_table

# Each collective's rungs, the library first (it is every ratio's denominator).
RUNGS = {
    "all_reduce": ("library", "ring", "ring_chunked"),
    "reduce_scatter": ("library", "ring", "ring_chunked"),
    "all_gather": ("library", "ring", "ring_chunked"),
    "all_to_all": ("library", "pairwise", "direct"),
}
SIZES = (1 << 12, 1 << 16, 1 << 20)
MODEL_SIZES = (1 << 20, 1 << 26, 1 << 30)


def bench_rows(world=3, sizes=SIZES, collectives=tuple(RUNGS), repeats=3, timeout=300.0):
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


def report(world=3, sizes=SIZES, collectives=tuple(RUNGS), repeats=3) -> str:
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


