"""``kernels.flash_attention_varlen``: a packed batch in one launch set, judged per sequence
by the harness's rule against the float64 reference, with SDPA per sequence as the
baseline; launch counts, determinism, torch.compile, the fake kernels and the errors."""
from __future__ import annotations

import contextlib
import itertools

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import kernels
from attention_layouts import fused_heads, gradients, heads_major, sliced_head_dim
from kernels.attention import spec as attn_spec
from kernels.attention import v3_causal_lse, v5_backward
from kernels.outputs import poisoned_outputs
from varlen_reference import per_sequence
from workbench.check import compare

flash_attention_varlen = kernels.flash_attention_varlen   # also registers torch.ops.kernels.flash_attention_varlen_*
KERNELS = [(v3_causal_lse, "_flash_fwd_lse_kernel"), (v5_backward, "_bwd_delta_kernel"),
           (v5_backward, "_bwd_dkdv_kernel"), (v5_backward, "_bwd_dq_kernel")]


def _packed(lengths_q, lengths_k, hq=4, hkv=2, d=32, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(lengths_q), hq, d, generator=gen).to(dtype)
    k, v = (torch.randn(sum(lengths_k), hkv, d, generator=gen).to(dtype) for _ in range(2))
    cu = [torch.tensor([0, *itertools.accumulate(n)], dtype=torch.int32) for n in (lengths_q, lengths_k)]
    return q, k, v, *cu


def _with_grads(fn, q, k, v, grad):
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out = fn(*leaves)
    return out.detach(), gradients(out, leaves, grad)


CASES = {   # lengths_q, lengths_k, Hq, Hkv, D
    "S_k!=S,empty,gqa4:2,d32": ([1, 17, 0, 5], [3, 17, 4, 9], 4, 2, 32),
    "two-blocks,mqa4:1,d64": ([40, 0, 1], [33, 2, 1], 4, 1, 64),
}


def _check_per_sequence(case, causal, dtype, scale=None, layout=None):
    """As ``_check_against_the_reference`` in ``tests/test_attention_ops.py``, per sequence."""
    lq, lk, hq, hkv, d = case
    q, k, v, cu_q, cu_k = _packed(lq, lk, hq, hkv, d, dtype)
    if layout:
        q, k, v = layout(q, k, v)
    grad = torch.randn(q.shape).to(dtype)
    with poisoned_outputs():     # a row or gradient no program writes stays NaN and fails
        out, grads = _with_grads(lambda *a: kernels.flash_attention_varlen(
            *a, cu_q, cu_k, max(lq), max(lk), causal=causal, scale=scale), q, k, v, grad)
    # SDPA's CPU kernel returns NaN for a causal mask at scale <= 0; its math backend does not
    with sdpa_kernel(SDPBackend.MATH) if scale is not None else contextlib.nullcontext():
        base, base_grads = _with_grads(lambda *a: per_sequence(lambda *s: F.scaled_dot_product_attention(
            *s, is_causal=causal, scale=scale, enable_gqa=True), *a, cu_q, cu_k), q, k, v, grad)
    ref, ref_grads = _with_grads(lambda *a: per_sequence(
        lambda *s: attn_spec.reference(*s, causal, scale), *a, cu_q, cu_k),
        *(t.double() for t in (q, k, v)), grad.double())
    assert out.shape == q.shape and out.dtype == dtype
    assert compare(out, ref, base, dtype)["passed"]
    for name, t, g, r, b in zip("qkv", (q, k, v), grads, ref_grads, base_grads):
        assert g.dtype == dtype and compare(g, r, b, dtype, "backward")["passed"], f"d{name}"
        assert g.stride() == torch.empty_like(t).stride(), f"d{name}: {g.stride()} for {name} {t.stride()}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_forward_and_gradients_match_the_reference_per_sequence(case, causal, dtype):
    _check_per_sequence(case, causal, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", [heads_major, fused_heads, sliced_head_dim],
                         ids=["heads-major", "fused-projection", "sliced-head-dim"])
def test_gradients_take_their_operands_layouts(layout, dtype):
    """Packed tensors stored head by head (dense) get gradients with their own strides; heads
    of one (T, (Hq+2·Hkv)·D) projection and a sliced head dim (not dense) get
    ``torch.empty_like``'s dense ones; each element written (outputs poisoned)."""
    _check_per_sequence(([3, 0, 17, 1], [3, 0, 17, 1], 4, 2, 24), True, dtype, layout=layout)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("scale", [0.0, -0.5, 1e-3, None])
def test_any_scale_is_sdpa_math_per_sequence(scale, causal):
    _check_per_sequence(CASES["S_k!=S,empty,gqa4:2,d32"], causal, torch.float32, scale)


def test_the_same_packed_shapes_with_a_longer_sequence_get_a_grid_that_covers_it():
    """A packed launch plan is kept per tensor metadata, and its grid covers max_seqlen_q (the
    programs past a sequence's end return), so the lengths must be in every plan's key (the
    public op's, v4's forward, v5's backward): the same packed shapes with one sequence grown
    past a 32-row block (the interpreter's), its keys' longest length unchanged, get its every
    row written (outputs poisoned) and right, not the grid of the first call's longest sequence."""
    for lengths_q in ([20, 20], [5, 35]):
        _check_per_sequence((lengths_q, [5, 35], 2, 1, 16), True, torch.float32)


@pytest.mark.parametrize("max_seqlen", [0, 3])
@pytest.mark.parametrize("lengths_k", [[0, 0], [3, 2]], ids=["no keys", "keys"])
def test_no_query_tokens_give_an_empty_result(lengths_k, max_seqlen):
    """flash-attn's answer, as SDPA's for S = 0: no rows, and zero gradients for any keys."""
    q, k, v, cu_q, cu_k = _packed([0, 0], lengths_k)
    out, grads = _with_grads(lambda *a: kernels.flash_attention_varlen(
        *a, cu_q, cu_k, max_seqlen, max(max_seqlen, *lengths_k), causal=True), q, k, v, torch.randn(q.shape))
    assert out.shape == (0, 4, 32)
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape] and not any(g.any() for g in grads)


def test_a_batch_of_no_sequences_gives_an_empty_result():
    """cu_seqlens [0]: batch 0, as SDPA's B = 0 (the fuzz suite drew it)."""
    q = torch.randn(0, 2, 8)
    cu = torch.zeros(1, dtype=torch.int32)
    out = kernels.flash_attention_varlen(q, q.clone(), q.clone(), cu, cu.clone(), 0, 0)
    assert out.shape == (0, 2, 8)
    with pytest.raises(ValueError, match="cu_seqlens_q is empty"):   # not even the 0
        kernels.flash_attention_varlen(q, q.clone(), q.clone(), cu[:0], cu[:0], 0, 0)


class _Counted:
    """Counts a kernel's launches: its ``run``, which ``kernel[grid](...)`` calls and a launch
    plan calls itself (kernels.triton_support.run_kwargs)."""

    def __init__(self, kernel, monkeypatch):
        self.run, self.launches = kernel.run, 0
        monkeypatch.setitem(kernel.__dict__, "run", self)   # shadows the class's run; undone, it is gone

    def __call__(self, *args, **kwargs):
        self.launches += 1
        return self.run(*args, **kwargs)


@pytest.mark.parametrize("lengths", [[9, 4], [1, 3, 0, 2, 5, 1, 1, 4, 2, 1, 3, 6]], ids=["2 seqs", "12 seqs"])
def test_one_launch_per_kernel_whatever_the_sequence_count(monkeypatch, lengths):
    counted = {name: _Counted(getattr(module, name), monkeypatch) for module, name in KERNELS}
    q, k, v, cu_q, cu_k = _packed(lengths, lengths)
    q.requires_grad_()
    out = kernels.flash_attention_varlen(q, k, v, cu_q, cu_k, max(lengths), max(lengths), causal=True)
    assert [c.launches for c in counted.values()] == [1, 0, 0, 0]
    out.sum().backward()
    assert [c.launches for c in counted.values()] == [1, 1, 1, 1]


def test_backward_is_deterministic():
    q, k, v, cu_q, cu_k = _packed([7, 20, 3], [7, 25, 1], hkv=1)
    grad = torch.randn(q.shape)
    runs = [_with_grads(lambda *a: kernels.flash_attention_varlen(*a, cu_q, cu_k, 20, 25, causal=True),
                        q, k, v, grad)[1] for _ in range(2)]
    assert all(torch.equal(a, b) for a, b in zip(*runs))


def test_compiles_without_graph_break():
    q, k, v, cu_q, cu_k = _packed([5, 0, 9], [4, 3, 9])
    q.requires_grad_()
    fn = torch.compile(lambda q, k, v, cu_q, cu_k: kernels.flash_attention_varlen(
        q, k, v, cu_q, cu_k, 9, 9, causal=True) * 2, fullgraph=True, backend="aot_eager")
    out = fn(q, k, v, cu_q, cu_k)
    out.sum().backward()       # a stride-0 output gradient reaches the backward kernels
    expected = per_sequence(lambda *s: attn_spec.reference(*s, True), q.detach(), k, v, cu_q, cu_k) * 2
    assert torch.allclose(out.detach().double(), expected, atol=1e-5) and q.grad is not None


def test_fake_kernels_give_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        q, k, cu = torch.empty(10, 4, 32), torch.empty(7, 2, 32), torch.empty(3, dtype=torch.int32)
        o, lse = torch.ops.kernels.flash_attention_varlen_fwd(q, k, k, cu, cu, 6, 5, True, 0.125)
        grads = torch.ops.kernels.flash_attention_varlen_bwd(o, q, k, k, o, lse, cu, cu, 6, 5, True, 0.125)
    assert o.shape == (10, 4, 32) and lse.shape == (1, 4, 2, 10) and lse.dtype == torch.float32
    assert [g.shape for g in grads] == [q.shape, k.shape, k.shape]


def test_the_custom_ops_pass_opcheck():
    """The fake kernels give the real ones' strides, for tensors stored head by head."""
    q, k, v, cu_q, cu_k = _packed([5, 0, 9], [4, 3, 9], d=16)
    q, k, v = heads_major(q, k, v)
    o, lse = torch.ops.kernels.flash_attention_varlen_fwd(q, k, v, cu_q, cu_k, 9, 9, True, 0.25)
    torch.library.opcheck(torch.ops.kernels.flash_attention_varlen_bwd.default,
                          (torch.randn_like(o), q, k, v, o, lse, cu_q, cu_k, 9, 9, True, 0.25))


@pytest.mark.parametrize("change,match", [
    (dict(cu_seqlens_q=torch.tensor([0, 5, 13], dtype=torch.int64)), "cu_seqlens_q has dtype int64"),
    (dict(cu_seqlens_q=torch.tensor([1, 5, 13], dtype=torch.int32)), "must start at 0"),
    (dict(cu_seqlens_q=torch.tensor([0, 9, 5, 13], dtype=torch.int32)), "non-decreasing"),
    (dict(cu_seqlens_k=torch.tensor([0, 5, 12], dtype=torch.int32)), "ends at 12.*13 tokens"),
    (dict(cu_seqlens_q=torch.tensor([0, 2, 5, 13], dtype=torch.int32)), "3 sequences, cu_seqlens_k 2"),
    (dict(cu_seqlens_k=torch.tensor([0, 13, 13], dtype=torch.int32), max_seqlen_k=13), "8 queries but no keys"),
    (dict(max_seqlen_q=4), "longer than its max_seqlen"),
    (dict(max_seqlen_k=8.0), "max_seqlen_k must be an int"),
    (dict(v=torch.randn(12, 2, 32)), "k and v must have one shape"),
    (dict(causal=1), "causal must be a bool"),
])
def test_bad_input_names_the_argument(change, match):
    q, k, v, cu_q, cu_k = _packed([5, 8], [5, 8])
    args = dict(q=q, k=k, v=v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=8, max_seqlen_k=8,
                check_offsets=True)
    args.update(change)
    with pytest.raises((ValueError, TypeError), match=match):
        kernels.flash_attention_varlen(**args)


def test_forward_and_backward_make_no_host_sync(no_host_sync):
    """flash-attn's contract: the offsets stay on the device, the caller gives the max lengths."""
    q, k, v, cu_q, cu_k = _packed([7, 0, 20], [9, 3, 20])
    q.requires_grad_()
    kernels.flash_attention_varlen(q, k, v, cu_q, cu_k, 20, 20, causal=True).sum().backward()
    assert q.grad.shape == q.shape


def test_checking_the_offsets_reads_them_on_the_host(no_host_sync):
    """The control: the same trap catches the opt-in check."""
    q, k, v, cu_q, cu_k = _packed([7, 20], [9, 20])
    with pytest.raises(AssertionError, match="host sync"):
        kernels.flash_attention_varlen(q, k, v, cu_q, cu_k, 20, 20, check_offsets=True)


def test_unchecked_offsets_past_the_tokens_are_clamped_into_them():
    """Offsets nobody checked claim 40 more keys than k holds: forward and backward attend
    to the keys there are, and read none of the NaN that lies past k and v in their storage."""
    q, k, v, cu_q, _ = _packed([6], [6])
    k_store, v_store = (torch.cat([t, torch.full((40, *t.shape[1:]), float("nan"))]) for t in (k, v))
    cu_k = torch.tensor([0, 46], dtype=torch.int32)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k_store[:6], v_store[:6])]
    out = kernels.flash_attention_varlen(*leaves, cu_q, cu_k, 6, 46)
    grad = torch.randn_like(out)
    out.backward(grad)
    ref_leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    expected = per_sequence(lambda *s: attn_spec.reference(*s, False), *ref_leaves, cu_q, cu_q)
    expected.backward(grad.double())
    assert torch.allclose(out.double(), expected, atol=1e-5)
    for leaf, ref in zip(leaves, ref_leaves):
        assert torch.allclose(leaf.grad.double(), ref.grad, atol=1e-5), (leaf.grad, ref.grad)


def test_strided_offsets_give_what_contiguous_ones_give():
    """Offsets that are a strided view are packed (copied) per call, contiguous ones passed as
    they are: both kinds, each keeping its own plan, give the same rows."""
    q, k, v, cu_q, cu_k = _packed([5, 3, 6], [4, 7, 2])
    expected = kernels.flash_attention_varlen(q, k, v, cu_q, cu_k, 6, 7, causal=True)
    spread = [torch.stack([cu, torch.full_like(cu, -1)], 1)[:, 0] for cu in (cu_q, cu_k)]
    assert spread[0].stride() == (2,) and torch.equal(spread[0], cu_q)
    for _ in range(2):   # the second call runs the kept plan
        with poisoned_outputs():
            assert torch.equal(kernels.flash_attention_varlen(q, k, v, *spread, 6, 7, causal=True), expected)


@pytest.mark.parametrize("total_k", [10, 12])
def test_one_set_of_offsets_is_clamped_once_for_queries_and_keys(total_k):
    """Self-attention passes one offsets tensor for both: the backward clamps it once (three
    small device ops, not six) where both packs have the same tokens, and each on its own
    where they do not; out-of-range and decreasing offsets land inside the tokens either way."""
    from kernels.attention import varlen
    cu = torch.tensor([0, 5, 100, 3, 11], dtype=torch.int32)
    clamped = varlen.Packing(cu, cu, 8, 8).clamped(10, total_k)
    assert torch.equal(clamped.cu_q, torch.tensor([0, 5, 10, 10, 10], dtype=torch.int32))
    assert torch.equal(clamped.cu_k, torch.tensor([0, 5] + [total_k] * 3, dtype=torch.int32))
    assert (clamped.cu_k is clamped.cu_q) == (total_k == 10)
    assert clamped.cu_q.dtype == torch.int32 and clamped.cu_q.is_contiguous()
