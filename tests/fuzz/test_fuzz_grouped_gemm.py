"""Fuzz ``kernels.grouped_gemm`` against a per-group loop of ``torch.matmul`` (v0, in the
same dtype) by the harness's rule against the float64 loop, forward and backward, over
0-4 groups of 0-9 rows (empty groups, K or N = 0), every layout of x and w, offsets sliced
or offset in their storage, and each dtype the op claims."""
from __future__ import annotations

import itertools

import torch
from hypothesis import given
from hypothesis import strategies as st

import kernels
from fuzzing import (INDEX_LAYOUTS, assert_rule, assert_runs_in_child, index_tensor, judged_baseline,
                     operands, output_grad, sizes, with_grads)
from kernels.moe.grouped_gemm import spec
from kernels.moe.grouped_gemm.v0_loop import loop


@st.composite
def grouped(draw):
    """(x (T, K), w (G, K, N), offsets): the rows of group g end at offsets[g]."""
    rows = draw(st.lists(sizes(), max_size=4))
    k, n = draw(sizes()), draw(sizes())
    x, w = draw(operands(st.just([(sum(rows), k), (len(rows), k, n)]), spec.DTYPES))
    ends = list(itertools.accumulate(rows))
    return x, w, index_tensor(ends, torch.int32, draw(st.sampled_from(INDEX_LAYOUTS)))


@given(case=grouped())
def test_grouped_gemm_matches_the_per_group_loop(case):
    x, w, offsets = case
    grad = output_grad((x.shape[0], w.shape[2]), x.dtype, seed=x.numel())
    out, grads = with_grads(lambda *t: kernels.grouped_gemm(*t, offsets), (x, w), grad)
    reference = lambda *t: spec.reference(*t, offsets)   # noqa: E731
    base, base_grads, spread = judged_baseline(lambda *t: loop(*t, offsets), reference, (x, w), grad)
    ref, ref_grads = with_grads(reference, [t.double() for t in (x, w)], grad.double())
    assert_rule("out", out, ref, base, x.dtype, spread=spread["out"])
    for i, (name, g, r, bg) in enumerate(zip(("dx", "dw"), grads, ref_grads, base_grads)):
        assert_rule(name, g, r, bg, x.dtype, "backward", spread[i])


def test_strided_offsets_are_read_in_bounds():
    """Bug 2, in a child process (it aborted the interpreter): offsets that are a column of
    a (G, 2) tensor give the per-group loop's answer."""
    assert_runs_in_child("""
        import torch, kernels
        from kernels.moe.grouped_gemm import spec
        offsets = torch.tensor([[3, 99], [5, 99], [10, 99]], dtype=torch.int32)[:, 0]
        gen = torch.Generator().manual_seed(0)
        x, w = torch.randn(10, 8, generator=gen), torch.randn(3, 8, 5, generator=gen)
        got = kernels.grouped_gemm(x, w, offsets)
        want = spec.reference(x, w, offsets.contiguous())
        assert torch.allclose(got.double(), want, atol=1e-5), (got - want).abs().max()
    """)


def test_unchecked_offsets_past_t_stay_in_bounds():
    """Bug 2, in a child process (SIGBUS): with ``check_offsets=False`` a last offset past T
    must not make a kernel read or write outside x, w or the output."""
    assert_runs_in_child("""
        import torch, kernels
        offsets = torch.tensor([3, 5, 1 << 20], dtype=torch.int32)
        x, w = torch.randn(10, 8, requires_grad=True), torch.randn(3, 8, 5, requires_grad=True)
        out = kernels.grouped_gemm(x, w, offsets, check_offsets=False)
        out.sum().backward()
        assert out.shape == (10, 5) and x.grad.shape == x.shape and w.grad.shape == w.shape
    """)
