"""Tables of the training comparison, from ``workbench.train`` rows: no widgets, easy to test.

Two kernel sets trained with the same seed see the same batches and the same initial
weights, so their losses should agree step by step: that parity is what a CPU run
teaches. Times are another matter. A row's ``backend`` says where it ran, and only rows
from a GPU backend yield step times, tokens/s, TFLOP/s, MFU or a per-op breakdown here;
interpreter rows give the loss and the names of the ops that ran, never a time.
Recorded rows (``workbench/recorded/train/*.json``, saved by ``workbench train --out``
on a GPU) are shown with the GPU and date they came from.
"""
from __future__ import annotations

import statistics
import warnings
from importlib import resources
from pathlib import Path

from ..train import ops, store

SUMMARY = ["set", "kernels", "steps", "first_loss", "last_loss", "step_ms", "tokens_per_s",
           "tflops", "mfu", "peak_mem_gib", "source", "gpu", "date"]
RECORDED = ["gpu", "date", "preset", "kernels", "world_size", "steps", "last_loss", "step_ms",
            "tokens_per_s", "tflops", "mfu", "peak_mem_gib", "file"]
TIMES = ("step_ms", "tokens_per_s", "tflops", "mfu")
GPU_ONLY = (*TIMES, "peak_mem_gib")


def _recorded_dir():
    return resources.files("workbench") / "recorded" / "train"


def recorded_rows() -> dict[str, list[dict]]:
    """Shipped training rows from GPUs, by file name ({} when none are recorded); a file
    that does not load is skipped with a warning naming it, so it hides no other file."""
    folder, shipped = _recorded_dir(), {}
    if not folder.is_dir():
        return shipped
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".json"):
            try:
                shipped[entry.name] = store.load(Path(str(entry)))
            except (ValueError, OSError) as exc:
                warnings.warn(f"skipped a shipped training-rows file that does not load: {exc}",
                              stacklevel=2)
    return shipped


def is_gpu(rows: list[dict]) -> bool:
    """Whether every row ran on a GPU backend, so that its times are performance."""
    return bool(rows) and all(r["backend"] in ("hip", "cuda") for r in rows)


def steady(rows: list[dict]) -> list[dict]:
    """The steps after the first: step 1 also pays for autotuning, compilation and allocation."""
    return rows[1:] if len(rows) > 1 else rows


def _median(rows: list[dict], key: str):
    values = [r[key] for r in steady(rows) if r[key] is not None]
    return statistics.median(values) if values else None


def summary_columns(source: str) -> list[str]:
    """The :data:`SUMMARY` columns a result from ``source`` fills: times only when "measured"."""
    return [c for c in SUMMARY if source == "measured" or c not in GPU_ONLY]


def _peak(rows: list[dict]):
    """The highest GPU memory high-water mark of the steps (None off a GPU)."""
    return max((r["peak_mem_gib"] for r in rows if r["peak_mem_gib"] is not None), default=None)


def summary(label: str, rows: list[dict]) -> dict:
    """One table row for a kernel set: its losses, and its medians where the rows are from a GPU."""
    gpu = is_gpu(rows)
    times = {k: _median(rows, k) if gpu else None for k in TIMES}
    return dict(set=label, kernels=ops.wrappable(rows[0]["kernels"]), steps=len(rows), first_loss=rows[0]["loss"],
                last_loss=rows[-1]["loss"], **times, peak_mem_gib=_peak(rows),
                source="measured" if gpu else f"{rows[0]['backend']} (losses only)",
                gpu=rows[0]["gpu"], date=rows[-1]["timestamp"][:10])


def loss_parity(a: list[dict], b: list[dict]) -> float:
    """max over the common steps of |loss_A - loss_B|."""
    return max(abs(x["loss"] - y["loss"]) for x, y in zip(a, b))


def op_times(rows: list[dict]) -> dict[str, float]:
    """Median ms per profiled op over the steady steps (an op missing from a step's top list
    counts as absent there, not as zero)."""
    steps = [r["op_ms"] for r in steady(rows) if r["op_ms"]]
    names = {name for ops in steps for name in ops}
    return {name: statistics.median(ops[name] for ops in steps if name in ops) for name in names}


def breakdown(runs: dict[str, list[dict]]) -> list[dict]:
    """Per-op ms of GPU runs side by side, one column per run, busiest op first."""
    times = {label: op_times(rows) for label, rows in runs.items() if is_gpu(rows)}
    names = sorted({n for ops in times.values() for n in ops},
                   key=lambda n: -max(ops.get(n, 0.0) for ops in times.values()))
    return [dict(op=name, **{label: ops.get(name) for label, ops in times.items()}) for name in names]


def ops_that_ran(runs: dict[str, list[dict]]) -> list[dict]:
    """The profiled ops of each run by name only, busiest first: which kernels the switch chose.

    For interpreter runs, whose times are not shown: the names alone show ``kernels::matmul``
    and ``kernels::flash_attention_bwd`` where PyTorch's set has SDPA.
    """
    times = {label: op_times(rows) for label, rows in runs.items()}
    ranked = {label: sorted(ops, key=ops.get, reverse=True) for label, ops in times.items()}
    depth = max((len(names) for names in ranked.values()), default=0)
    return [dict(rank=i + 1, **{label: names[i] if i < len(names) else None
                                for label, names in ranked.items()}) for i in range(depth)]


def recorded_runs(recorded: dict[str, list[dict]]) -> dict[str, list[dict]]:
    """GPU rows of the recorded files grouped into runs (file, GPU, preset, kernel set,
    compile, world size), each named "GPU · preset · kernels · date", steps in order."""
    runs: dict[tuple, list[dict]] = {}
    for name, rows in recorded.items():
        for row in rows:
            if is_gpu([row]):
                runs.setdefault((name, row["gpu"], row["preset"], row["kernels"], row["compile"],
                                 row["world_size"]), []).append(row)
    named = {}
    for (_, gpu, preset, kernels, compiled, world), rows in runs.items():
        date = max(r["timestamp"] for r in rows)[:10]
        extra = (" · compiled" if compiled else "") + (f" · {world} GPUs" if world > 1 else "")
        named[f"{gpu} · {preset} · {kernels}{extra} · {date}"] = sorted(rows, key=lambda r: r["step"])
    return named


def recorded_summary(recorded: dict[str, list[dict]]) -> list[dict]:
    """One row per recorded run with its medians (:func:`recorded_runs`), newest first."""
    files = {id(row): name for name, rows in recorded.items() for row in rows}
    table = [dict(gpu=rows[0]["gpu"], date=max(r["timestamp"] for r in rows)[:10],
                  preset=rows[0]["preset"], kernels=rows[0]["kernels"],
                  world_size=rows[0]["world_size"], steps=len(rows), last_loss=rows[-1]["loss"],
                  **{k: _median(rows, k) for k in TIMES},
                  peak_mem_gib=_peak(rows),
                  file=files[id(rows[0])])
             for rows in recorded_runs(recorded).values()]
    return sorted(table, key=lambda r: r["date"], reverse=True)
