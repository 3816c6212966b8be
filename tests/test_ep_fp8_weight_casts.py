"""The expert-parallel FP8 owner casts each weight once per forward, not once per chunk: the first
chunk's cast is read by the later chunks, and under rowwise, tensorwise and delayed it comes with the
weight's dgrad operand from one fused quantization, which the backward takes instead of casting the
weight again. Bit for
bit the results of an owner that casts every weight in every chunk and in the backward. One
in-process gloo rank."""
from __future__ import annotations

import pytest
import torch

import kernels
from kernels.moe import ep_fp8_layer, ep_layer
from kernels.moe.ep_fp8_layer import Float8ExpertParallelMoE
from kernels.moe.fp8_layer import Float8MoE
from kernels.moe.grouped_gemm_fp8 import quantize
from kernels.outputs import poisoned_outputs

FP8, GRAD = torch.float8_e4m3fn, torch.float8_e5m2
DIM, HIDDEN, EXPERTS, TOP_K, TOKENS = 16, 32, 4, 3, 9   # 27 rows over 3 chunks
CASES = [("rowwise", False), ("rowwise", True), ("tensorwise", False), ("delayed", False), ("blockwise", False),
         ("blockwise", True)]
"""(recipe, FP8 dispatch): the recipes whose owner keeps its weight casts (not mxfp8, whose GEMM
quantizes its weight itself)."""


def _layer(group, recipe: str, dispatch: bool) -> Float8ExpertParallelMoE:
    torch.manual_seed(0)
    ep = kernels.MoE.from_full(kernels.MoE(DIM, HIDDEN, EXPERTS, TOP_K).bfloat16(), group, ep_chunks=3)
    layer = Float8ExpertParallelMoE.from_ep(ep, recipe, FP8, GRAD)
    layer.fp8_dispatch = dispatch
    return layer


def _step(layer) -> list[torch.Tensor]:
    """The output, x's gradient and every parameter's, of one forward and backward."""
    x = torch.randn(TOKENS, DIM, generator=torch.Generator().manual_seed(1)).bfloat16().requires_grad_()
    with poisoned_outputs():
        out = layer(x)
        out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(2)).bfloat16())
    return [out, x.grad, *(p.grad for p in layer.parameters())]


def _count(monkeypatch, module, name: str) -> list:
    calls, real = [], getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a, **k: calls.append(a) or real(*a, **k))
    return calls


@pytest.mark.parametrize("recipe, dispatch", CASES)
def test_each_weight_is_cast_once_a_step_and_the_results_are_a_per_chunk_casts_bits(one_rank, monkeypatch,
                                                                                    recipe, dispatch):
    kept = _step(_layer(one_rank, recipe, dispatch))
    with monkeypatch.context() as patch:   # today's owner: every chunk casts every weight, the backward too
        patch.setattr(ep_fp8_layer._Float8Owner, "_weight", lambda self, name, w, save: quantize.forward_weight(
            w, recipe, FP8, self.weight_scales[name])[:2])
        recast = _step(_layer(one_rank, recipe, dispatch))
    assert all(torch.equal(a, b) for a, b in zip(kept, recast, strict=True))

    forward, fused = _count(monkeypatch, ep_fp8_layer, "forward_weight"), _count(monkeypatch, ep_fp8_layer,
                                                                                  "weight_operands")
    dgrad = _count(monkeypatch, quantize, "dgrad_weight")
    layer = _layer(one_rank, recipe, dispatch)
    owners = _count(monkeypatch, ep_fp8_layer._Float8Owner, "backward")
    _step(layer)
    shared = recipe in quantize.SHARED_WEIGHTS
    assert (len(forward), len(fused), len(dgrad)) == ((0, 3, 0) if shared else (3, 0, 3))
    (owner, *_), = owners
    assert owner.forward_weights == {}   # dropped after the last chunk
    assert sorted(owner.dgrad_weights) == (["down", "gate", "up"] if shared else [])


def test_a_forward_without_gradients_makes_no_dgrad_operand_and_saves_no_activations(one_rank, monkeypatch):
    """Under no_grad the owners keep nothing for a backward (autograd's needs_input_grad says only
    which inputs require a gradient, under no_grad too): rowwise casts the weights for the forward
    alone, and no layer saves g and u, the FP8 one's nor the high-precision one's."""
    forward, fused = _count(monkeypatch, ep_fp8_layer, "forward_weight"), _count(monkeypatch, ep_fp8_layer,
                                                                                  "weight_operands")
    saves = []
    for owner in (ep_fp8_layer._Float8Owner, ep_layer.V3Experts):
        real = owner.forward
        monkeypatch.setattr(owner, "forward", lambda *a, real=real: saves.append(a[-1]) or real(*a))
    layer = _layer(one_rank, "rowwise", False)
    x = torch.randn(TOKENS, DIM).bfloat16()
    with torch.no_grad():
        layer(x)
        kernels.MoE.from_full(kernels.MoE(DIM, HIDDEN, EXPERTS, TOP_K).bfloat16(), one_rank, ep_chunks=3)(x)
    assert (len(forward), len(fused)) == (3, 0)
    assert layer._owner.dgrad_weights == {} and layer._owner.forward_weights == {}
    assert saves == [False] * 6   # three chunks each
    layer(x)
    assert saves[6:] == [True] * 3


@pytest.mark.parametrize("recipe, fp8, grad, message", [
    ("mxfp8", FP8, GRAD, "mxfp8 recipe's output gradients"),
    ("rowwise", FP8, torch.float8_e5m2fnuz, "fp8_dtype's family"),
    ("rowwise", torch.bfloat16, None, "fp8_dtype must be one of")])
def test_formats_the_training_op_refuses_are_refused_where_the_layer_is_built(one_rank, recipe, fp8, grad, message):
    """The owner launches the training op's parts without the op's checks (each chunk's GEMMs read the
    kept weight casts): the layers refuse what the op would, when they are built, not at a forward."""
    full = kernels.MoE(DIM, HIDDEN, EXPERTS, TOP_K)
    with pytest.raises(TypeError, match=message):
        Float8ExpertParallelMoE.from_ep(kernels.MoE.from_full(full, one_rank), recipe, fp8, grad)
    with pytest.raises(TypeError, match=message):
        Float8MoE.from_moe(full, recipe, fp8, grad)
