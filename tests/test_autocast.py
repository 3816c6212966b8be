"""Under ``torch.autocast`` the package's ops return the dtypes torch's own return, and
their gradients reach the inputs in the inputs' dtypes (``kernels/autocast.py``)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kernels
from kernels import autocast
from kernels.moe.reference import MoEReference

REGIONS = [torch.bfloat16, torch.float16]


def _dtypes(fn, *inputs, dtype):
    """The output dtype and the input gradients' dtypes of ``fn`` in an autocast region."""
    leaves = [t.detach().requires_grad_() for t in inputs]
    with torch.autocast("cpu", dtype=dtype):
        out = fn(*leaves)
    out.float().sum().backward()
    return out.dtype, [t.grad.dtype for t in leaves]


@pytest.mark.parametrize("dtype", REGIONS, ids=str)
def test_matmul_is_torch_matmul(dtype):
    a, b = torch.randn(2, 3, 16), torch.randn(16, 8)
    assert _dtypes(kernels.matmul, a, b, dtype=dtype) == _dtypes(torch.matmul, a, b, dtype=dtype)
    assert _dtypes(kernels.matmul, a, b, dtype=dtype)[0] == dtype


@pytest.mark.parametrize("dtype", REGIONS, ids=str)
def test_linear_is_nn_linear(dtype):
    torch.manual_seed(0)
    ours, theirs = kernels.nn.Linear(16, 8), torch.nn.Linear(16, 8)
    x = torch.randn(5, 16, requires_grad=True)
    results = []
    for layer in (ours, theirs):
        with torch.autocast("cpu", dtype=dtype):
            out = layer(x)
        out.float().sum().backward()
        results.append((out.dtype, x.grad.dtype, layer.weight.grad.dtype, layer.bias.grad.dtype))
    assert results[0] == results[1] and results[0][0] == dtype


@pytest.mark.parametrize("dtype", REGIONS, ids=str)
def test_flash_attention_is_sdpa(dtype):
    q, k, v = torch.randn(1, 4, 9, 16), torch.randn(1, 2, 9, 16), torch.randn(1, 2, 9, 16)
    ours = _dtypes(lambda *a: kernels.flash_attention(*a, causal=True), q, k, v, dtype=dtype)
    theirs = _dtypes(lambda *a: F.scaled_dot_product_attention(*a, is_causal=True, enable_gqa=True),
                     q, k, v, dtype=dtype)
    assert ours == theirs and ours[0] == dtype


def test_flash_attention_varlen_runs_in_the_autocast_dtype():
    q, k, v = torch.randn(9, 4, 16), torch.randn(7, 2, 16), torch.randn(7, 2, 16)
    cu_q, cu_k = torch.tensor([0, 4, 9], dtype=torch.int32), torch.tensor([0, 3, 7], dtype=torch.int32)
    out, grads = _dtypes(lambda *a: kernels.flash_attention_varlen(*a, cu_q, cu_k, 5, 4), q, k, v,
                         dtype=torch.bfloat16)
    assert out == torch.bfloat16 and grads == [torch.float32] * 3


def test_moe_is_its_reference():
    torch.manual_seed(0)
    reference = MoEReference(dim=16, hidden=32, num_experts=4, top_k=2, shared_experts=1)
    ours = kernels.MoE(16, 32, 4, 2, shared_experts=1)
    ours.load_state_dict(reference.state_dict())
    x = torch.randn(2, 5, 16)
    results = []
    for layer in (ours, reference):
        leaf = x.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = layer(leaf)
        out.float().sum().backward()
        results.append((out.dtype, leaf.grad.dtype, *(p.grad.dtype for p in layer.parameters())))
    assert results[0] == results[1]


def test_outside_autocast_nothing_is_cast():
    a, b = torch.randn(3, 16, dtype=torch.float16), torch.randn(16, 8, dtype=torch.float16)
    assert kernels.matmul(a, b).dtype == torch.float16
    assert kernels.matmul(a.float(), b.float()).dtype == torch.float32


def test_the_cast_leaves_float64_and_integers_as_they_are():
    """As torch's own autocast casts: only float32, float16 and bfloat16 tensors move."""
    x, x64, ids = torch.randn(2), torch.randn(2, dtype=torch.float64), torch.arange(2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cast = autocast.operands(x, x64, ids)
    assert [t.dtype for t in cast] == [torch.bfloat16, torch.float64, torch.int64]



def _cu(*offsets):
    return torch.tensor(offsets, dtype=torch.int32)


MIXED = {   # op, torch's op (None: none to ask), inputs with the first operand already in bf16
    "matmul": (kernels.matmul, torch.matmul, lambda: (torch.randn(2, 3, 16).bfloat16(), torch.randn(16, 8))),
    "linear": (kernels.nn.linear, F.linear,
               lambda: (torch.randn(5, 16).bfloat16(), torch.randn(8, 16), torch.randn(8))),
    "flash_attention": (lambda q, k, v: kernels.flash_attention(q, k, v, causal=True),
                        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
                        lambda: (torch.randn(1, 4, 9, 16).bfloat16(), torch.randn(1, 2, 9, 16),
                                 torch.randn(1, 2, 9, 16))),
    "flash_attention_varlen": (lambda q, k, v: kernels.flash_attention_varlen(q, k, v, _cu(0, 4, 9), _cu(0, 3, 7), 5, 4),
                               None,
                               lambda: (torch.randn(9, 4, 16).bfloat16(), torch.randn(7, 2, 16),
                                        torch.randn(7, 2, 16))),
}


@pytest.mark.parametrize("name", MIXED)
def test_operands_of_mixed_dtypes_are_cast_as_torch_casts_them(name):
    """bf16 activations with float32 weights, as a bf16 region meets them: torch's op casts both
    and runs; ours gives the bits it gives for the operands cast by hand, in the region's dtype,
    with each gradient in its leaf's dtype (before, the checks refused the mix)."""
    ours, theirs, inputs = MIXED[name]
    torch.manual_seed(0)
    mixed = inputs()
    want = ours(*(t.bfloat16() for t in mixed))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = ours(*mixed)
    assert got.dtype == torch.bfloat16 and torch.equal(got, want)
    seen = _dtypes(ours, *mixed, dtype=torch.bfloat16)
    assert seen == (torch.bfloat16, [t.dtype for t in mixed])
    if theirs is not None:
        assert seen == _dtypes(theirs, *mixed, dtype=torch.bfloat16)


def test_outside_autocast_mixed_dtypes_stay_an_error():
    with pytest.raises(TypeError, match="dtypes differ"):
        kernels.matmul(torch.randn(2, 16).bfloat16(), torch.randn(16, 8))



@pytest.mark.parametrize("call", [lambda t: kernels.matmul([[1.0]], t[0]),
                                  lambda t: kernels.nn.linear([[1.0]], t[0, 0]),
                                  lambda t: kernels.flash_attention([[1.0]], t, t)],
                         ids=["matmul", "linear", "flash_attention"])
def test_under_autocast_a_non_tensor_operand_gets_the_ops_named_error(call):
    """The cast before the checks leaves a non-tensor first operand to them: the TypeError
    naming it, as outside autocast (not an AttributeError from the cast)."""
    t = torch.randn(1, 1, 4, 16)
    with pytest.raises(TypeError, match="must be a torch.Tensor"), torch.autocast("cpu", dtype=torch.bfloat16):
        call(t)


@pytest.mark.parametrize("dtype", REGIONS, ids=str)
def test_region_dtype_is_the_open_regions_on_its_device_only(dtype):
    """What operands cast to: the region's dtype on its device; None outside one, in a disabled
    one, and on a device with no autocast (meta)."""
    assert autocast.region_dtype("cpu") is None
    with torch.autocast("cpu", dtype=dtype):
        assert autocast.region_dtype("cpu") == dtype
        assert autocast.region_dtype("meta") is None
        with torch.autocast("cpu", enabled=False):
            assert autocast.region_dtype("cpu") is None


@pytest.mark.parametrize("dtype", REGIONS, ids=str)
def test_master_operands_cast_as_operands_and_name_the_weights_dtype(dtype):
    """What a layer with a master weight asks once (kernels.nn.linear, kernels.MoE): the operands
    cast as :func:`operands` casts them, and the dtype the region casts the weight to: the region's
    for a float32 weight; None for one already in it, a float64 one, outside a region, and where
    the first operand is not a tensor (left to the op's checks)."""
    x, bias, weight = torch.randn(3), torch.randn(2, dtype=torch.float64), torch.randn(2, 3)
    outside = autocast.master_operands(weight, x, bias)
    assert outside[1] is None and all(a is b for a, b in zip(outside[0], (x, bias)))
    with torch.autocast("cpu", dtype=dtype):
        cast, to = autocast.master_operands(weight, x, bias)
        assert to == dtype and [t.dtype for t in cast] == [t.dtype for t in autocast.operands(x, bias)]
        assert torch.equal(cast[0], x.to(dtype)) and cast[1] is bias
        assert autocast.master_operands(weight.to(dtype), x)[1] is None
        assert autocast.master_operands(weight.double(), x)[1] is None
        assert autocast.master_operands(weight, [[1.0]]) == (([[1.0]],), None)
