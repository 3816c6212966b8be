"""Rows of the ladder profiler, from result rows of one run: no widgets, easy to test.

Every measured number here comes from a :class:`workbench.results.ResultRow`, measured
now or recorded on a real GPU earlier; speedups are taken between rows of the *same* run
(same GPU, same timestamp), because times from different runs are not comparable, and
between predictions (:mod:`.model_rows`) only when no run has numbers. Error
rows (a case that failed on the GPU) have no numbers: they are never drawn or compared,
only named in the notes. Model numbers (ridge, attainable TFLOP/s) come from the GPU's
datasheet and say "model".
"""
from __future__ import annotations

import roofline

from ..harness.results import ResultRow


def gpu_matches(gpu: roofline.GpuSpec, device_name: str) -> bool:
    """Whether a device name ("AMD Instinct MI300X VF") is the GPU of this spec
    (:func:`roofline.device_spec`)."""
    try:
        return roofline.device_spec(device_name).name == gpu.name
    except KeyError:
        return False


def latest_run(rows: list[ResultRow], gpu: roofline.GpuSpec, op: str, shape: str,
               dtype: str, pass_name: str = "forward") -> list[ResultRow]:
    """The rows of the newest run of (op, shape, dtype) on ``gpu`` timing ``pass_name`` (the
    forward: the model and roof are the forward's); [] when there is none."""
    found = [r for r in rows if (r.op, r.shape, r.dtype, r.pass_name) == (op, shape, dtype, pass_name)
             and gpu_matches(gpu, r.gpu)]
    newest = max((r.timestamp for r in found), default=None)
    return [r for r in found if r.timestamp == newest]


def performance(run: list[ResultRow], labels: list[str], gpu: roofline.GpuSpec, intensity: float,
                source: str) -> dict[str, dict]:
    """Per rung label: the cells of :func:`ladder_cells` from the run's rows; error rows give none."""
    return ladder_cells({r.rung: dict(ms=r.ms, tflops=r.tflops, gbps=r.gbps, dtype=r.dtype, gpu=r.gpu,
                                      date=r.timestamp[:10]) for r in run if r.ok},
                        labels, gpu, intensity, source)


def ladder_cells(numbers: dict[str, dict], labels: list[str], gpu: roofline.GpuSpec, intensity: float,
                 source: str) -> dict[str, dict]:
    """Per rung label: ms, TFLOP/s, GB/s, % of roof, speedup vs previous rung and vs ref.

    ``numbers`` maps a label to its ms, tflops, gbps, dtype, gpu and date, all from one
    source (one run, or the model), since ratios across sources mean nothing. ``labels``
    is the ladder order; the previous rung is the nearest earlier numbered rung of
    ``labels`` that has numbers. ``ref`` is compared with nobody but itself.
    """
    ref = numbers.get("ref")
    cells, previous = {}, None
    for label in labels:
        row = numbers.get(label)
        if row is None:
            continue
        cells[label] = dict(
            ms=row["ms"], tflops=row["tflops"], gbps=row["gbps"],
            pct_of_roof=roofline.percent_of_roof(gpu, intensity, row["dtype"], row["tflops"]),
            vs_prev=previous["ms"] / row["ms"] if previous and label != "ref" else None,
            vs_ref=ref["ms"] / row["ms"] if ref else None,
            source=source, gpu=row["gpu"], date=row["date"])
        if label != "ref":
            previous = row
    return cells


def model_summary(gpu: roofline.GpuSpec, flops: float, bytes_moved: float, dtype: str) -> dict:
    """What the roofline model says about this op, shape and dtype on ``gpu`` (HBM roof)."""
    intensity = flops / bytes_moved
    return dict(gpu=gpu.name, dtype=roofline.dtype_name(dtype),
                intensity=intensity, ridge=gpu.ridge(dtype),
                attainable_tflops=roofline.attainable(gpu, intensity, dtype),
                bound=roofline.bound(gpu, intensity, dtype), source="model")


def model_point(model: dict, op: str, shape: str) -> roofline.Point:
    """The attainable TFLOP/s at the op's intensity, drawn as a "model" point."""
    return roofline.Point(rung="attainable (model)", op=op, shape=shape, dtype=model["dtype"],
                          intensity=model["intensity"], tflops=model["attainable_tflops"],
                          ms=None, source="model", gpu=model["gpu"])


def ladder_chart_rows(run: list[ResultRow], labels: list[str], source: str) -> list[dict]:
    """Rows in the form ``roofline.ladder_chart`` reads."""
    return [dict(op=r.op, rung=r.rung, shape=r.shape, dtype=r.dtype, tflops=r.tflops, ms=r.ms,
                 source=source, gpu=r.gpu) for r in run if r.rung in labels and r.ok]


def error_notes(run: list[ResultRow]) -> list[str]:
    """One note per error row of the run: which rung failed on which GPU, and why."""
    return [f"{r.rung} has no numbers: it failed on {r.gpu} ({r.timestamp[:10]}): {r.error}"
            for r in run if not r.ok]


def elsewhere(rows: list[ResultRow], op: str) -> list[str]:
    """Which (GPU, shape, dtype, date) have recorded rows for ``op``: where to look instead."""
    return sorted({f"{r.gpu} {r.shape} {r.dtype} ({r.timestamp[:10]})" for r in rows if r.op == op})
