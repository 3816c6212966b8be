"""A performance model of the rungs, read from the code the compiler makes (labelled "model").

    >>> from workbench.model import predict
    >>> p = predict("gemm", "v4", (8192, 8192, 8192), "bf16", "MI300X")   # doctest: +SKIP
    >>> p                                                                  # doctest: +SKIP
    Prediction[model](gemm v4 8192x8192x8192 bf16 on MI300X: ... ms, ... TFLOP/s, ... bound)
    >>> p.breakdown, p.inputs                                              # doctest: +SKIP

The rung is compiled ahead of time for the GPU's target as the JIT compiles it, with the
config the rung picks at that shape (:mod:`.gemm`, :mod:`.attention`); its hot loops are
weighed per wave and iteration (:mod:`.loop`, cycles and rates in ``machine.yaml``);
programs are laid out over the CUs and XCDs with the traffic they cause (:mod:`.tiles`,
:mod:`.attention`); the rule of :mod:`.combine` turns these into a time. Every number
that goes in is listed in ``Prediction.inputs`` with its source; every number that comes
out is a model number.

Covered (:data:`COVERED`), on AMD GPUs of targets gfx942 (MI300X, MI325X) and gfx950
(MI355X): the GEMM rungs with an ahead-of-time compile (v2-v6, and split-K beside v6) in
bf16, fp16 and fp32; the attention forward rungs v2-v4 in bf16 and fp16, causal or not, and v5's forward pass (v3's
launch); grouped GEMM v1, v2 and v4 in bf16, fp16 and
fp32 (:mod:`.grouped_gemm`); FP8 GEMM v1 (:mod:`.gemm_fp8`); FP8 grouped GEMM v0
(:mod:`.grouped_gemm_fp8`); the MoE layer's v3 (:mod:`.moe`, its launches summed). Through
:func:`predict_backward` (:data:`BACKWARD`): attention v5's backward pass
(:mod:`.attention_backward`), grouped GEMM v2's and v4's (dX and dW,
:mod:`.grouped_gemm_backward`) and MoE v3's. Anything else raises
:class:`NotCovered`, whose message says what is covered. sm90 (H100/H200) is not covered:
Triton compiles for it here, but no per-instruction cost of ``wgmma`` issue, its
asynchronous overlap with the softmax and TMA was found with a source this model could
cite, so it is left uncovered rather than guessed.
"""
from __future__ import annotations

import roofline

import kernels

from . import (attention, attention_backward, gemm, gemm_fp8, grouped_gemm, grouped_gemm_backward, grouped_gemm_fp8,
               moe, predict_attention, predict_gemm)
from .prediction import NotCovered, Prediction

__all__ = ["BACKWARD", "COVERED", "LAUNCHES", "NotCovered", "Prediction", "predict", "predict_backward",
           "predict_launch", "rungs"]

TARGETS = ("gfx942", "gfx950")
COVERED = {"gemm": (predict_gemm.predict, gemm.RUNGS),
           "attention": (predict_attention.predict, attention.RUNGS),
           "grouped_gemm": (grouped_gemm.predict, grouped_gemm.RUNGS),
           "gemm_fp8": (gemm_fp8.predict, gemm_fp8.RUNGS),
           "grouped_gemm_fp8": (grouped_gemm_fp8.predict, grouped_gemm_fp8.RUNGS),
           "moe": (moe.predict, moe.RUNGS)}
BACKWARD = {"attention": (attention_backward.predict, attention_backward.RUNGS),
            "grouped_gemm": (grouped_gemm_backward.predict, grouped_gemm_backward.RUNGS),
            "moe": (moe.predict_backward, moe.RUNGS)}

LAUNCHES = {("grouped_gemm", "v4"): grouped_gemm_backward.launch,   # "forward", "dx", "dw"
            ("moe", "v3"): moe.launch,                              # "gate_up", "down"
            ("attention", "v5"): attention_backward.launch}         # "dkdv", "dq" (the backward)


def rungs(op: str) -> tuple[str, ...]:
    """The rungs of ``op`` the model covers (none: :class:`NotCovered`)."""
    if op not in COVERED:
        raise NotCovered(f"the model covers ops {', '.join(COVERED)}, not {op!r}")
    return COVERED[op][1]


def predict(op: str, rung: int | str, shape, dtype="bf16", gpu: str = "MI300X") -> Prediction:
    """Modelled time of ``op``'s ``rung`` at ``shape`` (the op's shape order) on ``gpu``: its
    forward pass, the pass every rung has."""
    return _predict(COVERED, op, rung, shape, dtype, gpu)


def predict_backward(op: str, rung: int | str, shape, dtype="bf16", gpu: str = "MI300X") -> Prediction:
    """Modelled time of the backward pass of ``op``'s ``rung`` (:data:`BACKWARD`: attention
    v5, grouped GEMM v2 and v4, MoE v3), TFLOP/s on the spec's ``backward_flops``."""
    return _predict(BACKWARD, op, rung, shape, dtype, gpu)


def predict_launch(op: str, rung: int | str, kernel: str, shape, dtype="bf16", gpu: str = "MI300X") -> Prediction:
    """Modelled time of one launch ``kernel`` of a rung that tunes several (:data:`LAUNCHES`),
    as its tuner names it (:class:`kernels.tuning.Problem`'s ``kernel``)."""
    table = {op_: (lambda label, shape_, dtype_, chip_spec, fn=fn: fn(label, kernel, shape_, dtype_, chip_spec),
                   (label,)) for (op_, label), fn in LAUNCHES.items() if op_ == op}
    return _predict(table, op, rung, shape, dtype, gpu)


def _predict(table: dict, op: str, rung, shape, dtype, gpu: str) -> Prediction:
    if op not in table:
        raise NotCovered(f"the model covers ops {', '.join(table)}, not {op!r}")
    covered = table[op][1]
    chip_spec = roofline.spec(gpu)
    if chip_spec.target not in TARGETS:
        raise NotCovered(f"the model covers AMD targets {', '.join(TARGETS)}; "
                         f"{chip_spec.name} is {chip_spec.target}")
    label = kernels.get(op, rung).label
    if label not in covered:
        raise NotCovered(f"the model covers {op} rungs {', '.join(covered)}, not {label}")
    return table[op][0](label, shape, roofline.dtype_name(dtype), chip_spec)
