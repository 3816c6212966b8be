"""The grouped GEMM's backward (:mod:`kernels.moe.grouped_gemm.grads`): the dX launch, then
the dW launch, for the rungs whose ``aot`` compiles both (v2 and v4).

* dX = dy · wᵀ per group: the rung's forward kernel on wᵀ (a stride view: the weight is
  K-contiguous, the layout of the rung's "dx" compile), a grouped launch of the shape
  (T, N, K, G): :func:`.grouped_gemm.tile_prediction` with that compile. v4 takes its
  untimed prior for that problem, as its tuner's first choice.
* dW[g] = x_gᵀ · dy_g: :mod:`kernels.moe.grouped_gemm.dw`'s kernel, one program per
  (K tile, N tile, group), K tile fastest, each reducing over its group's rows: programs
  of a large group walk more iterations than those of a small one, so they are dealt to
  the CUs as they free up (:mod:`.uneven`), an empty group's programs storing zeros.
  Traffic: L2, every program's x and dy row panels and its dW tile; HBM, x and dy once
  (their panels taken to stay cached between the programs that share them) and dW.

The pass is the sum of the two (:mod:`.passes`), on the spec's ``backward_flops``. Each
launch at its settings on the target's backend (:func:`.grouped_gemm.config`), its hot
loop read in the target's dialect (:func:`.predict_gemm.matrix_loop`: AMDGCN, or PTX on sm_90).
"""
from __future__ import annotations

import torch

from kernels.moe.grouped_gemm import spec

from . import chip as chip_model
from . import gemm, grouped_gemm, passes, predict_gemm, uneven
from .prediction import NotCovered, Prediction

RUNGS = ("v2", "v4")


def dw_launch(label: str, shape: tuple, sizes: list[int], torch_dtype: torch.dtype, dtype: str,
              chip_spec) -> Prediction:
    """The dW launch of rung ``label`` for the forward problem ``shape`` (T, K, N, G, ...) with
    groups of ``sizes`` rows."""
    t, k, n, g = shape[:4]
    cfg, report = grouped_gemm.compiled(label, "dw", shape, torch_dtype, chip_spec.target,
                                       chip_spec.compute_units)
    # the hot loop as the ISA inspector finds it: a compile that splits the reduction into
    # several MFMA loops (large tiles on gfx942) is weighed by that one for every iteration
    mix = predict_gemm.matrix_loop(report, "grouped_gemm", f"{label} dW", dtype, chip_spec)
    steps = gemm.steps_per_iteration(cfg, report.options["num_warps"], mix.mfma_flops)
    chip, clock_input = chip_model.chip(chip_spec, dtype)
    elem = torch_dtype.itemsize
    tiles_k, tiles_n = -(-k // cfg["BLOCK_M"]), -(-n // cfg["BLOCK_N"])
    per_program = [(gemm.trips(rows, cfg, steps),) for rows in sizes for _ in range(tiles_k * tiles_n)]
    launch = uneven.run(report, [mix], per_program, 1, cfg["BLOCK_M"] * cfg["BLOCK_N"] * elem, chip)
    out = g * k * n * elem
    traffic = {"l2": sum(r * (tiles_n * k + tiles_k * n) for r in sizes) * elem
               + out, "hbm": (t * k + t * n) * elem + out}
    seconds, bound, breakdown = uneven.with_memory(launch, traffic, chip)
    inputs = {**chip_model.spec_inputs(chip_spec), "engine clock under MFMA load (MHz)": clock_input,
              **chip_model.loop_inputs([mix], chip_spec.target),
              "config": (cfg, f"grouped_gemm {label}'s dW settings" + (" (v4's untimed prior)" if label == "v4" else "")),
              "compiled kernel": (f"{report.kernel_name} @ {report.target}", "ahead-of-time compile (workbench.isa)"),
              "compile options": chip_model.compile_options(report),
              "hot loop per wave and iteration": (chip_model.mix_summary(mix), "the compiled hot loop"),
              "K steps per iteration": (steps, "the compiled hot loop"),
              "occupancy": (str(report.occupancy), "workbench.isa.occupancy"),
              "dispatch": ("K tile fastest, then N tile, then group; each program to the first free slot",
                           "assumption")}
    return Prediction("grouped_gemm", label, tuple(shape), dtype, chip_spec.name, seconds,
                      2.0 * t * k * n / seconds / 1e12, bound, breakdown, inputs)


def dx_launch(label: str, shape: tuple, sizes: list[int], torch_dtype: torch.dtype, dtype: str,
              chip_spec) -> Prediction:
    """The dX launch of rung ``label`` for the forward problem ``shape`` (T, K, N, G, ...)."""
    t, k, n, g = shape[:4]
    swapped = (t, n, k, g, *shape[4:])
    cfg, report = grouped_gemm.compiled(label, "dx", swapped, torch_dtype, chip_spec.target,
                                       chip_spec.compute_units)
    return grouped_gemm.tile_prediction(
        "grouped_gemm", label, swapped, sizes, cfg, report, dtype, chip_spec, torch_dtype.itemsize,
        torch_dtype.itemsize, 2.0 * t * k * n, f"grouped_gemm {label}'s dX settings"
        + (" (v4's untimed prior)" if label == "v4" else ""))


def launch(label: str, kernel: str, shape, dtype: str, chip_spec) -> Prediction:
    """One tuned launch of v4 as its tuner names it (:func:`kernels.moe.grouped_gemm.v4_persistent.choose`):
    "forward" and "dw" at the forward problem ``shape``, "dx" at the dX launch's own (T, K, N, G,
    routing): the reduction over the forward's N."""
    shape = grouped_gemm.check(shape)
    torch_dtype = predict_gemm.check_dtype(dtype, "grouped GEMM")
    sizes = grouped_gemm.group_rows(shape)
    if kernel == "forward":
        return grouped_gemm.predict(label, shape, dtype, chip_spec)
    if kernel == "dx":
        t, k, n, g, routing = shape
        return dx_launch(label, (t, n, k, g, routing), sizes, torch_dtype, dtype, chip_spec)
    if kernel == "dw":
        return dw_launch(label, shape, sizes, torch_dtype, dtype, chip_spec)
    raise NotCovered(f"grouped_gemm {label} launches forward, dx and dw, not {kernel!r}")


def predict(label: str, shape, dtype: str, chip_spec) -> Prediction:
    """The backward pass of grouped GEMM rung ``label`` at ``shape`` (T, K, N, G, routing)."""
    shape = grouped_gemm.check(shape)
    torch_dtype = predict_gemm.check_dtype(dtype, "grouped GEMM")
    if label not in RUNGS:
        raise NotCovered(f"the model covers the grouped_gemm backward of {', '.join(RUNGS)}, not {label}")
    sizes = grouped_gemm.group_rows(shape)
    launches = {"dX": dx_launch(label, shape, sizes, torch_dtype, dtype, chip_spec),
                "dW": dw_launch(label, shape, sizes, torch_dtype, dtype, chip_spec)}
    inputs = {"pass": ("backward: the dX launch, then the dW launch", "kernels.moe.grouped_gemm.grads"),
              "rows per group": (sizes, f"routing {spec.ROUTINGS[shape[4]]!r}, one seed-0 draw (model input)")}
    return passes.total("grouped_gemm", label, shape, dtype, chip_spec.name, launches, {},
                        spec.backward_flops(shape), inputs)
