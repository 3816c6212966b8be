"""kernels.eager.direct: a plain eager call that needs no gradient skips the custom op; anything
that traces, transforms, casts or differentiates still sees it."""
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
from kernels.gemm import ops as gemm_ops
from kernels.gemm_fp8 import ops as fp8_ops
from kernels.moe.grouped_gemm import ops as grouped_ops
from kernels.moe.layer_ladder import fused_op
from workbench.harness import host_overhead

# the custom op each benchmark case's public op calls when it does not run directly
CUSTOM_OPS = {"matmul": (gemm_ops, "_matmul_2d"), "nn.Linear": (gemm_ops, "_matmul_2d"),
              "flash_attention": (attention_ops, "_fwd"),
              "flash_attention_varlen": (attention_ops, "_varlen_fwd"),
              "grouped_gemm": (grouped_ops, "_grouped_gemm"), "matmul_fp8": (fp8_ops, "_matmul_fp8"),
              "MoE": (fused_op, "_moe_fused")}


def _refuse(*args):
    raise AssertionError("the custom op was called")


@pytest.mark.parametrize("case", host_overhead.cases(), ids=lambda c: c.op)
def test_an_untraced_call_without_gradients_skips_the_custom_op(case, monkeypatch):
    assert set(CUSTOM_OPS) == {c.op for c in host_overhead.cases()}
    monkeypatch.setattr(*CUSTOM_OPS[case.op], _refuse)
    call = case.ours()
    with torch.no_grad(), host_overhead.stubbed_launches() as seen:
        call()
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
    "grad": lambda a, b: (a.requires_grad_(), contextlib.nullcontext())[1],
    "autocast": lambda a, b: torch.autocast("cpu", dtype=torch.bfloat16),
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
        assert not eager.direct(a, b, autocast=True)
        c = kernels.matmul(a, b)
    assert called == [1]
    if watcher == "grad":
        assert c.grad_fn is not None
    if watcher == "autocast":
        assert c.dtype == torch.bfloat16


def test_autocast_matters_only_to_an_op_with_an_autocast_rule():
    a = torch.randn(2, 2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert eager.direct(a) and not eager.direct(a, autocast=True)


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


def test_a_layer_whose_weight_needs_a_gradient_goes_through_the_custom_op_outside_no_grad(monkeypatch):
    layer = kernels.nn.Linear(3, 5)
    called = []
    real = gemm_ops._matmul_2d
    monkeypatch.setattr(gemm_ops, "_matmul_2d", lambda *args: called.append(1) or real(*args))
    assert layer(torch.randn(2, 3)).grad_fn is not None and called == [1]
    with torch.no_grad():
        layer(torch.randn(2, 3))
    assert called == [1]


def test_export_sees_the_custom_op(monkeypatch):
    monkeypatch.setattr(gemm_ops, "_matmul_impl", _refuse)   # only the custom op's own copy runs

    class Model(torch.nn.Module):
        def forward(self, a, b):
            return kernels.matmul(a, b)

    with torch.no_grad():
        exported = torch.export.export(Model(), (torch.randn(4, 3), torch.randn(3, 5)))
    assert "torch.ops.kernels.matmul.default" in exported.graph_module.code
