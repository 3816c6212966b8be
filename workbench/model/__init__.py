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
fp32 (:mod:`.grouped_gemm`); FP8 GEMM v1 and v2 (:mod:`.gemm_fp8`); FP8 grouped GEMM v0
(:mod:`.grouped_gemm_fp8`); the MoE layer's v3 (:mod:`.moe`, its launches summed). Through
:func:`predict_backward` (:data:`BACKWARD`): attention v5's backward pass
(:mod:`.attention_backward`), grouped GEMM v2's and v4's (dX and dW,
:mod:`.grouped_gemm_backward`) and MoE v3's. Anything else raises
:class:`NotCovered`, whose message says what is covered.

On sm_90 (H100, H200; :data:`NVIDIA_TARGETS`) the same passes and launches are covered,
forward and backward and the tuners' per-launch predictions, each at the settings it launches
with on "cuda", read from the PTX (:mod:`.ptx_loop`: ``wgmma`` tensor-core cycles from the
datasheet's dense peak at its 1830 MHz tensor clock; ``mma.sync``, which a tile with no
64-row warpgroup shape compiles to (a decode GEMM's 16-row tile), on its warp's sub-partition
at a quarter of that rate: the dense peak, the most it could reach, so such a launch's tensor
time is a floor;
``cp.async`` and shared-memory bytes at 128 B/clk/SM, the softmax's ``ex2`` at the MUFU's
16/clk/SM, FlashAttention-3's figure); a loop that keeps a ``wgmma`` group in flight overlaps
its asynchronous units (:mod:`.combine`); fp32, whose dot compiles to FMAs there, is
NotCovered. Known limits on
sm_90: PTX is counted, not the SASS ``ptxas`` makes; no TMA loop is weighed; the clock is
the datasheet's, not one measured under load (the model sits above cuBLAS's measured GEMM
rates, ``published.yaml``).

The entry point is :mod:`.covered` (re-exported here). Beside the model: :mod:`.rung`, a
rung's prediction against the rung below (the rung pages), and :mod:`.tuning`, the tuners'
ranker (``kernels.tuning`` calls it through a hook and never imports it).

May import: kernels, roofline, workbench.harness, workbench.isa. Never comm, views, train,
learn, widgets.
"""
from __future__ import annotations

from .covered import (AMD_TARGETS, BACKWARD, COVERED, LAUNCHES, NVIDIA_TARGETS, TARGETS, predict, predict_backward,
                      predict_launch, rungs)
from .prediction import NotCovered, Prediction

__all__ = ["AMD_TARGETS", "BACKWARD", "COVERED", "LAUNCHES", "NVIDIA_TARGETS", "NotCovered", "Prediction", "TARGETS", "predict", "predict_backward",
           "predict_launch", "rungs"]
