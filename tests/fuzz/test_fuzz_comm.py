"""Fuzz the ``kernels.comm`` collectives on 2-3 local gloo processes against
torch.distributed (``algorithm="library"``): sizes with 0 and 1 and not multiples of the
world size, uneven all-to-all splits, fp32 and bf16. Sums are judged by the harness's rule
against the float64 sum of every rank's data (each rank can draw all of it from the
seeds); gathers and all-to-all must be exact. Each example starts processes (seconds), so
the property test draws a quarter of the profile's examples, several collectives in each."""
from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fuzzing import assert_rule, sizes
from kernels import comm
from kernels.comm.launch import run_local

FEWER = settings(max_examples=max(2, settings.default.max_examples // 4))
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _data(shape, dtype, seed, rank):
    return torch.randn(shape, generator=torch.Generator().manual_seed(1000 * seed + rank)).to(dtype)


def _sum_case(kind, alg, n, dtype, seed, rank, world):
    """all_reduce or reduce_scatter_tensor (SUM): ours vs the library vs float64."""
    whole = n * world if kind == "reduce_scatter" else n
    every = [_data((whole,), dtype, seed, r) for r in range(world)]
    exact = torch.stack([t.double() for t in every]).sum(0)
    mine = every[rank]
    if kind == "all_reduce":
        got, base = mine.clone(), mine.clone()
        comm.all_reduce(got, algorithm=alg)
        comm.all_reduce(base, algorithm="library")
    else:
        exact = exact[rank * n:(rank + 1) * n]
        got, base = torch.full((n,), float("nan"), dtype=dtype), torch.empty(n, dtype=dtype)
        comm.reduce_scatter_tensor(got, mine.clone(), algorithm=alg)
        comm.reduce_scatter_tensor(base, mine.clone(), algorithm="library")
    assert_rule(f"{kind} {alg}", got, exact, base, dtype)


def _exact_case(kind, alg, n, dtype, seed, rank, world):
    """all_gather_into_tensor, or all_to_all_single with uneven splits: must equal the library."""
    if kind == "all_gather":
        x = _data((n,), dtype, seed, rank)
        got, want = (torch.full((world * n,), float("nan"), dtype=dtype) for _ in range(2))
        comm.all_gather_into_tensor(got, x, algorithm=alg)
        comm.all_gather_into_tensor(want, x, algorithm="library")
    else:   # rank r sends (n + r + 2j) % 3 rows of 2 to rank j
        ins = [(n + rank + 2 * j) % 3 for j in range(world)]
        outs = [(n + i + 2 * rank) % 3 for i in range(world)]
        x = _data((sum(ins), 2), dtype, seed, rank)
        got, want = (torch.full((sum(outs), 2), float("nan"), dtype=dtype) for _ in range(2))
        comm.all_to_all_single(got, x, outs, ins, algorithm=alg)
        comm.all_to_all_single(want, x, outs, ins, algorithm="library")
    assert torch.equal(got, want), f"{kind} {alg}: differs from the library"


CASES = {"all_reduce": (_sum_case, ("ring", "ring_chunked")),
         "reduce_scatter": (_sum_case, ("ring", "ring_chunked")),
         "all_gather": (_exact_case, ("ring", "ring_chunked")),
         "all_to_all": (_exact_case, ("pairwise", "direct"))}


def run_cases(rank, world, cases):
    """In each rank: every case, in order (all ranks run the same list); the failures seen."""
    failures = []
    for kind, alg, n, dtype, seed in cases:
        try:
            CASES[kind][0](kind, alg, n, DTYPES[dtype], seed, rank, world)
        except Exception as err:   # reported by the parent with the case
            failures.append(f"rank {rank} {kind} {alg} n={n} {dtype}: {type(err).__name__}: {err}")
    return failures


def _case():
    return st.sampled_from(sorted(CASES)).flatmap(lambda kind: st.tuples(
        st.just(kind), st.sampled_from(CASES[kind][1]), sizes(0, 7), st.sampled_from(sorted(DTYPES)),
        st.integers(0, 99)))


@FEWER
@given(world=st.sampled_from([2, 3]), cases=st.lists(_case(), min_size=1, max_size=6))
def test_collectives_match_the_library(world, cases):
    failures = [f for per_rank in run_local(run_cases, world, cases, timeout=60) for f in per_rank]
    assert not failures, "\n".join(failures)


def mixed_algorithms(rank, world):
    """Rank 0 asks for the ring, the others for the library: a mismatch to refuse on every rank."""
    try:
        comm.all_reduce(torch.ones(6), algorithm="ring" if rank == 0 else "library")
    except ValueError as err:
        return f"ValueError: {err}"
    except Exception as err:
        return f"not a ValueError: {type(err).__name__}: {err}"
    return "no error"


def test_ranks_that_pass_different_algorithms_all_raise():
    """Bug 9: with ``validate=True`` the cross-rank check refuses it at once, on every rank,
    naming the argument, instead of a hang until the gloo timeout."""
    outcomes = run_local(mixed_algorithms, 2, timeout=30, group_timeout=10)
    assert all(o.startswith("ValueError") and "algorithm" in o for o in outcomes), outcomes
