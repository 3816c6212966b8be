"""kernels.comm rungs against torch.distributed on 2, 3 and 4 local gloo processes.

One spawn per world size runs every case inside (spawning costs seconds; cases cost
milliseconds); the ranks return a list of failures and the parent asserts it is empty.
Every collective and algorithm meets sizes that are 0, smaller than, not a multiple of,
and a multiple of the world size, fp32 and bf16, and bad input that must raise on every
rank rather than hang. run_local kills the ranks after its timeout, pytest-timeout
backs it up.
"""

import pytest
import torch
import torch.distributed as dist

from kernels import comm
from kernels.comm.launch import run_local

SUM, AVG, MAX, MIN = dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.MAX, dist.ReduceOp.MIN
RINGS = [("ring", 1), ("ring_chunked", 3)]


def _data(shape, dtype, rank, case):
    g = torch.Generator().manual_seed(1000 * case + rank)
    return torch.randn(shape, generator=g).to(dtype)


def _close(got, want, dtype, p):
    """Rings sum in another order than the library: fp32 to rounding, bf16 to a few ulps."""
    tol = dict(rtol=1e-5, atol=1e-5 * p) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2 * p)
    torch.testing.assert_close(got.float(), want.float(), **tol)


def _library_reduce(x, op, p):
    """The library result; gloo has no AVG, so AVG is its SUM divided by p."""
    want = x.clone()
    comm.all_reduce(want, op=SUM if op == AVG else op, algorithm="library")
    return want / p if op == AVG else want


def _case(failures, name, fn):
    try:
        fn()
    except Exception as err:  # collected, reported by the parent with the case name
        failures.append(f"{name}: {type(err).__name__}: {err}")


def _all_reduce_cases(rank, p, failures):
    fp32 = [((n,), torch.float32, op) for n in (0, 1, p - 1, p + 1, 37) for op in (SUM, AVG, MAX, MIN)]
    bf16 = [(shape, torch.bfloat16, op) for shape in ((p + 1,), (3, 5)) for op in (SUM, AVG, MIN)]
    for case, (shape, dtype, op) in enumerate(fp32 + [((3, 5), torch.float32, SUM)] + bf16):
        x = _data(shape, dtype, rank, case)
        want = _library_reduce(x, op, p)
        for alg, chunks in RINGS:
            def run(x=x, want=want, alg=alg, chunks=chunks, dtype=dtype, op=op):
                got = x.clone()
                assert comm.all_reduce(got, op=op, algorithm=alg, chunks=chunks) is None
                assert got.shape == x.shape and got.dtype == dtype
                _close(got, want, dtype, p)
            _case(failures, f"all_reduce {shape} {dtype} {op} {alg}", run)


def _reduce_scatter_cases(rank, p, failures):
    case = 0
    for m in (0, 1, 3, 17):
        for dtype in (torch.float32, torch.bfloat16):
            for op in (SUM, AVG, MAX) if dtype == torch.float32 else (SUM,):
                case += 1
                x = _data((p * m,), dtype, rank, 100 + case)
                want = torch.empty(m, dtype=dtype)
                comm.reduce_scatter_tensor(want, x.clone(), op=SUM if op == AVG else op,
                                           algorithm="library")
                want = want / p if op == AVG else want
                for alg, chunks in RINGS:
                    def run(x=x, want=want, alg=alg, chunks=chunks, dtype=dtype, m=m, op=op):
                        before = x.clone()
                        got = torch.full((m,), float("nan"), dtype=dtype)
                        comm.reduce_scatter_tensor(got, x, op=op, algorithm=alg, chunks=chunks)
                        _close(got, want, dtype, p)
                        assert torch.equal(x, before), "input was modified"
                    _case(failures, f"reduce_scatter m={m} {dtype} {op} {alg}", run)


def _all_gather_cases(rank, p, failures):
    for m in (0, 1, 5, 33):
        for dtype in (torch.float32, torch.bfloat16):
            x = _data((m,), dtype, rank, 200 + m)
            want = torch.empty(p * m, dtype=dtype)
            comm.all_gather_into_tensor(want, x, algorithm="library")
            for alg, chunks in RINGS:
                for out_shape in ((p * m,), (p, m)):
                    def run(x=x, want=want, alg=alg, chunks=chunks, out_shape=out_shape):
                        got = torch.full(out_shape, float("nan"), dtype=x.dtype)
                        comm.all_gather_into_tensor(got, x, algorithm=alg, chunks=chunks)
                        assert torch.equal(got.view(-1), want), "all-gather must be exact"
                    _case(failures, f"all_gather m={m} {dtype} {alg} out={out_shape}", run)


def _uneven_splits(rank, p):
    """Rank r sends (r + 2j) % 3 rows to rank j: zeros, ones and twos, different per pair."""
    ins = [(rank + 2 * j) % 3 for j in range(p)]
    outs = [(i + 2 * rank) % 3 for i in range(p)]
    return ins, outs


def _all_to_all_cases(rank, p, failures):
    ins, outs = _uneven_splits(rank, p)
    layouts = [(ins, outs, (4,)), (ins, outs, ()), (None, None, (3,))]
    for k, (i_s, o_s, row) in enumerate(layouts):
        for dtype in (torch.float32, torch.bfloat16):
            rows_in, rows_out = (sum(i_s), sum(o_s)) if i_s else (2 * p, 2 * p)
            x = _data((rows_in, *row), dtype, rank, 300 + k)
            want = torch.empty((rows_out, *row), dtype=dtype)
            comm.all_to_all_single(want, x, o_s, i_s, algorithm="library")
            for alg in ("pairwise", "direct"):
                def run(x=x, want=want, alg=alg, i_s=i_s, o_s=o_s):
                    got = torch.full_like(want, float("nan"))
                    comm.all_to_all_single(got, x, o_s, i_s, algorithm=alg)
                    assert torch.equal(got, want), "all-to-all must be exact"
                _case(failures, f"all_to_all layout={k} {dtype} {alg}", run)


def _raises(failures, name, error, fn, match):
    try:
        fn()
    except error as err:
        if match not in str(err):
            failures.append(f"{name}: message {str(err)!r} lacks {match!r}")
    except Exception as err:
        failures.append(f"{name}: raised {type(err).__name__} ({err}), not {error.__name__}")
    else:
        failures.append(f"{name}: did not raise")


def _local_error_cases(rank, p, failures):
    x = torch.randn(6)
    bad = [
        ("all_gather wrong output size", ValueError, "world size x input",
         lambda: comm.all_gather_into_tensor(torch.empty(6 * p + 1), x)),
        ("all_gather dtype mismatch", TypeError, "dtype",
         lambda: comm.all_gather_into_tensor(torch.empty(6 * p, dtype=torch.float64), x)),
        ("reduce_scatter wrong input size", ValueError, "world size x output",
         lambda: comm.reduce_scatter_tensor(torch.empty(5), torch.randn(5 * p + 1))),
        ("all_reduce non-contiguous", ValueError, "contiguous",
         lambda: comm.all_reduce(torch.randn(4, 4).t())),
        ("all_reduce not a tensor", TypeError, "torch.Tensor", lambda: comm.all_reduce([1.0])),
        ("all_reduce unknown algorithm", ValueError, "unknown algorithm",
         lambda: comm.all_reduce(x.clone(), algorithm="tree")),
        ("all_reduce chunks=0", ValueError, "chunks", lambda: comm.all_reduce(
            x.clone(), algorithm="ring_chunked", chunks=0)),
        ("all_reduce AVG on ints", TypeError, "AVG",
         lambda: comm.all_reduce(torch.ones(3, dtype=torch.int64), op=AVG)),
        ("all_reduce BAND", ValueError, "not supported",
         lambda: comm.all_reduce(torch.ones(3, dtype=torch.int64), op=dist.ReduceOp.BAND)),
        ("all_to_all splits do not sum", ValueError, "sums to",
         lambda: comm.all_to_all_single(torch.empty(p, 2), torch.empty(p, 2), [1] * p, [2] * p)),
        ("all_to_all split count", ValueError, "entries",
         lambda: comm.all_to_all_single(torch.empty(p), torch.empty(p), None, [p])),
        ("all_to_all uneven without splits", ValueError, "divide",
         lambda: comm.all_to_all_single(torch.empty(p + 1), torch.empty(p + 1))),
        ("all_to_all row shapes", ValueError, "rows",
         lambda: comm.all_to_all_single(torch.empty(p, 3), torch.empty(p, 2))),
    ]
    for name, error, match, fn in bad:
        _raises(failures, name, error, fn, match)


def _cross_rank_error_cases(rank, p, failures):
    """Disagreeing ranks: the metadata exchange raises on every rank, the group lives on."""
    n = 8 + (rank == 0)
    _raises(failures, "all_reduce numel differs", ValueError, lambda: comm.all_reduce(torch.randn(n)),
            "disagree")
    dtype = torch.float64 if rank == 0 else torch.float32
    _raises(failures, "all_reduce dtype differs", ValueError,
            lambda: comm.all_reduce(torch.randn(8, dtype=dtype)), "disagree")
    _raises(failures, "all_gather input size differs", ValueError,
            lambda: comm.all_gather_into_tensor(torch.empty(p * n), torch.randn(n)), "disagree")
    ins = [2] * p if rank else [1] * p
    _raises(failures, "all_to_all splits disagree", ValueError,
            lambda: comm.all_to_all_single(torch.empty(2 * p), torch.empty(sum(ins)), [2] * p, ins),
            "disagree")
    ok = torch.ones(5)
    comm.all_reduce(ok)
    if not torch.equal(ok, torch.full((5,), float(p))):
        failures.append("the group is unusable after a detected mismatch")


def _order_product_and_subgroup_cases(rank, p, failures):
    """Bitwise repeatable rings, PRODUCT, and a subgroup of ranks 0 and p-1 (global peers)."""
    x = _data((4 * p + 3,), torch.float32, rank, 400)
    runs = [x.clone() for _ in range(2)]
    for run in runs:
        comm.all_reduce(run, algorithm="ring_chunked", chunks=2)
    if not torch.equal(runs[0], runs[1]):
        failures.append("ring all_reduce is not bitwise repeatable")
    _case(failures, "all_reduce PRODUCT", lambda: _close(
        _ring(x, dist.ReduceOp.PRODUCT), _library_reduce(x, dist.ReduceOp.PRODUCT, p), torch.float32, p))
    members = [0, p - 1]
    group = dist.new_group(members)  # every rank must take part in creating it
    if rank in members:
        def run():
            got, want = x.clone(), x.clone()
            comm.all_reduce(got, group=group)
            comm.all_reduce(want, group=group, algorithm="library")
            _close(got, want, torch.float32, 2)
            out = torch.empty(2 * x.numel())
            comm.all_gather_into_tensor(out, x, group=group)
            ref = torch.empty_like(out)
            comm.all_gather_into_tensor(ref, x, group=group, algorithm="library")
            assert torch.equal(out, ref)
        _case(failures, "subgroup of ranks 0 and p-1", run)


def _ring(x, op):
    got = x.clone()
    comm.all_reduce(got, op=op)
    return got


def every_case(rank, world):
    """Runs in each spawned rank; returns the failures this rank saw."""
    failures = []
    for cases in (_all_reduce_cases, _reduce_scatter_cases, _all_gather_cases,
                  _all_to_all_cases, _local_error_cases, _cross_rank_error_cases,
                  _order_product_and_subgroup_cases):
        cases(rank, world, failures)
    return failures


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", [2, 3, 4])
def test_rungs_match_library(world):
    per_rank = run_local(every_case, world, timeout=240)
    failures = [f"rank {r}: {f}" for r, fs in enumerate(per_rank) for f in fs]
    assert not failures, "\n".join(failures[:40])


def _mismatched_algorithm_cases(rank, p):
    """Rank 0 picks another algorithm (or chunk count) than the rest: each call must raise
    a ValueError naming what differs on every rank, and the group must stay usable."""
    first = rank == 0
    x, messages = torch.randn(2 * p), []
    calls = {
        "ring vs library": lambda: comm.all_reduce(
            x.clone(), algorithm="ring" if first else "library"),
        "ring_chunked 2 vs 3 chunks": lambda: comm.all_reduce(
            x.clone(), algorithm="ring_chunked", chunks=2 if first else 3),
        "reduce_scatter ring vs ring_chunked": lambda: comm.reduce_scatter_tensor(
            torch.empty(2), x, algorithm="ring" if first else "ring_chunked"),
        "all_gather library vs ring": lambda: comm.all_gather_into_tensor(
            torch.empty(2 * p * p), x, algorithm="library" if first else "ring"),
        "all_to_all direct vs library": lambda: comm.all_to_all_single(
            torch.empty(2 * p), x, algorithm="direct" if first else "library"),
    }
    for name, call in calls.items():
        try:
            call()
            messages.append(f"{name}: did not raise")
        except ValueError as err:
            messages.append(str(err))
    ok = torch.ones(3)
    comm.all_reduce(ok, algorithm="library")
    return messages, ok.tolist()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [2, 3])
def test_ranks_with_different_algorithms_all_raise_at_once(world):
    """Once, they waited out the gloo timeout and then raised gloo's RuntimeError."""
    per_rank = run_local(_mismatched_algorithm_cases, world, timeout=60, group_timeout=20)
    others = ", ".join(f"'library' on rank {r}" for r in range(1, world))
    for messages, ok in per_rank:
        assert ok == [float(world)] * 3
        assert messages[0] == f"all_reduce: ranks disagree on algorithm: 'ring' on rank 0, {others}"
        assert "disagree on chunks: 2 on rank 0, 3 on rank 1" in messages[1]
        assert "reduce_scatter_tensor: ranks disagree on algorithm: 'ring' on rank 0" in messages[2]
        assert ("all_gather_into_tensor: ranks disagree on algorithm: 'library' on rank 0"
                in messages[3])
        assert "all_to_all_single: ranks disagree on algorithm: 'direct' on rank 0" in messages[4]
