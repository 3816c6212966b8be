"""What the model covers (:data:`COVERED`, :data:`BACKWARD`, :data:`LAUNCHES`) and its one
entry point, :func:`predict`: the op's module for the rung's pass, on a target it knows.

Targets: the AMD ones (:data:`AMD_TARGETS`) and sm_90 (H100, H200, :data:`NVIDIA_TARGETS`),
every table on each: the forward passes, the backward passes and the tuners' per-launch
predictions. On sm_90 each launch is compiled at the settings it launches with on "cuda"
(its tuned prior for that backend, :func:`.gemm.backend_of`) and read from the PTX
(:mod:`.ptx_loop`: ``wgmma``, and ``mma.sync`` where a tile has no warpgroup shape, a decode
GEMM's 16-row tile; the grouped kernels' offsets scan from the PTX line table, :mod:`.tile_schedule`).

Its own module, not the package's ``__init__``, so that the modules which predict through
it (:mod:`.candidates`, :mod:`.learner`, :mod:`.validation`) import it without importing
the package that imports them.
"""
from __future__ import annotations

import torch

import roofline

import kernels

from . import (attention, attention_backward, gemm, gemm_fp8, grouped_gemm, grouped_gemm_backward, grouped_gemm_fp8,
               moe, predict_attention, predict_gemm)
from .prediction import NotCovered, Prediction

AMD_TARGETS = ("gfx942", "gfx950")
NVIDIA_TARGETS = ("sm_90",)
TARGETS = AMD_TARGETS + NVIDIA_TARGETS
COVERED = {"gemm": (predict_gemm.predict, gemm.RUNGS),
           "attention": (predict_attention.predict, attention.RUNGS),
           "grouped_gemm": (grouped_gemm.predict, grouped_gemm.RUNGS),
           "gemm_fp8": (gemm_fp8.predict, gemm_fp8.RUNGS),
           "grouped_gemm_fp8": (grouped_gemm_fp8.predict, grouped_gemm_fp8.RUNGS),
           "moe": (moe.predict, moe.RUNGS)}


def default_dtype(op: str) -> str:
    """The dtype an op is predicted in when the caller names none: bf16 (the training dtype)
    where the op takes it, else "fp8", the only dtype the models of the FP8 ops cover; the
    model's dtype name for the rule :func:`workbench.isa.inspector.default_dtype` applies to a
    rung's torch formats."""
    return "bf16" if torch.bfloat16 in kernels.spec(op).dtypes else "fp8"


BACKWARD = {"attention": (attention_backward.predict, attention_backward.RUNGS),
            "grouped_gemm": (grouped_gemm_backward.predict, grouped_gemm_backward.RUNGS),
            "moe": (moe.predict_backward, moe.RUNGS)}

LAUNCHES = {("grouped_gemm", "v4"): grouped_gemm_backward.launch,   # "forward", "dx", "dw"
            ("moe", "v3"): moe.launch,                              # "gate_up", "down"
            ("attention", "v5"): attention_backward.launch,         # "dkdv", "dq" (the backward)
            ("gemm_fp8", "v1"): gemm_fp8.launch,                    # its binary (kernels.gemm_fp8.configs)
            ("gemm_fp8", "v2"): gemm_fp8.launch}


def rungs(op: str, backward: bool = False) -> tuple[str, ...]:
    """The rungs of ``op`` whose forward (``backward``: backward) pass the model covers (none:
    :class:`NotCovered`)."""
    table = BACKWARD if backward else COVERED
    if op not in table:
        raise NotCovered(f"the model covers the {'backward' if backward else 'forward'} passes of ops "
                         f"{', '.join(table)}, not {op}'s")
    return table[op][1]


def predict(op: str, rung: int | str, shape, dtype=None, gpu: str = "MI300X") -> Prediction:
    """Modelled time of ``op``'s ``rung`` at ``shape`` (the op's shape order) on ``gpu``: its
    forward pass, the pass every rung has; in ``dtype``, by default the op's own
    (:func:`default_dtype`)."""
    return _predict(COVERED, op, rung, shape, dtype, gpu)


def predict_backward(op: str, rung: int | str, shape, dtype=None, gpu: str = "MI300X") -> Prediction:
    """Modelled time of the backward pass of ``op``'s ``rung`` (:data:`BACKWARD`: attention
    v5, grouped GEMM v2 and v4, MoE v3), TFLOP/s on the spec's ``backward_flops``."""
    return _predict(BACKWARD, op, rung, shape, dtype, gpu)


def predict_launch(op: str, rung: int | str, kernel: str, shape, dtype=None, gpu: str = "MI300X") -> Prediction:
    """Modelled time of one launch ``kernel`` of a rung that tunes several (:data:`LAUNCHES`),
    as its tuner names it (:class:`kernels.tuning.Problem`'s ``kernel``)."""
    table = {op_: (lambda label, shape_, dtype_, chip_spec, op_=op_: LAUNCHES[op_, label](label, kernel, shape_, dtype_, chip_spec),
                   tuple(label for o, label in LAUNCHES if o == op_)) for op_, _ in LAUNCHES}
    return _predict(table, op, rung, shape, dtype, gpu)


def _predict(table: dict, op: str, rung, shape, dtype, gpu: str) -> Prediction:
    """``dtype`` None: the op's own (:func:`default_dtype`)."""
    if op not in table:
        raise NotCovered(f"the model covers ops {', '.join(table)}, not {op!r}")
    covered = table[op][1]
    chip_spec = roofline.spec(gpu)
    if chip_spec.target not in TARGETS:
        raise NotCovered(f"the model covers targets {', '.join(TARGETS)}; "
                         f"{chip_spec.name} is {chip_spec.target}")
    label = kernels.get(op, rung).label
    if label not in covered:
        raise NotCovered(f"the model covers {op} rungs {', '.join(covered)}, not {label}")
    return table[op][0](label, shape, roofline.dtype_name(default_dtype(op) if dtype is None else dtype), chip_spec)
