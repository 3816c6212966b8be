"""``kernels.flash_attention``: results, gradients, torch.compile, and the errors that name
the argument (the packed op: ``tests/test_attention_varlen.py``)."""
from __future__ import annotations

import contextlib
import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import kernels
from attention_layouts import batch_expanded, fused_projection, gradients, reversed_dims, sliced_head_dim
from kernels.attention import spec as attn_spec
from kernels.outputs import poisoned_outputs
from workbench.check import compare

flash_attention = kernels.flash_attention   # also registers torch.ops.kernels.flash_attention_*


def _inputs(shape, dtype=torch.float32, seed=0, layout=None):
    """q, k, v of ``shape`` (the spec's tuple), laid out by ``layout`` (:mod:`attention_layouts`)."""
    q, k, v, _ = attn_spec.make_inputs(shape, dtype, seed=seed)
    return [t.requires_grad_() for t in (layout(q, k, v) if layout else (q, k, v))]


def _grads(fn, q, k, v, grad):
    out = fn(q, k, v)
    return out.detach(), gradients(out, (q, k, v), grad)


def _check_against_the_reference(shape, dtype, scale=None, layout=None):
    """Forward and gradients against the float64 reference by the harness's rule (SDPA the
    baseline), the outputs poisoned; each gradient laid out as ``torch.empty_like`` lays out
    its operand, as SDPA's are where the operand is dense."""
    q, k, v = _inputs(shape, dtype, layout=layout)
    causal = bool(shape[-1])
    grad = torch.randn(q.shape).to(dtype)
    with poisoned_outputs():     # a row or gradient no program writes stays NaN and fails
        out, grads = _grads(lambda *a: kernels.flash_attention(*a, causal=causal, scale=scale), q, k, v, grad)
    # SDPA's CPU kernel returns NaN for a causal mask at scale <= 0; its math backend does not
    with sdpa_kernel(SDPBackend.MATH) if scale is not None else contextlib.nullcontext():
        base, base_grads = _grads(lambda *a: F.scaled_dot_product_attention(
            *a, is_causal=causal, scale=scale, enable_gqa=True), q, k, v, grad)
    ref, ref_grads = _grads(lambda *a: attn_spec.reference(*a, causal, scale), *(
        t.detach().double().requires_grad_() for t in (q, k, v)), grad.double())
    assert out.shape == q.shape and out.dtype == dtype
    assert compare(out, ref, base, dtype)["passed"]
    for name, t, g, r, b in zip("qkv", (q, k, v), grads, ref_grads, base_grads):
        assert g.shape == r.shape and compare(g, r, b, dtype, "backward")["passed"], f"d{name}"
        assert g.stride() == torch.empty_like(t).stride(), f"d{name}: {g.stride()} for {name} {t.stride()}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 4, 2, 17, 17, 64, 1), (2, 4, 1, 1, 5, 32, 0)])
def test_forward_and_gradients_match_the_reference(shape, dtype):
    _check_against_the_reference(shape, dtype)


LAYOUTS = {"fused-projection": fused_projection, "reversed-dims": reversed_dims,
           "sliced-head-dim": sliced_head_dim, "batch-expanded": batch_expanded}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(2, 4, 2, 13, 13, 24, 1), (2, 2, 1, 7, 7, 40, 0)])
@pytest.mark.parametrize("layout", LAYOUTS.values(), ids=LAYOUTS.keys())
def test_gradients_take_their_operands_layouts(layout, shape, dtype):
    """A transposed view of a fused projection (dense) gets gradients with its own strides, as
    SDPA's, so autograd's view backward needs no copy; a sliced head dim (not dense) and a
    stride-0 batch (overlapping) get dense ones, each element written (outputs poisoned)."""
    _check_against_the_reference(shape, dtype, layout=layout)


def test_the_custom_ops_pass_opcheck():
    """The fake kernels give the real ones' strides (a traced graph's view backward is the
    eager one's), for operands laid out as the training model's are."""
    q, k, v = (t.detach() for t in _inputs((1, 4, 2, 9, 9, 16, 1), layout=fused_projection))
    o, lse = torch.ops.kernels.flash_attention_fwd(q, k, v, True, 0.25)
    torch.library.opcheck(torch.ops.kernels.flash_attention_bwd.default,
                          (torch.randn_like(o), q, k, v, o, lse, True, 0.25))
    torch.library.opcheck(torch.ops.kernels.flash_attention_fwd.default,
                          (q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), True, 0.25))


@pytest.mark.parametrize("causal", [0, 1])
@pytest.mark.parametrize("scale", [0.0, -0.5, 1e-3, None])
def test_any_scale_is_sdpa_math(scale, causal):
    """Scale 0: O is the mean of the visible V and dQ = dK = 0; a negative scale flips the
    softmax's order. Forward and gradients, as SDPA's math backend computes them."""
    _check_against_the_reference((1, 4, 2, 9, 11, 16, causal), torch.float32, scale)


def test_the_same_tensors_at_a_second_scale_get_that_scales_result():
    """The scale is baked into each kept launch plan (the public op's, v4's forward, v5's
    backward), so it must be in every plan's key: the same q, k, v metadata called again at
    another scale (the conftest's ``tuning.forget`` drops every plan between tests, not within one) gets that
    scale's output and gradients, not the first call's."""
    for scale in (0.5, 0.125):
        _check_against_the_reference((1, 2, 1, 9, 11, 16, 1), torch.float32, scale)


def test_scale_and_odd_head_dim():
    q, k, v = (t.detach() for t in _inputs((1, 2, 2, 9, 9, 40, 0)))
    out = kernels.flash_attention(q, k, v, scale=0.3)
    assert torch.allclose(out.double(), attn_spec.reference(q, k, v, False, 0.3), atol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("q_shape,kv_shape", [
    ((0, 4, 3, 16), (0, 2, 5, 16)),     # B = 0
    ((1, 0, 3, 16), (1, 0, 5, 16)),     # Hq = Hkv = 0
    ((1, 0, 3, 16), (1, 2, 5, 16)),     # Hq = 0
    ((2, 4, 0, 16), (2, 2, 5, 16)),     # S = 0
    ((2, 4, 3, 16), (2, 2, 0, 16)),     # S_k = 0: rows without keys, O = 0
], ids=["B=0", "H=0", "Hq=0", "S=0", "Sk=0"])
def test_empty_inputs_give_what_sdpa_gives(q_shape, kv_shape, causal):
    q, k, v = (torch.randn(shape, requires_grad=True) for shape in (q_shape, kv_shape, kv_shape))
    grad = torch.randn(q_shape)
    out, grads = _grads(lambda *a: kernels.flash_attention(*a, causal=causal), q, k, v, grad)
    base, base_grads = _grads(lambda *a: F.scaled_dot_product_attention(
        *a, is_causal=causal, enable_gqa=True), q, k, v, grad)
    assert out.shape == base.shape and torch.equal(out, base)
    assert all(g.shape == b.shape and torch.equal(g, b) for g, b in zip(grads, base_grads))


def test_heads_without_kv_heads_are_refused():
    with pytest.raises(ValueError, match="4 heads are not a multiple of k and v's 0 heads"):
        kernels.flash_attention(torch.randn(1, 4, 3, 16), torch.randn(1, 0, 3, 16), torch.randn(1, 0, 3, 16))


def test_backward_is_deterministic():
    q, k, v = _inputs((1, 4, 1, 20, 20, 32, 1))
    grad = torch.randn(q.shape)
    first = _grads(lambda *a: kernels.flash_attention(*a, causal=True), q, k, v, grad)[1]
    second = _grads(lambda *a: kernels.flash_attention(*a, causal=True), q, k, v, grad)[1]
    assert all(torch.equal(a, b) for a, b in zip(first, second))


def test_compiles_without_graph_break():
    q, k, v = _inputs((1, 2, 1, 8, 8, 16, 0))
    fn = torch.compile(lambda q, k, v: kernels.flash_attention(q, k, v, causal=True) * 2,
                       fullgraph=True, backend="aot_eager")
    out = fn(q, k, v)
    out.sum().backward()       # a stride-0 output gradient reaches the backward kernels
    expected = attn_spec.reference(q.detach(), k.detach(), v.detach(), True) * 2
    assert torch.allclose(out.detach().double(), expected, atol=1e-5) and q.grad is not None


def test_fake_kernel_gives_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        q, k = torch.empty(2, 8, 5, 64), torch.empty(2, 2, 7, 64)
        o, lse = torch.ops.kernels.flash_attention_fwd(q, k, k, True, 0.125)
    assert o.shape == (2, 8, 5, 64) and lse.shape == (2, 8, 2, 5) and lse.dtype == torch.float32


def _bad(**over):
    args = dict(q=torch.randn(1, 4, 3, 16), k=torch.randn(1, 2, 3, 16), v=torch.randn(1, 2, 3, 16))
    args.update(over)
    return args


@pytest.mark.parametrize("args,error,match", [
    (_bad(k=torch.randn(1, 3, 3, 16), v=torch.randn(1, 3, 3, 16)), ValueError, "not a multiple"),
    (_bad(k=torch.randn(1, 2, 3, 8), v=torch.randn(1, 2, 3, 8)), ValueError, "head dim differs"),
    (_bad(k=torch.randn(2, 2, 3, 16), v=torch.randn(2, 2, 3, 16)), ValueError, "batch differs"),
    (_bad(v=torch.randn(1, 2, 3, 16, dtype=torch.float64)), TypeError, "v: float64"),
    (_bad(q=torch.randn(1, 4, 3, 160), k=torch.randn(1, 2, 3, 160), v=torch.randn(1, 2, 3, 160)),
     ValueError, "D=160 is not supported"),
    (_bad(q=torch.randn(4, 3, 16)), ValueError, "q must be 4-D"),
    (_bad(v=torch.randn(1, 2, 4, 16)), ValueError, "k and v must have one shape"),
])
def test_bad_input_names_the_argument(args, error, match):
    with pytest.raises(error, match=match):
        kernels.flash_attention(**args)


@pytest.mark.parametrize("varlen", [False, True], ids=["dense", "varlen"])
def test_a_scale_under_float32s_normals_is_the_zero_scale_and_one_past_its_range_is_refused(varlen):
    """A GPU launch takes the scale as float32 (Triton types Python floats fp32): 1.5e-204 is 0
    there, and the interpreter, which would fold it into an fp64 constant, computes with 0 too
    (the fuzz found it failing in bf16's rounding). Gradients included."""
    q, k, v = (torch.randn(2, 2, 5, 8, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))

    def attend(scale):
        if not varlen:
            return kernels.flash_attention(q, k, v, scale=scale)
        cu = torch.tensor([0, 5, 10], dtype=torch.int32)
        packed = [t.transpose(1, 2).reshape(10, 2, 8) for t in (q, k, v)]
        return kernels.flash_attention_varlen(*packed, cu, cu, 5, 5, scale=scale)

    tiny, zero = attend(1.5e-204), attend(0.0)
    assert torch.equal(tiny, zero)
    grads = [torch.autograd.grad(out.float().sum(), (q, k, v)) for out in (tiny, zero)]
    assert all(torch.equal(a, b) for a, b in zip(*grads))
    with pytest.raises(ValueError, match=r"scale=1e\+39 is outside float32's range"):
        attend(1e39)
