"""Float8MoE's permutation and weighted combine (:mod:`kernels.moe.combine_op`): against
float64 on odd shapes in every dtype, forward and both gradients, outputs poisoned; their
custom ops (opcheck) and errors; bitwise the same on a second run; and over one Float8MoE
forward and backward no float32 tensor of (T·k, dim) or (T, k, dim) and no torch pass over
them but the one this file names."""
from __future__ import annotations

import pytest
import torch

import kernels
from kernels.moe import combine_op
from kernels.moe.fp8_layer import Float8MoE
from kernels.moe.layer_ladder import spec as moe_spec
from kernels.moe.permutation import _inverse, sort_slots
from kernels.outputs import poisoned_outputs
from rounding_units import UNIT
from rows_by_hidden import RowsByHidden


def _close(got, exact, magnitude, terms, dtype):
    """Within one rounding to ``dtype`` of the float64 ``exact`` (half a subnormal step below
    the smallest normal), plus float32 accumulation's error over ``terms`` summands of
    absolute sum ``magnitude`` (so cancellation is covered)."""
    assert got.dtype == dtype and got.shape == exact.shape
    assert not got.isnan().any()
    err = (got.double() - exact).abs()
    bound = UNIT[dtype] * (exact.abs() + torch.finfo(dtype).tiny) + (terms + 1) * UNIT[torch.float32] * magnitude
    assert (err <= bound).all(), err.max()


def _routing(tokens, top_k, experts, gen):
    ids = torch.randint(0, experts, (tokens, top_k), generator=gen)
    _, permutation = sort_slots(ids, experts)
    return permutation, _inverse(permutation)


@pytest.mark.parametrize("dtype", moe_spec.DTYPES, ids=str)
@pytest.mark.parametrize("tokens, dim, top_k", [(19, 33, 1), (19, 129, 2), (37, 33, 4), (3, 129, 4)])
def test_permute_and_combine_match_float64(tokens, dim, top_k, dtype):
    """x_sorted is x's rows (exact); x's gradient is each token's k slot gradients summed;
    combine's output Σ_j w·y, its y gradient w·dy (one rounding) and its weights' gradient
    the float32 dot product dy·y, all against float64."""
    gen = torch.Generator().manual_seed(tokens * dim + top_k)
    permutation, inverse = _routing(tokens, top_k, 5, gen)
    x = torch.randn(tokens, dim, generator=gen).to(dtype).requires_grad_()
    y = torch.randn(tokens * top_k, dim, generator=gen).to(dtype).requires_grad_()
    w = torch.rand(tokens, top_k, generator=gen).requires_grad_()
    d_sorted = torch.randn(tokens * top_k, dim, generator=gen).to(dtype)
    dy = torch.randn(tokens, dim, generator=gen).to(dtype)
    with poisoned_outputs():
        x_sorted = combine_op.permute_rows(x, permutation, inverse, top_k)
        x_sorted.backward(d_sorted)
        out = combine_op.combine(y, w, permutation, inverse)
        out.backward(dy)
    slots_x = x.detach().double()[permutation // top_k]
    assert torch.equal(x_sorted.detach().double(), slots_x)
    per_slot = d_sorted.double()[inverse].view(tokens, top_k, dim)
    _close(x.grad, per_slot.sum(1), per_slot.abs().sum(1), top_k, dtype)
    terms = w.detach().double()[..., None] * y.detach().double()[inverse].view(tokens, top_k, dim)
    _close(out.detach(), terms.sum(1), terms.abs().sum(1), top_k, dtype)
    want_dy = w.detach().double().reshape(-1)[permutation, None] * dy.double()[permutation // top_k]
    _close(y.grad, want_dy, 0.0, 0, dtype)
    products = dy.double()[:, None, :] * y.detach().double()[inverse].view(tokens, top_k, dim)
    _close(w.grad, products.sum(-1), products.abs().sum(-1), dim, torch.float32)


def test_empty_tokens_and_empty_rows():
    """No tokens: empty outputs and gradients; no columns: the weights' gradient is 0."""
    for tokens, dim in ((0, 33), (5, 0)):
        permutation, inverse = _routing(tokens, 2, 3, torch.Generator().manual_seed(0))
        x = torch.randn(tokens, dim, dtype=torch.bfloat16, requires_grad=True)
        y = torch.randn(tokens * 2, dim, dtype=torch.bfloat16, requires_grad=True)
        w = torch.rand(tokens, 2, requires_grad=True)
        with poisoned_outputs():
            xs = combine_op.permute_rows(x, permutation, inverse, 2)
            out = combine_op.combine(y, w, permutation, inverse)
            (xs.sum() + out.sum()).backward()
        assert xs.shape == (tokens * 2, dim) and out.shape == (tokens, dim)
        assert x.grad.shape == x.shape and y.grad.shape == y.shape
        assert torch.equal(w.grad, torch.zeros(tokens, 2))


def test_custom_ops_pass_opcheck_and_bad_inputs_are_refused():
    gen = torch.Generator().manual_seed(1)
    permutation, inverse = _routing(7, 2, 3, gen)
    x = torch.randn(7, 33, dtype=torch.bfloat16, requires_grad=True)
    y = torch.randn(14, 33, dtype=torch.bfloat16, requires_grad=True)
    w = torch.rand(7, 2, requires_grad=True)
    torch.library.opcheck(torch.ops.kernels.moe_permute.default, (x, permutation, inverse, 2))
    torch.library.opcheck(torch.ops.kernels.moe_combine.default, (y, w, permutation, inverse))
    dy = torch.randn(7, 33, dtype=torch.bfloat16)
    torch.library.opcheck(torch.ops.kernels.moe_combine_backward.default, (dy, y.detach(), w.detach(), permutation))
    torch.library.opcheck(torch.ops.kernels.moe_slot_sum.default, (y.detach(), inverse, 2))
    repeated = permutation.clone()
    repeated[1] = repeated[0]   # another slot's weight gradient would be left unwritten
    with pytest.raises(ValueError, match="appears more than once"):
        combine_op.combine(y, w, repeated, inverse)
    with pytest.raises(ValueError, match="outside that range"):
        combine_op.permute_rows(x, torch.where(permutation == 0, 99, permutation), inverse, 2)
    with pytest.raises(ValueError, match="inverse has 3 entries, but there are T·k = 14 slots"):
        combine_op.combine(y, w, permutation, inverse[:3])
    with pytest.raises(TypeError):
        combine_op.combine(y, w, permutation, inverse.int())
    with pytest.raises(ValueError, match="permutation has 14 entries, but there are T·k = 21 slots"):
        combine_op.permute_rows(x, permutation, inverse, 3)
    with pytest.raises(ValueError, match="top_k must be a positive int"):
        combine_op.permute_rows(x, permutation, inverse, 0)
    with pytest.raises(TypeError):
        combine_op.combine(y, w.double(), permutation, inverse)
    with pytest.raises(ValueError, match="weights must be contiguous"):
        combine_op.combine(y, w.t().contiguous().t(), permutation, inverse)
    with pytest.raises(ValueError, match="y_sorted must have unit column stride"):
        combine_op.combine(y.t().contiguous().t(), w, permutation, inverse)


def test_permute_and_combine_compile_with_their_backward_without_graph_breaks():
    """Under ``torch.compile(fullgraph=True)`` (aot_eager: the fakes and the autograd formulas
    traced, forward and backward) the same bits as eager."""
    gen = torch.Generator().manual_seed(3)
    permutation, inverse = _routing(9, 2, 3, gen)

    def layer(x, w):
        rows = combine_op.permute_rows(x, permutation, inverse, 2, check_permutation=False)   # as Float8MoE: no sync
        return combine_op.combine(rows * 2, w, permutation, inverse, check_permutation=False)

    x = torch.randn(9, 33, dtype=torch.bfloat16, generator=gen)
    w, dy = torch.rand(9, 2, generator=gen), torch.randn(9, 33, dtype=torch.bfloat16, generator=gen)
    results = []
    for run in (layer, torch.compile(layer, fullgraph=True, backend="aot_eager")):
        xi, wi = x.clone().requires_grad_(), w.clone().requires_grad_()
        out = run(xi, wi)
        out.backward(dy)
        results.append((out.detach(), xi.grad, wi.grad))
    for eager, compiled in zip(*results):
        assert torch.equal(eager, compiled)


DIM, HIDDEN, EXPERTS, TOP_K, TOKENS = 24, 40, 4, 2, 11


def _step(seed=0):
    """One bf16 Float8MoE (rowwise) forward and backward: its output and gradients."""
    torch.manual_seed(seed)
    layer = Float8MoE.from_moe(kernels.MoE(DIM, HIDDEN, EXPERTS, TOP_K).to(torch.bfloat16), "rowwise",
                               torch.float8_e4m3fn)
    x = torch.randn(TOKENS, DIM, dtype=torch.bfloat16, requires_grad=True)
    out = layer(x)
    out.backward(torch.randn_like(out))
    return [out, x.grad, *(p.grad for p in layer.parameters())]


def test_float8moe_moves_no_float32_slot_rows_and_runs_no_torch_pass_over_them_but_one_add():
    """Over (T·k, dim) and (T, k, dim) in one forward and backward: no float32 tensor; the
    permutation, combine and their gradients are the custom ops (their kernels; the gather of
    x's rows for the grouped GEMMs, which read contiguous expert rows, inside
    ``kernels::moe_permute``); the one torch pass is ``aten.add``: autograd summing the gate's
    and up's dX of the shared x_sorted (bf16, before ``kernels::moe_slot_sum``)."""
    with RowsByHidden((TOKENS * TOP_K, DIM)) as slots, RowsByHidden((TOKENS, TOP_K, DIM)) as by_token:
        _step()
    assert slots.float32_outputs() == [] and by_token.ops == []
    # views besides (x_sorted's batch of one for the fused quantization and its row-wise copy back)
    assert slots.torch_ops() == {"aten.view", "aten.unsqueeze", "aten.add"}, slots.ops
    ops = [op for op, _ in slots.ops]
    assert ops.count("aten.add") == 1
    assert {"kernels.moe_permute", "kernels.moe_combine", "kernels.moe_combine_backward",
            "kernels.moe_slot_sum"} <= set(ops)


def test_float8moe_step_is_bitwise_the_same_twice():
    """Bitwise the same twice: on the CPU interpreter a sanity check only (it would hold with
    atomics too); that the kernels add in a fixed order with no atomics is read from them."""
    for first, second in zip(_step(), _step()):
        assert torch.equal(first, second)
