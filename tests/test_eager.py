"""kernels.eager.path: a plain eager call skips the custom op, running the implementation itself
when it needs no gradient and the op's own autograd.Function when it does; anything that traces,
transforms or casts still sees the custom op."""
from __future__ import annotations

import contextlib

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.autograd import forward_ad
from torch.utils._python_dispatch import TorchDispatchMode

import kernels
from kernels import eager
from kernels.attention import ops as attention_ops
from kernels.fp8 import linear as fp8_linear_module
from kernels.gemm import ops as gemm_ops
from kernels.gemm.linear import linear
from kernels.gemm_fp8 import ops as fp8_ops
from kernels.loss import ops as loss_ops
from kernels.moe.grouped_gemm import ops as grouped_ops
from kernels.moe.layer_ladder import fused_op
from kernels.norm import ops as norm_ops
from kernels.rotary import op as rope_op
from workbench.harness import host_overhead

# the custom op each benchmark case's public op calls when it does not run directly
CUSTOM_OPS = {"matmul": (gemm_ops, "_matmul_2d"), "nn.Linear": (gemm_ops, "_matmul_2d"),
              "flash_attention": (attention_ops, "_fwd"),
              "flash_attention_varlen": (attention_ops, "_varlen_fwd"),
              "grouped_gemm": (grouped_ops, "_grouped_gemm"), "matmul_fp8": (fp8_ops, "_matmul_fp8"),
              "MoE": (fused_op, "_moe_fused"), "rms_norm": (norm_ops, "_rms_norm"),
              "add_rms_norm": (norm_ops, "_add_rms_norm"), "rope": (rope_op, "_rope"),
              "cross_entropy": (loss_ops, "_forward"),
              **{case.op: (fp8_linear_module, "_fp8_linear") for case in host_overhead.cases()
                 if case.op.startswith("Float8Linear")}}


def _refuse(*args):
    raise AssertionError("the custom op was called")


@pytest.mark.parametrize("case", [c for c in host_overhead.cases() if not c.backward], ids=lambda c: c.op)
def test_an_untraced_call_without_gradients_skips_the_custom_op(case, monkeypatch):
    assert set(CUSTOM_OPS) == {c.op for c in host_overhead.cases()}
    monkeypatch.setattr(*CUSTOM_OPS[case.op], _refuse)
    call = case.ours()
    with torch.no_grad(), host_overhead.stubbed_launches() as seen:
        call()
    assert seen.count >= 1


@pytest.mark.parametrize("case", [c for c in host_overhead.cases() if not c.backward and (
    c.op in ("nn.Linear", "MoE") or c.op.startswith("Float8Linear"))], ids=lambda c: c.op)
def test_an_untraced_call_with_gradients_skips_the_custom_op(case, monkeypatch):
    """Their weights need gradients: the op's own autograd.Function runs instead."""
    monkeypatch.setattr(*CUSTOM_OPS[case.op], _refuse)
    call = case.ours()
    with host_overhead.stubbed_launches() as seen:
        assert call().grad_fn is not None
    assert seen.count >= 1


def test_the_direct_call_computes_what_the_custom_op_does():
    a, b = torch.randn(20, 12), torch.randn(12, 9)
    with torch.no_grad():
        assert eager.direct(a, b)
        torch.testing.assert_close(kernels.matmul(a, b), gemm_ops._matmul_2d(a, b), rtol=0, atol=0)


@contextlib.contextmanager
def _dual_level():
    with forward_ad.dual_level():
        yield


class _Seen(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


WATCHERS = {
    "dispatch mode": lambda a, b: _Seen(),
    "function mode": lambda a, b: torch.device("cpu"),
    "forward AD": lambda a, b: _dual_level(),
}


@pytest.mark.parametrize("watcher", WATCHERS)
def test_a_watched_call_goes_through_the_custom_op(watcher, monkeypatch):
    a, b = torch.randn(4, 3), torch.randn(3, 5)
    called = []
    real = gemm_ops._matmul_2d
    monkeypatch.setattr(gemm_ops, "_matmul_2d", lambda *args: called.append(1) or real(*args))
    with WATCHERS[watcher](a, b):
        assert not eager.direct(a, b)
        kernels.matmul(a, b)
    assert called == [1]


def test_a_transform_is_left_to_the_custom_op():
    """The ops' own autograd.Functions (forward(ctx, ...)) support no functorch transform."""
    a = torch.randn(4, 3, requires_grad=True)
    seen = []
    torch.func.grad(lambda a: seen.append(eager.path(a)) or a.sum())(a.detach())
    torch.vmap(lambda row: seen.append(eager.path(row)) or row)(a)
    assert seen == [eager.CUSTOM_OP, eager.CUSTOM_OP] and eager.path(a) == eager.AUTOGRAD


def test_under_autocast_a_public_op_casts_its_operands_and_calls_its_kernel_directly(monkeypatch):
    """Autocast watches nothing a custom op would have to handle: the public ops cast their
    operands to the region's dtype themselves (:func:`kernels.autocast.operands`), so the call
    skips the custom op's dispatch (whose autocast rule would cast them again)."""
    a, b = torch.randn(4, 3), torch.randn(3, 5)
    called = []
    real = gemm_ops._matmul_2d
    monkeypatch.setattr(gemm_ops, "_matmul_2d", lambda *args: called.append(1) or real(*args))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert eager.direct(a)
        c = kernels.matmul(a, b)
    assert called == [] and c.dtype == torch.bfloat16


def test_fake_tensors_and_transforms_are_not_plain():
    with FakeTensorMode() as mode:
        fake = torch.randn(2, 2)
    assert not eager.direct(fake)
    with mode:
        assert not eager.direct(fake)
    seen = []
    torch.vmap(lambda row: seen.append(eager.direct(row)) or row)(torch.randn(3, 2))
    assert seen == [False]
    assert eager.direct(torch.nn.Parameter(torch.randn(2), requires_grad=False))


def test_a_graph_compiles_the_custom_op(monkeypatch):
    monkeypatch.setattr(gemm_ops, "_matmul_impl", _refuse)   # only the custom op's own copy runs
    a, b = torch.randn(4, 3), torch.randn(3, 5)
    compiled = torch.compile(kernels.matmul, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        torch.testing.assert_close(compiled(a, b), a @ b)


def test_a_call_that_needs_a_gradient_runs_the_ops_autograd_function(monkeypatch):
    """Not the custom op (its dispatch is the "custom op, grad" floor), and the same numbers:
    the Function has the custom op's formula and launch plans."""
    layer = kernels.nn.Linear(3, 5)
    x = torch.randn(2, 4, 3, requires_grad=True)
    assert eager.path(x, layer.weight) == eager.AUTOGRAD
    with torch.no_grad():
        assert eager.path(x, layer.weight) == eager.PLAIN
    real = gemm_ops._matmul_2d
    monkeypatch.setattr(gemm_ops, "_matmul_2d", _refuse)
    y = layer(x)
    # one node, the GEMM's with the weight's transpose and the bias (in its epilogue) in it (kernels.gemm.linear)
    assert type(y.grad_fn).__name__ == "_LinearBackward" and not y._is_view()
    assert {type(f).__name__ for f, _ in y.grad_fn.next_functions} == {"AccumulateGrad"}
    y.relu_()   # in place on the output: allowed, the Function's output is not a view
    grad_y = torch.randn_like(y)
    y.backward(grad_y)
    monkeypatch.setattr(gemm_ops, "_matmul_2d", real)
    x2, w2, b2 = (t.detach().requires_grad_() for t in (x, layer.weight, layer.bias))
    y2 = (real(x2.reshape(8, 3), w2.t()).reshape(2, 4, 5) + b2).relu()
    y2.backward(grad_y)
    assert torch.equal(y, y2)
    assert torch.equal(x.grad, x2.grad) and torch.equal(layer.weight.grad, w2.grad)
    assert torch.equal(layer.bias.grad, b2.grad)
    expected = (x.detach().double() @ layer.weight.detach().double().t() + layer.bias.detach().double()).relu()
    torch.testing.assert_close(y.detach(), expected.float())


@pytest.mark.parametrize("bias", ["none", "fp32", "fp64", "row"])
def test_linear_computes_the_three_node_form(bias):
    """kernels.gemm.linear, eager with and without gradients, against matmul(x, w.t()) + bias run
    as three nodes: in fp32, where the epilogue's add before the store is the add after it, bitwise
    the same result and gradients. A bias of another dtype, or one that broadcasts the result
    ("row", (1, N) with a 1-D x), takes the three-node form itself."""
    x = torch.randn(7, requires_grad=True) if bias == "row" else torch.randn(2, 3, 7, requires_grad=True)
    w = torch.randn(5, 7, requires_grad=True)
    b = {"none": None, "fp32": torch.randn(5), "fp64": torch.randn(5, dtype=torch.float64),
         "row": torch.randn(1, 5)}[bias]
    b = None if b is None else b.requires_grad_()
    y = linear(x, w, b)
    grad_y = torch.randn_like(y)
    y.backward(grad_y)
    x2, w2, *b2 = (t.detach().requires_grad_() for t in (x, w) + ((b,) if b is not None else ()))
    with torch.no_grad():
        assert torch.equal(linear(x2, w2, *b2), y)
    y2 = kernels.matmul(x2, w2.t())
    y2 = y2 + b2[0].to(y2.dtype) if b2 else y2
    y2.backward(grad_y)
    assert y.shape == y2.shape and torch.equal(y, y2)
    assert torch.equal(x.grad, x2.grad) and torch.equal(w.grad, w2.grad)
    assert b is None or torch.equal(b.grad, b2[0].grad)


def test_export_sees_the_custom_op(monkeypatch):
    monkeypatch.setattr(gemm_ops, "_matmul_impl", _refuse)   # only the custom op's own copy runs

    class Model(torch.nn.Module):
        def forward(self, a, b):
            return kernels.matmul(a, b)

    with torch.no_grad():
        exported = torch.export.export(Model(), (torch.randn(4, 3), torch.randn(3, 5)))
    assert "torch.ops.kernels.matmul.default" in exported.graph_module.code


def test_the_autograd_functions_backward_is_differentiable():
    """Double backward, as through the custom op: d/db of sum(grad_a) = sum(ones @ b.T) is M."""
    a, b = torch.randn(2, 3, 4, requires_grad=True), torch.randn(4, 5, requires_grad=True)
    grad_a, = torch.autograd.grad(kernels.matmul(a, b).sum(), a, create_graph=True)
    assert grad_a.shape == a.shape and grad_a.grad_fn is not None
    grad_a.sum().backward()
    torch.testing.assert_close(b.grad, torch.full((4, 5), 6.0))
    assert a.grad is None


def _dense(q, k, v):
    return kernels.flash_attention(q, k, v, causal=True)


def _varlen(q, k, v):
    cu = torch.tensor([0, 5, 13], dtype=torch.int32)
    return kernels.flash_attention_varlen(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1),
                                          cu, cu, 8, 8, causal=True)


@pytest.mark.parametrize("op, forward, backward", [(_dense, "_fwd", "_bwd"), (_varlen, "_varlen_fwd", "_varlen_bwd")],
                         ids=["dense", "varlen"])
def test_attention_with_gradients_skips_both_custom_ops_and_computes_what_they_do(op, forward, backward,
                                                                                  monkeypatch):
    q, k, v = (torch.randn(1, h, 13, 16, requires_grad=True) for h in (4, 2, 2))
    grad_o = torch.randn_like(op(q, k, v))
    with _Seen():   # a dispatch mode watches: the custom ops run, forward and backward
        with_ops = torch.autograd.grad(op(q, k, v), (q, k, v), grad_o)
    monkeypatch.setattr(attention_ops, forward, _refuse)
    monkeypatch.setattr(attention_ops, backward, _refuse)
    o = op(q, k, v)
    assert type(o.grad_fn).__name__.startswith("_Attention")
    assert all(torch.equal(a, b) for a, b in zip(torch.autograd.grad(o, (q, k, v), grad_o), with_ops))


def test_grouped_gemm_with_gradients_skips_its_custom_ops_and_computes_what_they_do(monkeypatch):
    x, w = torch.randn(21, 8, requires_grad=True), torch.randn(3, 8, 5, requires_grad=True)
    offsets = torch.tensor([6, 6, 21], dtype=torch.int32)
    grad_y = torch.randn(21, 5)
    with _Seen():   # a dispatch mode watches: the custom ops run, forward and backward
        with_ops = torch.autograd.grad(kernels.grouped_gemm(x, w, offsets), (x, w), grad_y)
    monkeypatch.setattr(grouped_ops, "_grouped_gemm", _refuse)
    monkeypatch.setattr(grouped_ops, "_grouped_gemm_dw", _refuse)
    y = kernels.grouped_gemm(x, w, offsets)
    assert type(y.grad_fn).__name__ == "_GroupedGemmBackward"
    assert all(torch.equal(a, b) for a, b in zip(torch.autograd.grad(y, (x, w), grad_y), with_ops))


def test_a_kept_kind_gives_the_path_of_the_tensors_it_was_taken_of():
    """A launch plan keeps its inputs' kind (their types and requires_grad are in its key) and
    passes it as ``known``: the answer is the one the tensors themselves give, in every mode."""
    from torch._subclasses.fake_tensor import FakeTensor
    plain, grad = torch.randn(2, 3), torch.randn(2, 3, requires_grad=True)
    weight = torch.nn.Parameter(torch.randn(3, 2))
    with FakeTensorMode():
        fake = torch.randn(2, 3)
    assert isinstance(fake, FakeTensor)
    groups = [(plain,), (plain, weight), (grad, plain), (plain, fake), (weight.detach(),)]
    assert [eager.kind(*g) for g in groups] == [eager.PLAIN, eager.AUTOGRAD, eager.AUTOGRAD,
                                                eager.CUSTOM_OP, eager.PLAIN]
    for context in (contextlib.nullcontext, torch.no_grad, lambda: torch.autocast("cpu", dtype=torch.bfloat16)):
        for g in groups:
            with context():
                assert eager.path(known=eager.kind(*g)) == eager.path(*g), (context, g)


class _RecordsWrapping(torch.autograd.Function):
    wrapped: list[bool] = []   # per forward: was x a functorch wrapper there

    @staticmethod
    def forward(ctx, x, extra):
        _RecordsWrapping.wrapped.append(torch._C._functorch.is_functorch_wrapped_tensor(x))
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        return grad * 2, None


def test_applier_is_the_functions_apply_outside_transforms():
    """The op's Function without torch's Python preamble: the same node and gradient, a tensor
    left wrapped by a finished transform unwrapped as torch's apply unwraps it, and a Function
    with setup_context (whose apply binds defaults) refused."""
    apply = eager.applier(_RecordsWrapping, tensors=1)
    x = torch.randn(3, requires_grad=True)
    y = apply(x, "not a tensor")
    assert type(y.grad_fn).__name__ == "_RecordsWrappingBackward"
    y.sum().backward()
    assert torch.equal(x.grad, torch.full((3,), 2.0))
    leaked = []
    torch.func.grad(lambda t: leaked.append(t) or t.sum())(torch.randn(3))
    assert torch._C._functorch.is_functorch_wrapped_tensor(leaked[0])   # dead now
    _RecordsWrapping.wrapped.clear()
    assert torch.equal(apply(leaked[0], None), _RecordsWrapping.apply(leaked[0], None))
    assert _RecordsWrapping.wrapped == [False, False]

    class WithSetup(torch.autograd.Function):
        @staticmethod
        def forward(x):
            return x

        @staticmethod
        def setup_context(ctx, inputs, output):
            pass

    with pytest.raises(TypeError, match="setup_context"):
        eager.applier(WithSetup, tensors=1)


def test_linear_unwraps_an_input_a_finished_transform_left_wrapped():
    """nn.Linear makes eager.applier's call inline (kernels.gemm.linear.linear): an x leaked out of
    torch.func.grad, now a dead wrapper with no storage of its own, is unwrapped as
    Function.apply unwraps it, so the launch reads the tensor it wraps."""
    leaked = []
    torch.func.grad(lambda t: leaked.append(t) or t.sum())(torch.randn(3, 5))
    x = leaked[0]
    assert torch._C._functorch.is_functorch_wrapped_tensor(x)   # dead now
    weight, bias = torch.randn(4, 5, requires_grad=True), torch.randn(4, requires_grad=True)
    y = linear(x, weight, bias)
    assert type(y.grad_fn).__name__ == "_LinearBackward"
    plain = eager.unwrap(x)
    torch.testing.assert_close(y, torch.nn.functional.linear(plain, weight, bias))
    y.sum().backward()
    torch.testing.assert_close(weight.grad, plain.sum(0).expand(4, 5))


@pytest.mark.parametrize("grad", ["dense", "sum"])
@pytest.mark.parametrize("x_layout", ["contiguous", "strided"])
@pytest.mark.parametrize("watched", [False, True], ids=["eager", "custom op"])
def test_linears_weight_gradient_comes_in_the_weights_layout(watched, x_layout, grad):
    """(N, K) row-major like the weight, on the eager Function and on the custom op's formula,
    for a dense output gradient and ``.sum()``'s stride-0 one, and an x whose rows cannot be
    viewed as (M, K): a transposed view would be copied by autograd's gradient accumulation
    every step. The gradients are the float64 ones."""
    layer = kernels.nn.Linear(24, 40)
    x = torch.randn(2, 3, 24) if x_layout == "contiguous" else torch.randn(3, 2, 24).transpose(0, 1)
    x.requires_grad_()
    strides = []
    layer.weight.register_hook(lambda g: strides.append(g.stride()))
    with _Seen() if watched else contextlib.nullcontext():
        y = layer(x)
        y.sum().backward() if grad == "sum" else y.backward(torch.ones_like(y))
    assert strides == [layer.weight.stride()] and layer.weight.grad.stride() == (24, 1)
    x64 = x.detach().double().reshape(6, 24)
    torch.testing.assert_close(layer.weight.grad, (torch.ones(40, 6, dtype=torch.float64) @ x64).float())
    torch.testing.assert_close(x.grad, (torch.ones(6, 40, dtype=torch.float64)
                                        @ layer.weight.detach().double()).reshape(2, 3, 24).float())
    torch.testing.assert_close(layer.bias.grad, torch.full((40,), 6.0))


def test_a_3d_matmul_leaves_the_shared_2d_plan_as_it_was():
    """A GEMM on x (B, M, K) runs v6's kept plan of the flattened (B·M, K) operand with C made in
    (B, M, N) (``LaunchPlan.shaped``, a copy): v6's own plan of that metadata, which a 2-D call
    shares, still makes (B·M, N)."""
    a, b = torch.randn(2, 3, 8), torch.randn(8, 5)
    y3 = kernels.matmul(a, b)
    assert y3.shape == (2, 3, 5) and y3.is_contiguous()
    from kernels.gemm import v6_persistent
    assert v6_persistent.plan(a.reshape(6, 8), b).shape == (6, 5)
    y2 = kernels.matmul(a.reshape(6, 8), b)
    assert y2.shape == (6, 5)
    torch.testing.assert_close(y3.reshape(6, 5), y2, rtol=0, atol=0)
    torch.testing.assert_close(y2, (a.reshape(6, 8).double() @ b.double()).float())


@pytest.mark.parametrize("watched", [False, True], ids=["eager", "custom op"])
@pytest.mark.parametrize("layout", ["NN", "NT", "TN", "TT"])
def test_matmul_gradients_take_their_operands_layouts_as_torchs_mm_does(layout, watched):
    """A column-by-column operand (``w.t()`` of a row-major w) gets its gradient column by
    column, as torch's ``mm`` backward gives it, so a Parameter behind it receives one in its own
    layout; the values are the float64 ones."""
    m, k, n = 6, 8, 5
    a_leaf = torch.randn(m, k, requires_grad=True) if layout[0] == "N" else torch.randn(k, m, requires_grad=True)
    b_leaf = torch.randn(k, n, requires_grad=True) if layout[1] == "N" else torch.randn(n, k, requires_grad=True)
    grad_c = torch.randn(m, n)
    strides = {}
    for name, leaf in (("a", a_leaf), ("b", b_leaf)):
        leaf.register_hook(lambda g, name=name: strides.setdefault(name, []).append(g.stride()))
    a = a_leaf if layout[0] == "N" else a_leaf.t()
    b = b_leaf if layout[1] == "N" else b_leaf.t()
    with _Seen() if watched else contextlib.nullcontext():
        kernels.matmul(a, b).backward(grad_c)
    assert strides == {"a": [a_leaf.stride()], "b": [b_leaf.stride()]}
    want_a, want_b = grad_c.double() @ b.detach().double().t(), a.detach().double().t() @ grad_c.double()
    torch.testing.assert_close(a_leaf.grad, (want_a if layout[0] == "N" else want_a.t()).float())
    torch.testing.assert_close(b_leaf.grad, (want_b if layout[1] == "N" else want_b.t()).float())
