"""Fuzz the GEMMs: ``kernels.matmul``, ``kernels.nn.Linear``, ``kernels.matmul_fp8`` and
``kernels.matmul_mxfp4`` against torch (``torch.matmul``, ``F.linear``, the ``_scaled_mm``
and dequantize-then-matmul baselines of the project's refs) by the harness's rule, over
tiny shapes with 0 and 1, every layout, and each dtype the op claims."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from hypothesis import example, given
from hypothesis import strategies as st

import kernels
from fuzzing import (LAYOUTS, assert_rule, judged_baseline, laid_out, operands, output_grad, sizes,
                     with_grads)
from kernels.gemm import spec as gemm_spec
from kernels.gemm_fp8 import FP8_DTYPES, quantize_fp8
from kernels.gemm_fp8.operands import OUT_DTYPES
from kernels.gemm_mxfp4 import quantize_mxfp4

FP8_SPEC, MXFP4_SPEC = kernels.spec("gemm_fp8"), kernels.spec("gemm_mxfp4")
LAYOUT = st.sampled_from(LAYOUTS)


def _mkn(batch=st.just(()), k_low=0):
    """(a, b) shapes of a (…, M, K) @ (K, N) product."""
    return st.tuples(sizes(), sizes(), sizes(k_low), batch).map(
        lambda d: ((*d[3], d[0], d[2]), (d[2], d[1])))


@given(ab=operands(_mkn(st.sampled_from([(), (0,), (2,)])), gemm_spec.DTYPES))
def test_matmul_matches_torch_matmul(ab):
    a, b = ab
    grad = output_grad((*a.shape[:-1], b.shape[1]), a.dtype, seed=a.numel())
    out, grads = with_grads(kernels.matmul, ab, grad)
    base, base_grads, spread = judged_baseline(torch.matmul, torch.matmul, ab, grad)
    ref, ref_grads = with_grads(torch.matmul, [t.double() for t in ab], grad.double())
    assert_rule("out", out, ref, base, a.dtype, spread=spread["out"])
    for i, (name, g, r, bg) in enumerate(zip(("da", "db"), grads, ref_grads, base_grads)):
        assert_rule(name, g, r, bg, a.dtype, "backward", spread[i])


def _linear_shapes():
    """x (…, in), weight (out, in), bias (out,)."""
    return st.tuples(st.sampled_from([(0,), (1,), (3,), (2, 3)]), sizes(), sizes(1)).map(
        lambda d: ((*d[0], d[1]), (d[2], d[1]), (d[2],)))


@given(xwb=operands(_linear_shapes(), gemm_spec.DTYPES), bias=st.booleans(), autocast=st.booleans())
@example(xwb=(torch.randn(3, 5), torch.randn(4, 5), torch.randn(4)), bias=True,
         autocast=True).via("bug 6: under autocast(bf16) Linear returns what nn.Linear returns")
def test_linear_matches_torch_linear(xwb, bias, autocast):
    """Under ``torch.autocast(bfloat16)`` torch casts fp32 operands to bf16; the result is
    judged in bf16 against the float64 product of the cast operands."""
    x, weight, b = xwb
    theirs = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=bias, dtype=x.dtype)
    with torch.no_grad():
        theirs.weight.copy_(weight)
        if bias:
            theirs.bias.copy_(b)
    ours = kernels.nn.Linear.from_torch(theirs)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        base, got = theirs(x), ours(x)
    judged = torch.bfloat16 if autocast else x.dtype
    exact = [t.detach().to(judged).double() for t in (x, *theirs.parameters())]
    leaves = [t.requires_grad_() for t in exact[1:]]
    ref = F.linear(exact[0], *leaves)
    assert_rule("out", got.detach(), ref.detach(), base.detach(), judged)
    grad = output_grad(base.shape, base.dtype, seed=x.numel())
    got_grads = torch.autograd.grad(got, list(ours.parameters()), grad)
    base_grads = torch.autograd.grad(base, list(theirs.parameters()), grad)
    ref_grads = torch.autograd.grad(ref, leaves, grad.double())
    for name, g, r, bg in zip(("dweight", "dbias"), got_grads, ref_grads, base_grads):
        assert_rule(name, g, r, bg, judged, "backward")


@given(ab=operands(_mkn(), (torch.float32,)), fp8=st.sampled_from(FP8_DTYPES),
       per_channel=st.booleans(), out_dtype=st.sampled_from(OUT_DTYPES),
       layouts=st.tuples(*[LAYOUT] * 4))
@example(ab=(torch.randn(0, 5), torch.randn(5, 3)), fp8=torch.float8_e4m3fn, per_channel=False,
         out_dtype=torch.bfloat16, layouts=("contiguous",) * 4
         ).via("bug 8: quantize_fp8 of an empty tensor")
@example(ab=(torch.randn(1, 1), torch.randn(1, 1)), fp8=torch.float8_e4m3fn, per_channel=True,
         out_dtype=torch.bfloat16, layouts=("contiguous",) * 3 + ("sliced",)
         ).via("bug 10: the ref rung passed a (1, 1) scale of stride 2 to torch._scaled_mm")
def test_matmul_fp8_has_scaled_mm_semantics(ab, fp8, per_channel, out_dtype, layouts):
    """Operands quantized by ``quantize_fp8`` (per tensor, or per row of A and column of B),
    stored with their per-channel scales in drawn layouts; judged against the float64
    product of the dequantized operands, with ``torch._scaled_mm`` (the ``ref`` rung) as
    the baseline."""
    a, b = ab
    a8, scale_a = quantize_fp8(a, fp8, "row" if per_channel else "tensor")
    b8, scale_b = quantize_fp8(b, fp8, "col" if per_channel else "tensor")
    a8, b8 = laid_out(a8, layouts[0]), laid_out(b8, layouts[1], dim=1)
    if per_channel:
        scale_a, scale_b = laid_out(scale_a, layouts[2]), laid_out(scale_b, layouts[3], dim=1)
    got = kernels.matmul_fp8(a8, b8, scale_a, scale_b, out_dtype)
    ref = FP8_SPEC.reference(a8, b8, scale_a, scale_b)
    if got.numel() == 0 or a.shape[1] == 0:   # as torch._scaled_mm: empty, or zeros for K = 0
        assert got.dtype == out_dtype and torch.equal(got, ref.to(out_dtype))
        return
    base = kernels.get("gemm_fp8", "ref")(a8, b8, scale_a, scale_b, out_dtype=out_dtype)
    assert_rule("out", got, ref, base, out_dtype)


@given(ab=operands(_mkn(k_low=1).map(lambda s: (s[0], s[1][::-1])), (torch.float32,)),
       out_dtype=st.sampled_from(OUT_DTYPES), layouts=st.tuples(*[LAYOUT] * 4))
@example(ab=(torch.randn(0, 32), torch.randn(3, 32)), out_dtype=torch.bfloat16,
         layouts=("contiguous",) * 4).via("bug 8: matmul_mxfp4 refuses M = 0")
def test_matmul_mxfp4_matches_dequantized_matmul(ab, out_dtype, layouts):
    """A (M, K) and Bᵀ (N, K) quantized by ``quantize_mxfp4`` (K padded to 32), stored in
    drawn layouts; judged against the float64 product of the dequantized operands, with
    dequantize-to-bf16 + ``torch.matmul`` (the ``ref`` rung) as the baseline."""
    a, b_t = ab
    stored = [laid_out(t, layout) for t, layout in
              zip((*quantize_mxfp4(a, axis=1), *quantize_mxfp4(b_t, axis=1)), layouts)]
    got = kernels.matmul_mxfp4(*stored, out_dtype=out_dtype)
    ref = MXFP4_SPEC.reference(*stored)
    base = (ref.to(out_dtype) if got.numel() == 0
            else kernels.get("gemm_mxfp4", "ref")(*stored, out_dtype=out_dtype))
    assert_rule("out", got, ref, base, out_dtype)
