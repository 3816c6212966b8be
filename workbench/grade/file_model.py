"""The performance model's prediction for the graded file's own kernels (labelled model),
shown beside the ladder's rungs.

Two ways in, both through the model's own code:

* a file graded as an exercise (``--exercise gemm/v3``) is a copy of a rung, so
  :func:`workbench.model.learner.predict_file` predicts it as an exercise's verdict does:
  the rung's config and tile order, the file's compiled hot loop, registers and occupancy;
* any other GEMM file that launches one Triton kernel computing a ``BLOCK_M`` x
  ``BLOCK_N`` tile of C per program on the 2-D grid (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N)):
  the launch the model weighs for the GEMM rungs (:func:`workbench.model.predict_gemm.tile_launch`)
  with the file's kernel as compiled for the GPU's target and the tile and warps its host
  code picked (recorded at the shape), programs dispatched x-fastest with ``program_id(0)``
  over tile rows, as gemm v2's (an assumption the prediction's inputs list).

Any other file is said not modelled, in one line with the reason (the kernel shape the
model does not cover), not guessed.
"""
from __future__ import annotations

import dataclasses

import roofline
import torch

from ..isa import normalize_target
from ..model import NotCovered

NOT_A_TILE = ("the model weighs a file's own kernels for gemm only: one Triton kernel, one "
              "BLOCK_M x BLOCK_N tile of C per program on a 2-D grid")


def predictions(op: str, file: str, launches: dict, compiled: dict, gpus, exercise: str | None = None):
    """(rows for the file's kernels, one labelled model per GPU; a line saying why not, or None).
    ``compiled``: {target: [IsaReport]} of the file's kernels (the machine code part)."""
    dtype = getattr(torch, launches["dtype"].removeprefix("torch."))
    shape = tuple(launches["shape"])
    rows, why = [], {}
    for gpu in gpus:
        try:
            found = _predict(op, file, launches["records"], compiled, shape, dtype, roofline.spec(gpu), exercise)
            rows.append(dataclasses.replace(found, rung="yours").row())
        except (NotImplementedError, ValueError, RuntimeError) as error:
            why.setdefault(str(error).splitlines()[0], []).append(gpu)
    note = "; ".join(f"yours on {', '.join(g)}: not modelled: {reason}" for reason, g in why.items()) or None
    return rows, note


def _predict(op, file, records, compiled, shape, dtype, chip_spec, exercise):
    from .. import model
    from ..model.learner import predict_file

    if exercise is not None:
        from .exercise_rules import exercise as find

        rung = find(exercise).rung
        if rung not in model.rungs(op):
            raise NotCovered(f"the model covers {op} rungs {', '.join(model.rungs(op))}, not exercise {exercise}'s {rung}")
        return predict_file(op, rung, file, shape, roofline.dtype_name(dtype), chip_spec.name)
    return _tile_kernel(op, records, compiled, shape, dtype, chip_spec)


def _tile_kernel(op, records, compiled, shape, dtype, chip_spec):
    from kernels.gemm import spec as gemm_spec

    from .. import model
    from ..model import gemm, predict_gemm, tiles

    if op != "gemm" or len(records) != 1:
        launched = f"{len(records)} Triton kernels" if op == "gemm" else f"graded as {op}"
        raise NotCovered(f"{NOT_A_TILE} (this file: {launched})")
    record = records[0]
    block = {k: record["constexprs"].get(k) for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K")}
    if None in block.values():
        raise NotCovered(f"{NOT_A_TILE}: {record['qualname']} has no {', '.join(k for k, v in block.items() if v is None)} "
                         f"constexpr to read the tile from")
    m, n, k = shape
    tiles_grid = (-(-m // block["BLOCK_M"]), -(-n // block["BLOCK_N"]), 1)
    if record.get("grid") != tiles_grid:
        raise NotCovered(f"{NOT_A_TILE}: {record['qualname']}'s grid {record.get('grid')} is not "
                         f"(cdiv(M, BLOCK_M), cdiv(N, BLOCK_N)) = {tiles_grid[:2]}")
    if chip_spec.target not in model.TARGETS:
        raise NotCovered(f"the model covers targets {', '.join(model.TARGETS)}; {chip_spec.name} is {chip_spec.target}")
    reports = [r for r in compiled.get(normalize_target(chip_spec.target), []) if r.kernel_name == record["qualname"]]
    if not reports:
        raise NotCovered(f"{record['qualname']} was not compiled for {chip_spec.target} (the model reads the compiled loop)")
    report = reports[0]
    dtype_name = roofline.dtype_name(dtype)
    predict_gemm.check_dtype(dtype_name, "GEMM")
    cfg = {**block, "num_warps": report.options["num_warps"]}
    plan = gemm.GemmPlan("v2", cfg, {}, None)
    elem = dtype.itemsize
    return predict_gemm.tile_launch(
        "gemm", "yours", shape, dtype_name, chip_spec, report, cfg, None, elem,
        lambda slots, xcds: plan.waves(shape, slots, xcds),
        lambda wave, xcds: tiles.traffic(wave, shape, (cfg["BLOCK_M"], cfg["BLOCK_N"]), elem, xcds),
        gemm_spec.flops(shape), "your launch, recorded at this shape",
        **{"tile order": ("2-D grid, program_id(0) over tile rows, dispatched x-fastest (as gemm v2's)",
                          "assumption")})
