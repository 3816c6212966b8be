"""What a training step costs the host (workbench.train.host_cost): device ops per step, counted
(not timed, so the bounds hold on any CPU under any load), for PyTorch, the workbench kernels and
each FP8 recipe, two blocks deep (one dense, one MoE)."""
from __future__ import annotations

import pytest

from workbench.harness import host_overhead
from workbench.train import host_cost

# Device ops per step (Triton launches + torch ops that run a kernel) at cpu-smoke's widths, two
# blocks. Measured at commit 1df93df, before issue 22's host pass of the FP8 Linear, they were
# tensorwise 801, delayed 1193, rowwise 915, blockwise 516 and mxfp8 700 (the scales made by torch
# ops, zero gradients for the outputs that take none, delayed scaling's bookkeeping in a dozen torch
# ops per tensor). With the fused norm, RoPE, dense SwiGLU and loss (issue 18) each of
# those steps launches 171 fewer: tensorwise 595 -> 424, delayed 705 -> 534, rowwise 559 -> 388,
# blockwise 466 -> 295, mxfp8 670 -> 499. With the norms writing y in the autocast dtype their
# matmuls read (kernels.rms_norm's out_dtype), each step launches 26 fewer (the casts of the
# normed activations to bf16 forward and of their gradients back to fp32 backward):
# tensorwise 398, delayed 508, rowwise 362, blockwise 269, mxfp8 473. With the MoE router's logits
# in float32 under autocast too (kernels.moe.routing.router_logits: no bf16 round trip of its
# operands and their gradients, no cast of its weight for the layer's checks), 9 fewer:
# tensorwise 389, delayed 499, rowwise 353, blockwise 260, mxfp8 464. With the MoE layer's routing
# in two Triton launches forward and one backward (kernels.moe.routing_fused, where route,
# expert_counts and aux_loss were torch ops), 30 fewer: tensorwise 359, delayed 469, rowwise 323,
# blockwise 230, mxfp8 434. With kernels' Linear taking the fp32 master weight into its node and its
# weight-gradient GEMM writing fp32 (kernels.gemm.wgrad), the backward's cast of each weight gradient
# to fp32 is gone: 2 fewer in each FP8 step (the two Linears it keeps, block 0's q and the head):
# tensorwise 357, delayed 467, rowwise 321, blockwise 228, mxfp8 432. The MoE layer's fp32 expert
# weight gradients (kernels.moe.layer_ladder.fused_op) change none of them: Float8MoE keeps the cast
# weights its FP8 experts quantize. With RoPE's tables made once by the model (GPT.rope), 8 fewer in
# every row, PyTorch's included: tensorwise 349, delayed 459, rowwise 313, blockwise 220, mxfp8 424.
# mxfp8 244 once its quantize writes the scales pre-shuffled (the 180 torch ops of the pre-shuffles
# before its Linears' GEMMs gone; kernels.fp8.recipes.mxfp8). With each residual add fused into the
# norm that reads its sum (kernels.add_rms_norm: 4 adds forward, 3 sums of h's two gradients and 4
# casts of the bf16 branch's gradient backward), 11 fewer: tensorwise 338, delayed 448, rowwise 302,
# blockwise 209, mxfp8 233. With tensor's amax pass leaving partial maxima that the cast, or one
# launch of tensor_amax / tensor_scale, reduces (kernels.gemm_fp8.quantize_kernel: 39 torch amaxes
# of the casts, and 9 amaxes and 36 scale_of ops of the MoE's per-tensor operands, for 9 launches),
# tensorwise 263 (186 launches + 152 torch ops -> 195 + 68); delayed 448 still (its 38 current
# amaxes a reducing launch each instead of a torch amax: 252 + 196 -> 290 + 158). With block 1's q, k
# and v and block 0's gate and up each as one FP8 linear (kernels.fp8.side_by_side: x and dy quantized
# once, one GEMM forward and one dgrad; block 0's k and v run apart beside its high-precision q):
# tensorwise 237, rowwise 267, blockwise 192, mxfp8 216 (delayed's layers keep their own histories and
# run apart: 448). With delayed scaling's scale launch reducing the history and the amax pass's partials
# itself, and its record the cast's tile maxima (kernels.fp8.history_ops: no history.amax(), no torch
# amax of the tile maxima, no stack of the amaxes, no launch reducing the partials; 38 + 36 + 13 + 3
# torch ops and 38 launches), and the FP8 grouped GEMM's training op making no zero gradients for its
# outputs that take none (set_materialize_grads(False), as kernels::fp8_linear: 3 zeros a step in every
# FP8 row): delayed 317 (290 + 158 -> 252 + 65), tensorwise 234, rowwise 264, blockwise 189, mxfp8 213
# (these before-and-after numbers measured at commits c50b686 and dc86606). With block 0's k and v
# joined beside its high-precision q (ops.side_by_side groups the projections by class): tensorwise
# 226, rowwise 253, blockwise 184, mxfp8 208 (delayed 317 still).
MAX_FP8_STEP_OPS = {"tensorwise": 226, "delayed": 317, "rowwise": 253, "blockwise": 184, "mxfp8": 208}
MAX_WORKBENCH_STEP_OPS = 143   # the bf16 workbench step's (260 before the norms' out_dtype, 234 before the fp32
#                                router, 225 before the fused routing, 195 before the fp32 weight gradients
#                                of its 12 Linears, 183 before those of its MoE layer's experts, 180 before
#                                the RoPE tables made once, 172 before q, k and v in one GEMM,
#                                158 before gate and up in one, 154 before the residual adds fused
#                                into the norms)
PYTORCH_STEP_OPS = 378         # 426 before its router's logits were float32 under autocast, as the workbench's
#                                are; 420 before the RoPE tables made once, 412 before the one QKV GEMM, 384 before the
#                                dense FFN's one gate-up GEMM


@pytest.fixture(scope="module")
def report():
    return host_cost.run(layers=2, repeats=1)


def _row(report, variant):
    return next(r for r in report["rows"] if r["variant"] == variant)


def test_the_report_names_every_variant_and_says_it_is_no_gpu_number(report):
    assert [r["variant"] for r in report["rows"]] == ["torch", "workbench",
                                                       *(f"workbench fp8 {r}" for r in host_overhead.FP8_RECIPES)]
    assert "never a GPU number" in report["label"] and report["cpu"]
    text = host_cost.table(report)
    assert text.startswith(report["label"]) and "2 blocks" in text and "workbench fp8 rowwise" in text


def test_the_workbench_step_launches_fewer_device_ops_than_pytorchs(report):
    """Its Triton launches replace PyTorch's GEMM, attention and expert ops, and its fused norm,
    RoPE, dense SwiGLU and loss replace 8-16 torch ops each way per call with 1-2 launches, and
    the norms write the bf16 their matmuls read, the MoE routing is 3 launches, and the Linears'
    weight-gradient GEMMs and the MoE experts' dW launches write the fp32 gradients, and q, k and v
    are one GEMM each way, as are the dense FFN's gate and up (on both sides), and each residual
    add is fused into the norm after it: 143 device ops at two blocks (76 launches, 67 torch ops)
    against PyTorch's 378, 0.38x (431 before the fused
    ops: 59 launches standing for 54 torch ops, 5 more than PyTorch's 426 then; 260 before the
    norms' out_dtype; 225 before the fused routing; 195 before the Linears' fp32 weight gradients,
    183 before the experts', 180 before the RoPE tables made once, 172 before the one QKV GEMM,
    158 before the one gate-up GEMM, 154 before the fused residual adds)."""
    torch_row, ours = _row(report, "torch"), _row(report, "workbench")
    assert torch_row["triton_launches"] == 0 and ours["triton_launches"] > 0
    assert ours["torch_ops"] < torch_row["torch_ops"]
    assert ours["device_ops"] == ours["triton_launches"] + ours["torch_ops"] <= MAX_WORKBENCH_STEP_OPS
    assert ours["triton_launches"] == 76
    assert torch_row["device_ops"] == PYTORCH_STEP_OPS and ours["device_ops"] < 0.5 * torch_row["device_ops"]


@pytest.mark.parametrize("recipe", list(MAX_FP8_STEP_OPS))
def test_an_fp8_step_launches_no_more_than_its_bound(report, recipe):
    if recipe not in host_overhead.FP8_RECIPES:
        pytest.skip(f"{recipe}'s kernels are not in this installation")
    row = _row(report, f"workbench fp8 {recipe}")
    assert row["device_ops"] <= MAX_FP8_STEP_OPS[recipe], row


def test_the_residual_adds_fused_into_the_norms_save_11_device_ops_a_step(monkeypatch, report):
    """RMSNorm.add on the workbench side (kernels.add_rms_norm): with the residual add done by torch
    before the norm, as the torch side does it, the step launches 11 more: 4 adds forward; 3 sums of
    h's two gradients (the final norm's h has no other consumer) and 4 casts of the bf16 branches'
    gradients backward."""
    from workbench.train import layers

    def unfused(self, x, branch):
        h = x if branch is None else x + branch
        return h, self(h)

    monkeypatch.setattr(layers.RMSNorm, "add", unfused)
    apart = host_cost.measure_step("workbench", None, layers=2, repeats=1)
    assert apart.device_ops - _row(report, "workbench")["device_ops"] == 11


def test_the_norms_autocast_output_saves_13_device_ops_a_step(monkeypatch, report):
    """The workbench norm's bf16 y under autocast (workbench.train.layers.RMSNorm): with y in x's
    fp32, as before, the step launches 13 more: the QKV GEMM, the gate-up GEMM, the experts and
    the LM head cast it to bf16 again, and their gradients back (12); the float32 router reads it
    either way; and the MoE layer, which returns its input's dtype, returns fp32, so the norm after
    it has no cast of its branch's gradient to save (22 while q, k and v were three GEMMs, 14 while
    gate and up were two, 12 before the residual adds were fused into the norms)."""
    from workbench.train import layers

    monkeypatch.setattr(layers, "region_dtype", lambda device: None)
    fp32_y = host_cost.measure_step("workbench", None, layers=2, repeats=1)
    assert fp32_y.device_ops - _row(report, "workbench")["device_ops"] == 13
