"""What one training step costs the host: Python time and device ops, counted on the CPU.

A step is host-bound on a GPU when its Python and its launches take longer than its kernels:
the GPU then idles between launches, and a faster kernel gains nothing. Each op's host time is
in the host-overhead benchmark (:mod:`workbench.harness.host_overhead`); this is the same
measurement for a whole step, which is what issue 18's goal (the step >= 1.1x eager PyTorch)
and issue 22's (the FP8 step >= 1.3x the bf16 one) are about. The FP8 step is the most at
risk: every FP8 Linear quantizes its operands in launches the bf16 step does not make.

One step here is a forward and backward of the training model (:class:`~.model.GPT`) under
the training step's autocast, as :func:`.tuning_pass.forward_backward` runs it (no optimizer
step, which is the same for every variant), with Triton's launches stubbed
(:func:`workbench.harness.device_ops.stubbed_launches`). Per variant (PyTorch, the workbench
kernels, and the workbench kernels under each FP8 recipe, :func:`kernels.fp8.convert` as
``workbench train --fp8`` applies it) it reports:

- the thread CPU time of a step (median of several, :func:`workbench.harness.host_overhead.per_call_us`): PyTorch's ops still run their (tiny)
  CPU kernels, ours are stubbed, so PyTorch's time is an upper bound on its host cost, as in
  the op benchmark;
- the device ops a GPU would launch (:func:`workbench.harness.device_ops.device_ops`: Triton
  launches, and torch ops that run a kernel), a count that does not depend on the CPU.

The model is ``cpu-smoke``'s widths, ``layers`` blocks deep (block 0 dense, the rest MoE, as
in the GPU presets). Never a GPU number: the label says so.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from ..harness import device_ops, environment, host_overhead
from ..harness.table import format_table
from . import data, ops
from .presets import preset as _preset
from .tuning_pass import build, forward_backward

LABEL = "training step host cost, launches stubbed (CPU; never a GPU number)"


@dataclass(frozen=True)
class StepCost:
    """One variant's step: thread CPU ms (launches stubbed) and the device ops it launches."""

    variant: str
    host_ms: float
    triton_launches: int
    torch_ops: int
    device_ops: int   # the two together


def variants(recipes: tuple[str, ...] | None = None) -> list[tuple[str, str | None]]:
    """(kernels, FP8 recipe) per variant: PyTorch, the workbench kernels, and those under each
    FP8 recipe (default every one whose kernels this installation has, as the op benchmark's)."""
    if recipes is None:
        recipes = host_overhead.FP8_RECIPES
    return [("torch", None), ("workbench", None), *(("workbench", r) for r in recipes)]


def measure_step(kernels: str, fp8: str | None, preset: str = "cpu-smoke", layers: int = 4,
                 repeats: int = 5) -> StepCost:
    """One variant's :class:`StepCost` on ``preset`` cut to ``layers`` blocks (its first dense)."""
    cfg = dataclasses.replace(_preset(preset), layers=layers)
    device, dtype = torch.device("cpu"), torch.bfloat16
    model = build(cfg, ops.resolve(kernels), 0, device, 1, None, fp8)
    tokens, targets = data.batch(cfg, 0, 0, 0, 1, device)

    def step():
        model.zero_grad(set_to_none=True)
        forward_backward(model, tokens, targets, device, dtype)

    seen = device_ops.device_ops(step)   # its warm-up step builds the plans and first-call caches
    with device_ops.stubbed_launches():
        host_ms = host_overhead.per_call_us(step, 1, repeats) / 1e3
    label = kernels if fp8 is None else f"{kernels} fp8 {fp8}"
    return StepCost(label, host_ms, seen.triton, sum(seen.torch_ops.values()), seen.total)


def run(recipes: tuple[str, ...] | None = None, preset: str = "cpu-smoke", layers: int = 4,
        repeats: int = 5) -> dict:
    """Every variant measured on one thread; the report as one JSON-ready dict."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        rows = [dataclasses.asdict(measure_step(kernels, fp8, preset, layers, repeats))
                for kernels, fp8 in variants(recipes)]
    finally:
        torch.set_num_threads(threads)
    env = environment.describe()
    return {"label": LABEL, "cpu": host_overhead.cpu_name(), "backend": env["backend"], "torch": env["torch"],
            "commit": env["commit"], "date": environment.now(), "preset": preset, "layers": layers,
            "repeats": repeats, "rows": rows}


def table(report: dict) -> str:
    """The report under its label: per variant, ms per step and device ops, each against the
    PyTorch step's."""
    torch_row = next(r for r in report["rows"] if r["variant"] == "torch")
    rows = [{"variant": r["variant"], "host ms": r["host_ms"], "x torch": r["host_ms"] / torch_row["host_ms"],
             "triton launches": r["triton_launches"], "torch ops": r["torch_ops"], "device ops": r["device_ops"],
             "ops x torch": r["device_ops"] / torch_row["device_ops"]} for r in report["rows"]]
    head = (f"{report['label']} ({report['cpu']}, backend {report['backend']}, torch {report['torch']}; "
            f"{report['preset']} widths, {report['layers']} blocks, forward+backward under autocast, "
            f"median of {report['repeats']} steps)")
    return f"{head}\n{format_table(rows)}"
