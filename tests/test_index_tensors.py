"""Integer tensors that ops index with (group offsets, cu_seqlens, top-k ids, permutations,
indexed scales): any layout reads as its values, and no value moves a kernel outside its
operands, even with the host checks turned off.

Every test here runs under the interpreter's bounds guard
(:func:`workbench.learn.exercises.guards.triton_bounds`): a Triton load or store outside the
tensors of its launch raises :class:`~workbench.learn.exercises.guards.OutOfBounds` before it
touches memory, so a regression fails its test instead of corrupting the process.
Shapes stay tiny: each interpreted program costs ~1 ms.
"""
from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

import kernels
from kernels.comm.ep_layout import dispatch_layout
from kernels.gemm_fp8 import fp8_dtype
from kernels.moe import aux_loss, expert_counts, permute, route, unpermute
from kernels.moe.grouped_gemm import spec
from kernels.moe.grouped_gemm_fp8.quantize import wgrad_operand
from kernels.moe.grouped_gemm_fp8.quantize_ref import wgrad_rowwise_reference
from kernels.moe.layer_ladder.v3_fused import fused_experts
from kernels.outputs import poisoned_outputs
from workbench.learn.exercises import guards

GROUPED = [pytest.param(r, id=r.label) for r in kernels.variants("grouped_gemm") if r.runs_here()]
UNCHECKED = [pytest.param(r, id=r.label) for r in kernels.variants("grouped_gemm")
             if r.runs_here() and r.kind == "triton" and r.label != "v1"]   # v1 slices on the host


@pytest.fixture(autouse=True)
def bounds_guard():
    with guards.triton_bounds():
        yield


def _root(error: BaseException) -> BaseException:
    while error.__cause__ is not None:
        error = error.__cause__
    return error


@triton.jit
def _load_one_past(src, dst, N):
    tl.store(dst, tl.load(src + N))


def test_the_bounds_guard_is_on_in_this_file():
    src = torch.zeros(4)
    with pytest.raises(Exception) as caught:
        _load_one_past[(1,)](src, torch.empty(1), 4)
    assert isinstance(_root(caught.value), guards.OutOfBounds)


# ---- layouts: a strided, sliced, stride-0 or storage-offset index reads as its values -----

def _padded(values, dtype=torch.int32):
    """``values`` as a strided view: every other element of a buffer padded with 99."""
    buffer = torch.full((len(values), 2), 99, dtype=dtype)
    buffer[:, 0] = torch.tensor(values, dtype=dtype)
    return buffer[:, 0]


def _layouts(values, dtype=torch.int32):
    """The same numbers as a strided view, a packed slice at a storage offset, and a column
    of a matrix (strided and offset)."""
    storage = torch.tensor([7, *values], dtype=dtype)
    column = torch.tensor([[-5, v, 99] for v in values], dtype=dtype)[:, 1]
    return {"strided": _padded(values, dtype), "storage offset": storage[1:], "column": column}


def _loop(x, w, ends):
    """The grouped GEMM of non-decreasing row ``ends`` as a loop of matmuls, rows past the
    last end zero."""
    return _grouped_loop(x, w, list(zip([0, *ends[:-1]], ends)))


def test_issue_reproduction_strided_offsets_give_the_per_group_loop():
    x, w = torch.randn(10, 8), torch.randn(3, 8, 8)
    offsets = torch.tensor([[3, 99], [5, 99], [10, 99]], dtype=torch.int32)[:, 0]
    out = kernels.grouped_gemm(x, w, offsets)
    torch.testing.assert_close(out, _loop(x, w, [3, 5, 10]))


@pytest.mark.parametrize("rung", GROUPED)
@pytest.mark.parametrize("layout", ["strided", "storage offset", "column"])
def test_every_grouped_gemm_rung_reads_offsets_in_any_layout(rung, layout):
    x, w, _ = spec.make_inputs((13, 8, 12, 3, 0), seed=1)
    dense = torch.tensor([4, 4, 13], dtype=torch.int32)
    odd = _layouts([4, 4, 13])[layout]
    assert not odd.is_contiguous() or odd.storage_offset()
    outputs = []
    for offsets in (dense, odd):
        xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
        out = rung(xg, wg, offsets)
        out.backward(torch.ones_like(out))
        outputs.append((out, xg.grad, wg.grad))
    for got, want in zip(outputs[1], outputs[0]):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(outputs[0][0], _loop(x, w, [4, 4, 13]))


def test_public_grouped_gemm_takes_stride_0_offsets():
    """A stride-0 view (one value expanded): every row in group 0, the others empty."""
    x, w = torch.randn(6, 8), torch.randn(3, 8, 4)
    offsets = torch.tensor([6], dtype=torch.int32).expand(3)
    for check in (True, False):
        out = kernels.grouped_gemm(x, w, offsets, check_offsets=check)
        torch.testing.assert_close(out, _loop(x, w, [6, 6, 6]))


def test_public_grouped_gemm_fp8_reads_offsets_and_scales_in_any_layout():
    x, sx, w, sw, _ = kernels.spec("grouped_gemm_fp8").make_inputs((13, 16, 12, 3, 0), fp8_dtype())
    dense = torch.tensor([5, 5, 13], dtype=torch.int32)
    want = kernels.grouped_gemm_fp8(x, sx, w, sw, dense)
    strided_sx = torch.stack([sx, torch.full_like(sx, 99.0)], 1)[:, 0]
    strided_sw = _column_major(sw)
    for offsets in _layouts([5, 5, 13]).values():
        for check in (True, False):
            got = kernels.grouped_gemm_fp8(x, strided_sx, w, strided_sw, offsets, check_offsets=check)
            torch.testing.assert_close(got, want, rtol=0, atol=0)


# ---- varlen attention: cu_seqlens ------------------------------------------------------

def _varlen(cu_q, cu_k, q, k, v):
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    out = kernels.flash_attention_varlen(q, k, v, cu_q, cu_k, 9, 8)
    out.backward(torch.ones_like(out))
    return out, q.grad, k.grad, v.grad


def test_issue_reproduction_strided_cu_seqlens_read_as_their_values():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(t, 2, 8, generator=gen) for t in (17, 16, 16))
    cu_q = torch.tensor([0, 99, 5, 99, 14, 99, 17, 99], dtype=torch.int32)[::2]
    cu_k = torch.tensor([0, 99, 4, 99, 12, 99, 16, 99], dtype=torch.int32)[::2]
    got = _varlen(cu_q, cu_k, q, k, v)
    want = _varlen(cu_q.contiguous(), cu_k.contiguous(), q, k, v)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    # and the answer is attention within each sequence
    for (q0, q1), (k0, k1) in zip(zip([0, 5, 14], [5, 14, 17]), zip([0, 4, 12], [4, 12, 16])):
        dense = torch.nn.functional.scaled_dot_product_attention(
            *(t[a:b].transpose(0, 1) for t, (a, b) in ((q, (q0, q1)), (k, (k0, k1)), (v, (k0, k1)))))
        torch.testing.assert_close(got[0][q0:q1], dense.transpose(0, 1), rtol=1e-5, atol=1e-5)


def test_varlen_cu_seqlens_with_a_storage_offset():
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(t, 2, 8, generator=gen) for t in (17, 16, 16))
    cu_q = torch.tensor([3, 0, 5, 14, 17], dtype=torch.int32)[1:]
    cu_k = torch.tensor([0, 4, 12, 16], dtype=torch.int32).flip(0).flip(0)
    got = _varlen(cu_q, _padded([0, 4, 12, 16]), q, k, v)
    want = _varlen(cu_q.contiguous(), cu_k, q, k, v)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


# ---- unchecked offsets: garbage in, in-bounds garbage out ----------------------------------

def _groups(values, t):
    """(first, end) row of each group as the kernels read any offsets: each clamped to
    [0, T], group g from the previous clamped end to its own, empty if that decreases."""
    ends = [min(max(v, 0), t) for v in values]
    return [(s, max(e, s)) for s, e in zip([0, *ends[:-1]], ends)]


def _grouped_loop(x, w, groups):
    """out[rows of g] = x[rows of g] @ w[g] for disjoint groups; rows in no group zero."""
    out = x.new_zeros((x.shape[0], w.shape[2]))
    for g, (s, e) in enumerate(groups):
        out = out.index_add(0, torch.arange(s, e), x[s:e] @ w[g])
    return out


def _unchecked(rung, x, w, values, grad):
    """out, dx, dw of ``rung`` with ``values`` as offsets, unchecked."""
    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
    out = rung(xg, wg, torch.tensor(values, dtype=torch.int32), check_offsets=False)
    out.backward(grad)
    return out, xg.grad, wg.grad


@pytest.mark.parametrize("rung", UNCHECKED)
@pytest.mark.parametrize("values", [[3, 5, 1 << 30], [3, 5, 20], [-4, 5, 9],
                                    [-(1 << 31), 1 << 30, -1], [10, 10, 10], [4, 4, 7]],
                         ids=["huge end", "end past T", "negative", "extremes", "all in 0", "short"])
def test_unchecked_offsets_are_read_clamped_to_the_rows(rung, values):
    """Offsets that never decrease once clamped: the grouped GEMM of the clamped ends."""
    t = 10
    x, w, _ = spec.make_inputs((t, 8, 12, 3, 0), seed=2)
    groups = _groups(values, t)
    covered = groups[-1][1]
    grad = torch.randn(t, 12, generator=torch.Generator().manual_seed(3))
    grad[covered:] = 0     # rows in no group are unwritten: their values are not defined
    out, dx, dw = _unchecked(rung, x, w, values, grad)
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    want = _grouped_loop(xr, wr, groups)
    want.backward(grad)
    torch.testing.assert_close(out[:covered], want[:covered].detach())
    torch.testing.assert_close(dx[:covered], xr.grad[:covered])
    torch.testing.assert_close(dw, wr.grad)


@pytest.mark.parametrize("rung", UNCHECKED)
def test_unchecked_decreasing_offsets_stay_inside_the_operands(rung):
    """Groups 0 (rows 0:6) and 2 (rows 2:10) overlap: out and dx are not defined there, but
    every access stays inside the operands (the guard) and each group's dw is its own."""
    t = 10
    x, w, _ = spec.make_inputs((t, 8, 12, 3, 0), seed=4)
    grad = torch.randn(t, 12, generator=torch.Generator().manual_seed(5))
    out, dx, dw = _unchecked(rung, x, w, [6, 2, 10], grad)
    assert out.shape == (t, 12) and dx.shape == x.shape
    for g, (s, e) in enumerate(_groups([6, 2, 10], t)):
        torch.testing.assert_close(dw[g], x[s:e].t() @ grad[s:e])


def test_issue_reproduction_unchecked_last_offset_past_t_does_not_crash():
    x, w = torch.randn(10, 8), torch.randn(3, 8, 8)
    offsets = torch.tensor([3, 5, 1 << 30], dtype=torch.int32)
    out = kernels.grouped_gemm(x, w, offsets, check_offsets=False)
    torch.testing.assert_close(out, _loop(x, w, [3, 5, 10]))


def test_rows_past_the_last_clamped_end_are_left_unwritten():
    """In the result and in dx: new outputs start as NaN here, and rows 7: stay NaN."""
    x, w = torch.randn(10, 8, requires_grad=True), torch.randn(3, 8, 8)
    with poisoned_outputs():
        out = kernels.grouped_gemm(x, w, torch.tensor([3, 7, 2], dtype=torch.int32),
                                   check_offsets=False)
        out.backward(torch.ones_like(out))
    torch.testing.assert_close(out[:7], _grouped_loop(x, w, _groups([3, 7, 2], 10))[:7])
    assert out[7:].isnan().all() and x.grad[7:].isnan().all() and not x.grad[:7].isnan().any()


def test_unchecked_fp8_offsets_stay_inside_the_operands():
    x, sx, w, sw, _ = kernels.spec("grouped_gemm_fp8").make_inputs((10, 16, 12, 3, 0), fp8_dtype())
    want = kernels.grouped_gemm_fp8(x, sx, w, sw, torch.tensor([0, 5, 10], dtype=torch.int32))
    got = kernels.grouped_gemm_fp8(x, sx, w, sw, torch.tensor([-3, 5, 1 << 30], dtype=torch.int32),
                                   check_offsets=False)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("values", [[3, 5, 1 << 30], [-(1 << 31), 1 << 30, -1], [6, 2, 10]],
                         ids=["huge end", "extremes", "decreasing"])
def test_unchecked_offsets_keep_the_grouped_quantize_inside_its_operands(values):
    """The row-wise wgrad operand's kernels read each offset clamped to [0, T]: ends that
    never decrease once clamped give the reference's result on the clamped ends, in any
    layout; decreasing ones stay inside the operands (the guard)."""
    t = torch.randn(10, 7, generator=torch.Generator().manual_seed(6))
    clamped = torch.tensor(values, dtype=torch.int64).clamp(0, 10).to(torch.int32)
    for offsets in (torch.tensor(values, dtype=torch.int32), *_layouts(values).values()):
        q, scale = wgrad_operand(t, offsets, "rowwise", torch.float8_e4m3fn)
        assert q.shape == (7, 16) and scale.shape == (3, 7) and not scale.isnan().any()
        if clamped.tolist() == sorted(clamped.tolist()):
            want_q, want_scale = wgrad_rowwise_reference(t, clamped, torch.float8_e4m3fn)
            assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8)) and torch.equal(scale, want_scale)


# ---- the MoE pieces: ids, permutations, routing weights --------------------------------

def _column_major(t):
    return t.t().contiguous().t()


def test_permute_route_counts_and_loss_read_ids_in_any_layout():
    gen = torch.Generator().manual_seed(4)
    x, logits = torch.randn(7, 6, generator=gen), torch.randn(7, 5, generator=gen)
    weights, ids = route(logits, 2)
    for odd in (_column_major(ids), torch.stack([ids, ids + 40], 2)[..., 0]):
        assert not odd.is_contiguous()
        for got, want in zip(permute(x, odd, 5), permute(x, ids, 5)):
            torch.testing.assert_close(got, want, rtol=0, atol=0)
        assert torch.equal(expert_counts(odd, 5), expert_counts(ids, 5))
        assert torch.equal(aux_loss(logits, odd), aux_loss(logits, ids))
        assert torch.equal(dispatch_layout(odd, 5, 1).tokens_per_expert,
                           dispatch_layout(ids, 5, 1).tokens_per_expert)


def test_unpermute_reads_a_strided_permutation():
    gen = torch.Generator().manual_seed(5)
    weights, ids = route(torch.randn(6, 4, generator=gen), 2)
    x_sorted, _, permutation = permute(torch.randn(6, 3, generator=gen), ids, 4)
    odd = _padded(permutation.tolist(), torch.int64)
    assert torch.equal(unpermute(x_sorted, odd, _column_major(weights)),
                       unpermute(x_sorted, permutation, weights))


def test_fused_experts_read_ids_and_weights_in_any_layout():
    gen = torch.Generator().manual_seed(6)
    t, dim, hidden, e, k = 9, 8, 12, 4, 2
    x = torch.randn(t, dim, generator=gen)
    gate, up = torch.randn(e, dim, hidden, generator=gen), torch.randn(e, dim, hidden, generator=gen)
    down = torch.randn(e, hidden, dim, generator=gen)
    weights, ids = route(torch.randn(t, e, generator=gen), k)
    want = fused_experts(x, weights, ids, gate, up, down)
    got = fused_experts(x, _column_major(weights), _column_major(ids), gate, up, down)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def _sorted_rows():
    gen = torch.Generator().manual_seed(7)
    weights, ids = route(torch.randn(3, 4, generator=gen), 2)
    x_sorted, _, permutation = permute(torch.randn(3, 5, generator=gen), ids, 4)
    return x_sorted, permutation, weights


def test_unpermute_refuses_a_repeated_index():
    x_sorted, permutation, weights = _sorted_rows()
    repeated = permutation.clone()
    repeated[1] = repeated[4]
    with pytest.raises(ValueError, match=f"permutation must hold each of 0..5 once; "
                                         f"{int(repeated[4])} appears more than once"):
        unpermute(x_sorted, repeated, weights)


def test_unpermute_refuses_an_index_out_of_range():
    x_sorted, permutation, weights = _sorted_rows()
    for bad in (6, -1):
        wrong = permutation.clone()
        wrong[2] = bad
        with pytest.raises(ValueError, match=f"{bad} is outside that range"):
            unpermute(x_sorted, wrong, weights)


def test_unchecked_unpermute_with_a_repeated_index_reads_only_y_sorted():
    """Without the check: finite rows of y_sorted, the unnamed slot reading row 0."""
    x_sorted, permutation, weights = _sorted_rows()
    repeated = permutation.clone()
    repeated[1] = repeated[4]
    inverse = torch.zeros(6, dtype=torch.int64)
    inverse[repeated] = torch.arange(6)
    want = (x_sorted[inverse].view(3, 2, 5) * weights.unsqueeze(-1)).sum(1)
    got = unpermute(x_sorted, repeated, weights, check_permutation=False)
    torch.testing.assert_close(got, want)
