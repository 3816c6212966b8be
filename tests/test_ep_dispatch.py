"""EPDispatcher (DeepEP's dispatch/combine on torch.distributed) on 2, 3 and 4 gloo processes,
and dispatch_layout's counts against a brute-force count.

Every rank draws its x, routing and weights from a seed that the test knows, so each rank
can rebuild what every other rank holds and check its received rows against a
single-process gather. One spawn per world size runs many cases; the ranks return their
failures and the parent asserts there are none.
"""

import itertools

import pytest
import torch

from kernels.comm.ep_layout import dispatch_layout
from kernels.comm.launch import run_local


def _brute_layout(ids, num_experts, world):
    per = num_experts // world
    tokens, top_k = ids.shape
    in_rank = [[any(int(ids[t, k]) // per == r for k in range(top_k)) for r in range(world)]
               for t in range(tokens)]
    per_expert = [sum(int(ids[t, k]) == e for t in range(tokens) for k in range(top_k))
                  for e in range(num_experts)]
    return in_rank, per_expert


@pytest.mark.timeout(30)
@pytest.mark.parametrize("tokens,top_k,num_experts,world", [(0, 2, 8, 4), (1, 1, 4, 2), (7, 3, 12, 3),
                                                          (9, 4, 8, 4), (5, 2, 6, 1)])
def test_layout_matches_brute_force(tokens, top_k, num_experts, world):
    g = torch.Generator().manual_seed(tokens * 100 + top_k)
    ids = torch.stack([torch.randperm(num_experts, generator=g)[:top_k] for _ in range(tokens)]
                      ) if tokens else torch.empty(0, top_k, dtype=torch.int64)
    layout = dispatch_layout(ids.to(torch.int32), num_experts, world)
    in_rank, per_expert = _brute_layout(ids, num_experts, world)
    assert layout.is_token_in_rank.tolist() == (in_rank or [])
    assert layout.tokens_per_expert.tolist() == per_expert
    assert layout.tokens_per_rank.tolist() == [sum(row[r] for row in in_rank) for r in range(world)]
    per = num_experts // world
    assert layout.rows_per_rank.tolist() == [sum(per_expert[r * per:(r + 1) * per]) for r in range(world)]
    assert layout.rows_naive == tokens * top_k
    assert layout.rows_dedup == sum(map(sum, in_rank))
    assert layout.tokens_per_rank.dtype == layout.tokens_per_expert.dtype == torch.int64


@pytest.mark.timeout(30)
def test_layout_bytes():
    # 4 experts on 2 ranks: token 0 needs rank 0 only, tokens 1 and 2 both ranks
    ids = torch.tensor([[0, 1], [0, 2], [3, 1]])
    layout = dispatch_layout(ids, 4, 2)
    assert (layout.rows_naive, layout.rows_dedup) == (6, 5)
    assert layout.bytes(10, torch.bfloat16) == dict(naive=120, dedup=100, saved=20)
    assert layout.bytes(10, torch.float32, fp8=True) == dict(naive=6 * 14, dedup=5 * 14, saved=14)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("args,error,match", [
    ((torch.tensor([[0, 4]]), 4, 2), ValueError, r"\[0, 4\)"),
    ((torch.tensor([[-1, 1]]), 4, 2), ValueError, "-1"),
    ((torch.tensor([[0, 1]]), 6, 4), ValueError, "divide"),
    ((torch.tensor([0, 1]), 4, 2), ValueError, "2-D"),
    ((torch.tensor([[0.0, 1.0]]), 4, 2), TypeError, "int32 or int64"),
    ((torch.tensor([[0, 1]]), 4, 0), ValueError, "world_size"),
    (([[0, 1]], 4, 2), TypeError, "topk_ids"),
])
def test_layout_bad_input(args, error, match):
    with pytest.raises(error, match=match):
        dispatch_layout(*args)


# -- dispatch and combine on p processes ------------------------------------------------

def _rank_data(seed, rank, tokens, dim, num_experts, top_k, dtype, skew=None):
    """Rank ``rank``'s x, ids, weights; any rank can rebuild any other's.

    ``skew``: a list of allowed experts (routing confined to them, so some ranks get nothing).
    """
    g = torch.Generator().manual_seed(seed * 100 + rank)
    x = torch.randn(tokens, dim, generator=g).to(dtype)
    allowed = torch.arange(num_experts) if skew is None else torch.tensor(skew)
    ids = torch.stack([allowed[torch.randperm(len(allowed), generator=g)[:top_k]]
                       for _ in range(tokens)]) if tokens else torch.empty(0, top_k, dtype=torch.int64)
    weights = torch.rand(tokens, top_k, generator=g).to(torch.float32) + 0.1
    return x, ids, weights


def _expected_recv(everyone, rank, per):
    """The rows rank ``rank`` must receive: by local expert, then source rank, token, k."""
    rows, meta = [], []
    for e in range(rank * per, (rank + 1) * per):
        for src, (x, ids, weights) in enumerate(everyone):
            for t, k in itertools.product(range(ids.shape[0]), range(ids.shape[1])):
                if int(ids[t, k]) == e:
                    rows.append(x[t])
                    meta.append((src, t, k, float(weights[t, k])))
    dim = everyone[0][0].shape[1]
    return (torch.stack(rows) if rows else everyone[0][0].new_empty(0, dim)), meta


def _expert(rows, handle, rank, per):
    """A stand-in expert: row times (global expert + 1), one more column holding the expert id
    (so y's dim differs from x's); elementwise, so the reference can repeat it bitwise."""
    expert = torch.repeat_interleave(torch.arange(per), handle.recv_counts) + rank * per
    return _expert_rows(rows, expert)


def _expert_rows(rows, expert):
    scale = (expert + 1).to(rows.dtype)[:, None]
    return torch.cat([rows * scale, expert.to(rows.dtype)[:, None]], dim=1)


def _reference_combine(x, ids, weights, dtype):
    """v3_fused.fused_forward's sum: weighted rows rounded to the dtype, summed over k in fp32 (the
    combine's k-sum rounds once, after the sum: the same in fp32, and at k = 1 in every dtype, the
    cases below; tests/test_ep_dispatch_k_sum.py holds bf16 at k = 3 to its own rule)."""
    tokens, top_k = ids.shape
    rows = _expert_rows(x.repeat_interleave(top_k, dim=0), ids.reshape(-1))
    dim = rows.shape[1]
    per_slot = (rows.float() * weights.reshape(-1, 1).float()).to(dtype).view(tokens, top_k, dim)
    return per_slot.view(tokens, dim) if top_k == 1 else per_slot.float().sum(dim=1).to(dtype)


def _case(failures, name, fn):
    try:
        fn()
    except Exception as err:  # collected, reported by the parent with the case name
        failures.append(f"{name}: {type(err).__name__}: {err}")


CASES = [  # (name, tokens per rank (None: 5 + rank), dim, experts per rank, top_k, dtype, skew)
    ("uniform fp32", None, 6, 2, 3, torch.float32, None),
    ("uniform bf16 top-1", None, 5, 3, 1, torch.bfloat16, None),
    ("all to rank 0", None, 4, 2, 2, torch.float32, [0, 1]),
    ("T=0 on rank 1", [4, 0, 3, 2], 4, 2, 2, torch.float32, None),
    ("no tokens anywhere", [0, 0, 0, 0], 3, 1, 1, torch.float32, None),
]


def _dispatch_cases(rank, world):
    from kernels.comm.ep_dispatch import EPDispatcher
    failures = []
    for seed, (name, tokens, dim, per, top_k, dtype, skew) in enumerate(CASES):
        num_experts = per * world
        counts = [5 + r for r in range(world)] if tokens is None else tokens[:world]
        everyone = [_rank_data(seed, r, counts[r], dim, num_experts, top_k, dtype, skew)
                    for r in range(world)]
        x, ids, weights = everyone[rank]
        want_rows, want_meta = _expected_recv(everyone, rank, per)
        results = {}
        for dedup in (False, True):
            # every collective runs before any assertion, so a failed check on one rank
            # cannot leave the ranks in different collectives
            ep = EPDispatcher(num_experts, dedup=dedup)
            recv_x, recv_counts, h = ep.dispatch(x, ids.to(torch.int32), weights)
            y = _expert(recv_x, h, rank, per)
            out, reduced = ep.combine(y, h), ep.combine(y, h, reduce_on_sender=True)
            results[dedup] = (recv_x, out)

            def check(dedup=dedup, recv_x=recv_x, recv_counts=recv_counts, h=h, out=out,
                      reduced=reduced, layout=ep.layout(ids)):
                assert torch.equal(recv_x, want_rows), "recv_x differs from the gathered rows"
                got_meta = list(zip(h.recv_src.tolist(), h.recv_token.tolist(), h.recv_topk.tolist(),
                                    h.recv_weights.tolist()))
                assert got_meta == want_meta, "source rank/token/k/weight of the rows differ"
                want_counts = [sum(int((o[1] == e).sum()) for o in everyone)
                               for e in range(rank * per, (rank + 1) * per)]
                assert recv_counts.tolist() == want_counts
                assert sum(h.send_splits) == (layout.rows_dedup if dedup else layout.rows_naive)
                assert torch.equal(out, _reference_combine(x, ids, weights, dtype)), \
                    "ordered combine is not bitwise the single-process sum"
                tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
                torch.testing.assert_close(reduced, out, **tol)
            _case(failures, f"{name} dedup={dedup}", check)

        def same():
            assert all(map(torch.equal, results[False], results[True])), "naive and dedup differ"
        _case(failures, f"{name} naive == dedup", same)
    return failures


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world", [2, 3, 4])
def test_dispatch_combine(world):
    failures = run_local(_dispatch_cases, world, timeout=180)
    assert failures == [[]] * world


# -- autograd ---------------------------------------------------------------------------

def _experts_matmul(recv_x, handle, rank, per, mats):
    """A grouped GEMM on recv_x as dispatch hands it over: rows of local expert e times mats[e]."""
    chunks = recv_x.split(handle.recv_counts.tolist())
    return torch.cat([c @ mats[rank * per + i] for i, c in enumerate(chunks)])


def _autograd_cases(rank, world):
    from kernels.comm.ep_dispatch import EPDispatcher
    failures, per, top_k, dim = [], 2, 2, 3
    num_experts = per * world
    mats = torch.randn(num_experts, dim, dim + 1, generator=torch.Generator().manual_seed(5),
                       dtype=torch.float64)
    x, ids, weights = _rank_data(11, rank, 3 + rank, dim, num_experts, top_k, torch.float64)
    weights = weights.double()
    grad_out = torch.randn(x.shape[0], dim + 1, generator=torch.Generator().manual_seed(rank),
                           dtype=torch.float64)
    xr, wr = x.clone().requires_grad_(), weights.clone().requires_grad_()
    want = torch.einsum("tk,tkd->td", wr, torch.einsum("td,tkdn->tkn", xr, mats[ids]))
    want_x, want_w = torch.autograd.grad(want, (xr, wr), grad_out)
    for dedup, reduce in itertools.product((False, True), (False, True)):
        ep = EPDispatcher(num_experts, dedup=dedup)
        xg, wg = x.clone().requires_grad_(), weights.clone().requires_grad_()
        recv_x, _, h = ep.dispatch(xg, ids, wg)
        out = ep.combine(_experts_matmul(recv_x, h, rank, per, mats), h, reduce_on_sender=reduce)
        got_x, got_w = torch.autograd.grad(out, (xg, wg), grad_out)

        def check(out=out, got_x=got_x, got_w=got_w):
            torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(got_x, want_x, rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(got_w, want_w, rtol=1e-12, atol=1e-12)
        _case(failures, f"grad dedup={dedup} reduce_on_sender={reduce}", check)
    # gradcheck perturbs each input element in turn: equal shapes on every rank keep the
    # ranks' collectives in step
    x, ids, weights = _rank_data(12, rank, 2, 2, num_experts, top_k, torch.float64)
    for dedup, reduce in ((True, False), (False, True)):
        ep = EPDispatcher(num_experts, dedup=dedup)

        def layer(x, w, ep=ep, reduce=reduce):
            recv_x, _, h = ep.dispatch(x, ids, w)
            y = _experts_matmul(recv_x, h, rank, per, mats[:, :2, :])
            return ep.combine(y, h, reduce_on_sender=reduce)
        ok = torch.autograd.gradcheck(layer, (x.requires_grad_(), weights.double().requires_grad_()),
                                      raise_exception=False)
        if not ok:
            failures.append(f"gradcheck dedup={dedup} reduce_on_sender={reduce}")
    return failures


@pytest.mark.timeout(240)
def test_autograd_float64():
    assert run_local(_autograd_cases, 2, timeout=180) == [[], []]


# -- fp8 dispatch -----------------------------------------------------------------------

def _fp8_bound(exact, dtype):
    """The module's bound: 2^-4·|x| + 2^-10·s per element, s = the token row's amax / 448,
    plus the half-ulp of the final cast to x's dtype."""
    scale = exact.float().abs().amax(dim=1, keepdim=True) / 448
    half_ulp = {torch.float32: 2 ** -24, torch.bfloat16: 2 ** -8}[dtype]
    return exact.float().abs() * (2 ** -4 + half_ulp * 1.07) + scale * 2 ** -10


def _fp8_cases(rank, world):
    from kernels.comm.ep_dispatch import EPDispatcher
    failures, per, top_k, dim = [], 2, 3, 16
    num_experts = per * world
    for dtype in (torch.float32, torch.bfloat16):
        x, ids, weights = _rank_data(21, rank, 6, dim, num_experts, top_k, torch.float32)
        # magnitudes over five decades, so small entries fall in fp8's subnormal range
        spread = 10 ** torch.linspace(-4, 1, dim)[torch.randperm(dim, generator=torch.Generator().manual_seed(rank))]
        x = (x * spread).to(dtype)
        exact, _, _ = EPDispatcher(num_experts, dedup=False).dispatch(x, ids, weights)
        got = {dedup: EPDispatcher(num_experts, dedup=dedup, fp8=True).dispatch(x, ids, weights)[0]
               for dedup in (False, True)}

        def check(dtype=dtype, exact=exact, got=got, ids=ids):
            assert got[False].dtype == dtype
            assert torch.equal(got[False], got[True]), "fp8 naive and dedup rows differ"
            err = (got[True].float() - exact.float()).abs()
            assert (err <= _fp8_bound(exact, dtype)).all(), f"fp8 error {err.max()} above the bound"
            assert err.max() > 0, "fp8 dispatch returned the exact rows: nothing was quantized"
            layout = EPDispatcher(num_experts).layout(ids)
            assert layout.bytes(dim, dtype, fp8=True)["dedup"] < layout.bytes(dim, dtype)["dedup"]
        _case(failures, f"fp8 {dtype}", check)
    return failures


@pytest.mark.timeout(150)
def test_fp8_dispatch_within_bound():
    assert run_local(_fp8_cases, 2, timeout=120) == [[], []]


# -- bad input: an error on every rank, never a hang --------------------------------------

REFUSED = r"rank\(s\) \[{}\] refused"
BAD = {  # name -> (rank 0's error, rank 1's error), regexes
    "x rows != ids rows on rank 1": (REFUSED.format(1), "x has 2 tokens"),
    "id out of range on rank 0": (r"\[0, 4\)", REFUSED.format(0)),
    "float ids on rank 1": (REFUSED.format(1), "int32 or int64"),
    "1-D x on rank 0": ("x must be 2-D", REFUSED.format(0)),
    "weights shape on rank 1": (REFUSED.format(1), "topk_weights has shape"),
    "dim differs": ("disagree.*'dim': \\[4, 3\\]",) * 2,
    "dtype differs": ("disagree.*x dtype",) * 2,
    "top_k differs": ("disagree.*top_k",) * 2,
    "num_experts differs": ("disagree.*num_experts",) * 2,
    "dedup differs": ("disagree.*dedup",) * 2,
    "experts do not divide": ("divide by world_size",) * 2,
    "y rows on rank 1": (REFUSED.format(1), r"y has \d+ rows but dispatch delivered \d+"),
    "y dim differs": ("disagree.*'dim'",) * 2,
    "integer y on rank 0": ("y must be float", REFUSED.format(0)),
    "not a handle on rank 0": ("handle must be the EPHandle", REFUSED.format(0)),
    "handles of two dispatches": ("disagree.*dispatch serial",) * 2,
}


def _bad_cases(rank, world):
    from kernels.comm.ep_dispatch import EPDispatcher
    ep = EPDispatcher(4)
    x, ids, weights = _rank_data(31, rank, 3, 4, 4, 2, torch.float32)
    one = rank == 1

    def dispatched():
        return ep.dispatch(x, ids, weights)

    def combine_with(make_y=lambda r: r, handle=None):
        recv_x, _, h = dispatched()
        return ep.combine(make_y(recv_x), h if handle is None else handle)

    def two_handles():
        first, second = dispatched()[2], dispatched()
        return ep.combine(second[0], first if one else second[2])

    calls = {
        "x rows != ids rows on rank 1": lambda: ep.dispatch(x[:2] if one else x, ids, weights),
        "id out of range on rank 0": lambda: ep.dispatch(x, ids if one else ids + 4, weights),
        "float ids on rank 1": lambda: ep.dispatch(x, ids.float() if one else ids, weights),
        "1-D x on rank 0": lambda: ep.dispatch(x if one else x[0], ids, weights),
        "weights shape on rank 1": lambda: ep.dispatch(x, ids, weights[:, :1] if one else weights),
        "dim differs": lambda: ep.dispatch(x[:, :3] if one else x, ids, weights),
        "dtype differs": lambda: ep.dispatch(x.double() if one else x, ids, weights),
        "top_k differs": lambda: ep.dispatch(x, ids[:, :1] if one else ids,
                                             weights[:, :1] if one else weights),
        "num_experts differs": lambda: EPDispatcher(8 if one else 4).dispatch(x, ids, weights),
        "dedup differs": lambda: EPDispatcher(4, dedup=one).dispatch(x, ids, weights),
        "experts do not divide": lambda: EPDispatcher(3),
        "y rows on rank 1": lambda: combine_with(lambda r: r[1:] if one else r),
        "y dim differs": lambda: combine_with(lambda r: r[:, :3] if one else r),
        "integer y on rank 0": lambda: combine_with(lambda r: r if one else r.long()),
        "not a handle on rank 0": lambda: combine_with(handle=None if one else "handle"),
        "handles of two dispatches": two_handles,
    }
    errors = {}
    for name, call in calls.items():
        try:
            call()
            errors[name] = None
        except (TypeError, ValueError) as err:
            errors[name] = str(err)
    recv_x, _, h = dispatched()   # the ranks are still in step
    errors["in step"] = torch.allclose(ep.combine(recv_x, h), weights.sum(dim=1, keepdim=True) * x)
    return errors


@pytest.mark.timeout(150)
def test_bad_input_raises_on_every_rank():
    import re
    errors = run_local(_bad_cases, 2, timeout=120)
    for name, patterns in BAD.items():
        for rank, pattern in enumerate(patterns):
            got = errors[rank][name]
            assert got is not None and re.search(pattern, got), f"{name}, rank {rank}: {got!r}"
    assert errors[0]["in step"] and errors[1]["in step"]


# -- host reads ---------------------------------------------------------------------------

def _host_read_cases(rank, world):
    """Each call's host reads under the trap: a dispatch may read only in ``_read`` (its one
    device read) and ``_agree`` (the header, a CPU tensor), a combine only in ``_agree``,
    the backward nowhere; any other read raises on its rank."""
    from host_sync import no_host_sync

    from kernels.comm.ep_dispatch import EPDispatcher
    per, top_k, dim = 2, 2, 3
    x, ids, weights = _rank_data(41, rank, 4 + rank, dim, per * world, top_k, torch.float32)
    reads = {}
    for dedup, reduce in itertools.product((False, True), (False, True)):
        ep = EPDispatcher(per * world, dedup=dedup)
        xg, wg = x.clone().requires_grad_(), weights.clone().requires_grad_()
        with no_host_sync(allowed=(EPDispatcher._read, EPDispatcher._agree)) as dispatch_reads:
            recv_x, _, h = ep.dispatch(xg, ids, wg)
        with no_host_sync(allowed=(EPDispatcher._agree,)) as combine_reads:
            out = ep.combine(recv_x * 2, h, reduce_on_sender=reduce)
        with no_host_sync():
            out.sum().backward()
        reads[dedup, reduce] = (dispatch_reads, combine_reads)
    return reads


@pytest.mark.timeout(150)
def test_dispatch_reads_the_device_once_and_combine_and_backward_never():
    for reads in run_local(_host_read_cases, 2, timeout=120):
        assert reads == {key: (["tolist", "tolist"], ["tolist"]) for key in reads} and len(reads) == 4
