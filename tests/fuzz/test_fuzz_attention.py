"""Fuzz attention: ``kernels.flash_attention`` against SDPA and ``kernels.flash_attention_varlen``
against SDPA run sequence by sequence, forward and backward, by the harness's rule against
the float64 reference, over tiny shapes with 0 and 1 (batch, heads, lengths), GQA, causal,
scales (default, 0, negative, tiny), every layout and each dtype the op claims; the
varlen offsets also come sliced or offset in their storage."""
from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from hypothesis import example, given
from hypothesis import strategies as st

import kernels
from fuzzing import (INDEX_LAYOUTS, assert_rule, assert_runs_in_child, index_tensor,
                     judged_baseline, laid_out, operands, output_grad, sizes, with_grads)
from flash_rounding import flash_rounding
from kernels.attention import spec as attn_spec
from kernels.validate import fp32_argument
from workbench.harness.tolerances import reassociation_bound
from attention_inputs import large_score_inputs
from varlen_reference import per_sequence

SCALES = st.one_of(st.none(), st.sampled_from([0.0, -0.5, 1e-3]), st.floats(-2.0, 2.0))


def _shapes():
    """q (B, Hkv·group, S, D), k and v (B, Hkv, S_k, D); group 0 is Hq = 0."""
    return st.tuples(sizes(0, 2), sizes(1, 2), sizes(0, 3), sizes(), sizes(), sizes(1, 24)).map(
        lambda d: ((d[0], d[1] * d[2], d[3], d[5]), *[(d[0], d[1], d[4], d[5])] * 2))


def _qkv(*shapes):
    """Explicit examples: seeded fp32 q, k, v of these shapes."""
    gen = torch.Generator().manual_seed(0)
    return tuple(torch.randn(s, generator=gen) for s in shapes)


def _one_query_fp16():
    """A false alarm the long profile drew: fp16, one query, two keys, D = 2, v column-major.
    dq cancels, and ours is off by a few fp16 ulps, as SDPA's CPU flash kernel is on contiguous
    inputs; for strided ones SDPA takes its math path, more precise in fp16, and the bound
    followed that alone. The baseline now runs contiguous copies too."""
    kv = torch.randn(1, 1, 2, 2, generator=torch.Generator().manual_seed(0)).half()
    return kv[:, :, :1].clone(), kv.clone(), laid_out(kv, "transposed")


def _two_keys_fp16():
    """The long profile's draw: fp16, D = 1, q stored 3 elements into its storage. SDPA's CPU
    kernel gives NaN gradients there (causal, scale -2), which left the bound at fp16's floor."""
    kv = torch.tensor([[[[1.5410], [-0.2935]]]], dtype=torch.float16)
    return laid_out(kv, "offset"), kv.clone(), kv.clone()


def _large_scores(largest):
    """Bug 4's inputs: fp32 scores of about ``largest``, exact in any summation order (with
    fine inputs the verdict at such scores depends on the CPU's BLAS kernel)."""
    return large_score_inputs((1, 2, 1, 9, 9, 16, 0), largest)


def _sdpa(causal, scale):
    return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale,
                                                          enable_gqa=True)


def _sdpa_math(causal, scale):
    """SDPA's math backend, one more baseline sample: its default CPU kernel gives NaN for
    causal rows under a scale <= 0 (tests/test_attention_ladder.py xfails that as a rung)."""
    def attend(q, k, v):
        with sdpa_kernel(SDPBackend.MATH):
            return _sdpa(causal, scale)(q, k, v)
    return attend


def _sdpa_negated(causal, scale):
    """SDPA's default kernel on the same problem with q and the scale negated (both exact). Under
    a scale < 0, where that kernel gives NaN, this is the sample of its flash algorithm's
    rounding (dK and dQ from the output rounded to the input dtype, as every flash backward
    computes them) that the math backend, more precise than any flash kernel, cannot stand in for."""
    return lambda q, k, v: _sdpa(causal, -scale)(-q, k, v)


def _torch_also(causal, scale):
    """The baseline samples beside SDPA's default kernel: the math backend, under a negative
    scale the default kernel on the negated problem, and the rounding every flash backward
    makes (:mod:`flash_rounding`, at the scale the op takes)."""
    negative = scale is not None and scale < 0
    taken = None if scale is None else fp32_argument("scale", scale)
    return (_sdpa_math(causal, scale), *((_sdpa_negated(causal, scale),) if negative else ()),
            flash_rounding(causal, taken))


def _delta_floor(q, k, v, grad, scale) -> tuple[float, float, float]:
    """The floors (:func:`fuzzing.assert_rule`) of dq, dk and dv. A flash backward takes Δ from
    the output (rowsum(dO∘O)) and dP from v (dO·vᵀ) in float32: where dS = P∘(dP − Δ) cancels,
    float32's reassociation of those sums, at most |dO|·|v| each, is left, times the scale in
    dS and times |k| in dq, |q| in dk: 64 float32 ulps of |scale|·max(|q|, |k|)·max|dO|·max|v|.
    dv = Pᵀ dO sums no such difference: no floor."""
    taken = 1.0 / q.shape[-1] ** 0.5 if scale is None else fp32_argument("scale", scale)
    largest = [float(t.detach().abs().max()) if t.numel() else 0.0 for t in (q, k, v, grad)]
    floor = reassociation_bound(torch.float32) * abs(taken) * max(largest[:2]) * largest[3] * largest[2]
    return floor, floor, 0.0


def _reference(causal, scale):
    """The float64 reference at the scale the op takes: float32, 0 under its normal numbers
    (:func:`kernels.validate.fp32_argument`; the docstrings say so)."""
    taken = None if scale is None else fp32_argument("scale", scale)
    return lambda *t: attn_spec.reference(*t, causal, taken)


def _two_by_two_fp16():
    """The long profile's draw: fp16, S = S_k = D = 2, v column-major, taken causal under scale
    -0.5: dk off by more than torch's samples allowed, from the flash backward's
    Δ of the output rounded to fp16 (:mod:`flash_rounding`), which no torch sample showed."""
    q = torch.randn(1, 1, 2, 2, generator=torch.Generator().manual_seed(0)).half()
    v = torch.randn(1, 1, 2, 2, generator=torch.Generator().manual_seed(1)).half()
    return q, q.clone(), v.transpose(-1, -2).contiguous().transpose(-1, -2)


@given(qkv=operands(_shapes(), attn_spec.DTYPES), causal=st.booleans(), scale=SCALES)
@example(qkv=_qkv((1, 2, 5, 8), (1, 1, 6, 8), (1, 1, 6, 8)), causal=False, scale=0.0
         ).via("bug 3: scale 0 is the mean of v")
@example(qkv=_qkv((1, 2, 5, 8), (1, 1, 6, 8), (1, 1, 6, 8)), causal=True, scale=-0.5
         ).via("bug 3: a negative scale is a valid softmax")
@example(qkv=_large_scores(1e2), causal=False, scale=None).via("bug 4: fp32 at scores near 1e2")
@example(qkv=_large_scores(1e3), causal=True, scale=None).via("bug 4: fp32 at scores near 1e3")
@example(qkv=_qkv((0, 2, 3, 8), (0, 1, 3, 8), (0, 1, 3, 8)), causal=False, scale=None).via("bug 5: B = 0")
@example(qkv=_qkv((1, 0, 3, 8), (1, 1, 3, 8), (1, 1, 3, 8)), causal=False, scale=None).via("bug 5: Hq = 0")
@example(qkv=_qkv((1, 2, 0, 8), (1, 1, 3, 8), (1, 1, 3, 8)), causal=True, scale=None).via("bug 5: S = 0")
@example(qkv=_qkv((1, 2, 3, 8), (1, 1, 0, 8), (1, 1, 0, 8)), causal=False, scale=None).via("bug 5: S_k = 0")
@example(qkv=_two_keys_fp16(), causal=True, scale=-2.0
         ).via("the fuzz's rule: SDPA's CPU kernel is NaN for a causal row under a negative scale")
@example(qkv=_one_query_fp16(), causal=False, scale=None).via("the fuzz's rule: SDPA's contiguous kernel")
@example(qkv=_qkv((1, 2, 5, 8), (1, 1, 6, 8), (1, 1, 6, 8)), causal=False, scale=1.5e-204
         ).via("bug 9: a scale under float32's smallest normal number")
@example(qkv=_two_by_two_fp16(), causal=True, scale=-0.5).via("the fuzz's rule: the flash backward's rounding of O")
def test_flash_attention_matches_sdpa(qkv, causal, scale):
    q = qkv[0]
    grad = output_grad(q.shape, q.dtype, seed=q.numel())
    out, grads = with_grads(lambda *t: kernels.flash_attention(*t, causal=causal, scale=scale), qkv, grad)
    reference = _reference(causal, scale)
    base, base_grads, spread = judged_baseline(_sdpa(causal, scale), reference, qkv, grad,
                                               also=_torch_also(causal, scale))
    ref, ref_grads = with_grads(reference, [t.double() for t in qkv], grad.double())
    assert_rule("out", out, ref, base, q.dtype, spread=spread["out"])
    for i, (name, g, r, bg) in enumerate(zip(("dq", "dk", "dv"), grads, ref_grads, base_grads)):
        assert_rule(name, g, r, bg, q.dtype, "backward", spread[i], _delta_floor(*qkv, grad, scale)[i])


@pytest.mark.parametrize("causal", [False, True])
def test_the_flash_rounding_sample_is_the_reference_but_for_one_rounding(causal):
    """The sample that widens the rule's bound (:mod:`flash_rounding`) must not widen it by
    more than its one rounding: on float32 inputs, where rounding O to float32 moves Δ by
    float32's eps, its output and gradients are the float64 reference's to 1e-6 (GQA, S != S_k)."""
    q, k, v = _qkv((2, 4, 5, 8), (2, 2, 7, 8), (2, 2, 7, 8))
    grad = output_grad(q.shape, q.dtype, seed=1)
    sample, sample_grads = with_grads(flash_rounding(causal, None), (q, k, v), grad)
    ref, ref_grads = with_grads(_reference(causal, None), [t.double() for t in (q, k, v)], grad.double())
    for got, want in zip((sample, *sample_grads), (ref, *ref_grads)):
        assert got.dtype == torch.float32 and (got.double() - want).abs().max() <= 1e-6 * want.abs().max()


def test_flash_attention_under_autocast_returns_what_sdpa_returns():
    """Bug 6: fp32 operands under ``autocast(bfloat16)``: SDPA computes and returns bf16."""
    q, k, v = _qkv((1, 2, 5, 16), (1, 2, 7, 16), (1, 2, 7, 16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        base, got = _sdpa(False, None)(q, k, v), kernels.flash_attention(q, k, v)
    ref = attn_spec.reference(*(t.bfloat16() for t in (q, k, v)))
    assert_rule("out", got, ref, base, torch.bfloat16)


@st.composite
def packed(draw):
    """(q, k, v, cu_q, cu_k, max_q, max_k): 0-3 sequences of 0-9 queries, keys >= 1 where a
    sequence has queries (none is an error), the offsets int32 in a drawn layout."""
    lengths_q = draw(st.lists(sizes(), max_size=3))
    lengths_k = [draw(sizes(1 if n else 0)) for n in lengths_q]
    hkv, group, d = draw(sizes(1, 2)), draw(sizes(1, 3)), draw(sizes(1, 24))
    q, k, v = draw(operands(st.just([(sum(lengths_q), hkv * group, d), *[(sum(lengths_k), hkv, d)] * 2]),
                            attn_spec.DTYPES))
    cu = [index_tensor([0, *itertools.accumulate(n)], torch.int32, draw(st.sampled_from(INDEX_LAYOUTS)))
          for n in (lengths_q, lengths_k)]
    extra = draw(sizes(0, 2))
    return q, k, v, *cu, max(lengths_q, default=0) + extra, max(lengths_k, default=0) + extra


def _zero_tokens():
    """Bug 5's varlen case: no tokens at all (one empty sequence)."""
    empty = torch.zeros(0, 2, 8)
    cu = torch.zeros(2, dtype=torch.int32)
    return empty, empty.clone(), empty.clone(), cu, cu.clone(), 0, 0


def _one_key():
    """The long profile's draw: an empty sequence, then one token with one key, fp32, D = 16: dq
    is 0 in exact arithmetic (a softmax over one key is 1), ours fp32 rounding noise just over
    the floor the rule applied when it divided by the reference's own zero."""
    gen = torch.Generator().manual_seed(0)
    q, v = torch.randn(1, 2, 16, generator=gen), torch.randn(1, 2, 16, generator=gen)
    cu = torch.tensor([0, 0, 1], dtype=torch.int32)
    return q, q.clone(), v, cu, cu.clone(), 1, 1


def _two_sequences():
    """Two short sequences, contiguous offsets: the explicit examples' packed batch."""
    q, k, v = _qkv((7, 2, 8), (9, 1, 8), (9, 1, 8))
    return q, k, v, torch.tensor([0, 3, 7], dtype=torch.int32), torch.tensor([0, 5, 9], dtype=torch.int32), 4, 5


def _empty_then_two_tokens():
    """The long profile's draw: two empty sequences, then one of two fp16 tokens, D = 1."""
    t = torch.tensor([[[1.5410]], [[-0.2935]]], dtype=torch.float16)
    cu = torch.tensor([0, 0, 0, 2], dtype=torch.int32)
    return t, t.clone(), t.clone(), cu, cu.clone(), 2, 2


def _empty_one_two():
    """The long profile's draw: an empty sequence, one of one token, one of two, fp16, D = 1."""
    t = torch.tensor([[[1.5410]], [[-0.2935]], [[-2.1797]]], dtype=torch.float16)
    cu = torch.tensor([0, 0, 1, 3], dtype=torch.int32)
    return t, t.clone(), t.clone(), cu, cu.clone(), 2, 2


def _one_key_beside_others():
    """The long profile's draw: a sequence of one key beside two of three, fp32, D = 2. dk of the
    one-key sequence is 0 in exact arithmetic; ours (the flash backward's Δ = rowsum(dO∘O), as
    every flash kernel computes it) is float32 rounding noise at that sequence's scale, which the
    rule judged against the largest dk of the whole batch; torch's math kernel gets Δ and dP
    from the same products and so exactly 0. Within dk's floor (:func:`_delta_floor`)."""
    q, k, v = (torch.randn(7, 2, 2, generator=torch.Generator().manual_seed(seed)) for seed in (1, 0, 540))
    return (q, k, v, torch.tensor([0, 1, 4, 7], dtype=torch.int32),
            torch.tensor([0, 3, 6, 7], dtype=torch.int32), 3, 3)


def _seeded(*shapes_and_seeds):
    return [torch.randn(shape, generator=torch.Generator().manual_seed(seed)) for shape, seed in shapes_and_seeds]


def _first_query_sees_one_key():
    """The long profile's draw: one sequence of 5 queries over 2 keys, fp32, D = 21 (taken causal):
    the first query sees one key, so its row of dS is zero in exact arithmetic and ours float32
    noise, which dk sums into a small element; the rule, relative to dk's largest alone, counted
    it as an error (torch's kernels get Δ and dP from the same products, and so exact zeros)."""
    q, k, v = _seeded(((5, 1, 21), 0), ((2, 1, 21), 0), ((2, 1, 21), 0))
    return q, k, v, torch.tensor([0, 5], dtype=torch.int32), torch.tensor([0, 2], dtype=torch.int32), 5, 2


@given(case=packed(), causal=st.booleans(), scale=SCALES)
@example(case=_two_sequences(), causal=False, scale=0.0).via("bug 3: varlen, scale 0 is the mean of v")
@example(case=_two_sequences(), causal=True, scale=-0.5).via("bug 3: varlen, a negative scale")
@example(case=_zero_tokens(), causal=False, scale=None).via("bug 5: varlen with zero tokens")
@example(case=_one_key(), causal=False, scale=1.0).via("the fuzz's rule: a gradient zero in exact arithmetic")
@example(case=_two_sequences(), causal=False, scale=1.5e-204).via("bug 9: varlen, a scale under float32's normals")
@example(case=_empty_then_two_tokens(), causal=True, scale=1.8e-154
         ).via("the scale the op takes: under float32's normals it is 0, and so are dk and dq")
@example(case=_empty_one_two(), causal=True, scale=-1.0
         ).via("the fuzz's rule: under a negative scale, torch's flash kernel on the negated query")
@example(case=_one_key_beside_others(), causal=False, scale=None
         ).via("the fuzz's rule: a sequence's zero gradient, float32 noise at the problem's magnitude")
@example(case=_first_query_sees_one_key(), causal=True, scale=-0.5
         ).via("the fuzz's rule: a row of dS zero in exact arithmetic, summed into dk")
def test_flash_attention_varlen_matches_sdpa_per_sequence(case, causal, scale):
    q, k, v, cu_q, cu_k, max_q, max_k = case
    grad = output_grad(q.shape, q.dtype, seed=q.numel())
    out, grads = with_grads(lambda *t: kernels.flash_attention_varlen(
        *t, cu_q, cu_k, max_q, max_k, causal=causal, scale=scale), (q, k, v), grad)
    if q.shape[0] == 0:   # nothing to attend: no rows, zero gradients for the keys
        assert out.shape == q.shape and out.dtype == q.dtype
        assert all(g.shape == t.shape and not g.any() for g, t in zip(grads, (q, k, v)))
        return
    reference = lambda *t: per_sequence(_reference(causal, scale), *t, cu_q, cu_k)   # noqa: E731
    base, base_grads, spread = judged_baseline(
        lambda *t: per_sequence(_sdpa(causal, scale), *t, cu_q, cu_k), reference, (q, k, v), grad,
        also=tuple(lambda *t, fn=fn: per_sequence(fn, *t, cu_q, cu_k) for fn in _torch_also(causal, scale)))
    ref, ref_grads = with_grads(reference, [t.double() for t in (q, k, v)], grad.double())
    assert_rule("out", out, ref, base, q.dtype, spread=spread["out"])
    for i, (name, g, r, bg) in enumerate(zip(("dq", "dk", "dv"), grads, ref_grads, base_grads)):
        assert_rule(name, g, r, bg, q.dtype, "backward", spread[i], _delta_floor(q, k, v, grad, scale)[i])


def test_varlen_reads_strided_offsets_in_bounds():
    """Bug 1, in a child process (it aborted the interpreter): offsets that are every other
    element of their storage give what their contiguous copies give."""
    assert_runs_in_child("""
        import torch, kernels
        cu_q = torch.tensor([0, 99, 5, 99, 14, 99, 17, 99], dtype=torch.int32)[::2]
        cu_k = torch.tensor([0, 99, 4, 99, 12, 99, 15, 99], dtype=torch.int32)[::2]
        gen = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(n, 2, 16, generator=gen) for n in (17, 15, 15))
        got = kernels.flash_attention_varlen(q, k, v, cu_q, cu_k, 9, 8)
        want = kernels.flash_attention_varlen(q, k, v, cu_q.contiguous(), cu_k.contiguous(), 9, 8)
        assert torch.equal(got, want), (got - want).abs().max()
    """)
