"""kernels.moe.permute and unpermute: order, offsets, edge cases, gradients, determinism."""
from __future__ import annotations

import pytest
import torch

from kernels.moe import permute, route, unpermute


def _ids(rows):
    return torch.tensor(rows, dtype=torch.int32)


def test_permute_sorts_slots_by_expert_then_token_then_slot():
    x = torch.arange(4.0).view(4, 1).expand(4, 3).contiguous()   # row t holds t
    ids = _ids([[2, 0], [0, 2], [2, 1], [0, 1]])
    x_sorted, offsets, permutation = permute(x, ids, 4)
    assert permutation.tolist() == [1, 2, 6, 5, 7, 0, 3, 4]      # slots t*k + j
    assert offsets.dtype == torch.int32 and offsets.tolist() == [3, 5, 8, 8]
    assert x_sorted[:, 0].tolist() == [0, 1, 3, 2, 3, 0, 1, 2]


def _weighted_sum(x, ids, weights):
    return (x.unsqueeze(1) * weights.unsqueeze(-1)).sum(1)   # each expert the identity


@pytest.mark.parametrize("t, e, k", [(1, 4, 2), (9, 3, 3), (17, 8, 2), (5, 1, 1)])
def test_unpermute_inverts_permute_with_weights(t, e, k):
    gen = torch.Generator().manual_seed(t)
    x = torch.randn(t, 6, generator=gen)
    weights, ids = route(torch.randn(t, e, generator=gen), k)
    x_sorted, offsets, permutation = permute(x, ids, e)
    assert offsets[-1].item() == t * k
    torch.testing.assert_close(unpermute(x_sorted, permutation, weights),
                               _weighted_sum(x, ids, weights))


def test_every_token_to_one_expert_leaves_the_others_empty():
    x = torch.randn(6, 5)
    ids = torch.full((6, 1), 2, dtype=torch.int32)
    x_sorted, offsets, permutation = permute(x, ids, 4)
    assert offsets.tolist() == [0, 0, 6, 6]
    assert torch.equal(x_sorted, x) and permutation.tolist() == list(range(6))


def test_no_tokens():
    x_sorted, offsets, permutation = permute(torch.empty(0, 4), torch.empty(0, 2, dtype=torch.int32), 3)
    assert x_sorted.shape == (0, 4) and offsets.tolist() == [0, 0, 0] and permutation.numel() == 0
    assert unpermute(x_sorted, permutation, torch.empty(0, 2)).shape == (0, 4)


def test_unpermute_sums_in_float32_and_returns_y_dtype():
    x = torch.randn(7, 8).bfloat16()
    weights, ids = route(torch.randn(7, 4), 2)
    x_sorted, _, permutation = permute(x, ids, 4)
    out = unpermute(x_sorted, permutation, weights)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, _weighted_sum(x.float(), ids, weights).bfloat16())


def test_gradcheck_in_float64():
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(5, 3, dtype=torch.float64, generator=gen, requires_grad=True)
    logits = torch.randn(5, 4, dtype=torch.float64, generator=gen, requires_grad=True)
    _, ids = route(logits, 2)
    _, _, permutation = permute(x, ids, 4)
    y = torch.randn(10, 3, dtype=torch.float64, generator=gen, requires_grad=True)
    assert torch.autograd.gradcheck(lambda v: permute(v, ids, 4)[0], (x,))
    assert torch.autograd.gradcheck(lambda v, z: unpermute(v, permutation, route(z, 2)[0]),
                                    (y, logits))


def _layer_like(x, logits, scale):
    weights, ids = route(logits, 3)
    x_sorted, _, permutation = permute(x, ids, logits.shape[1], check_ids=False)
    return unpermute(torch.tanh(x_sorted * scale), permutation, weights, check_permutation=False)


def test_forward_and_backward_are_bitwise_deterministic():
    gen = torch.Generator().manual_seed(8)
    inputs = (torch.randn(33, 16, generator=gen), torch.randn(33, 8, generator=gen))
    runs = []
    for _ in range(2):
        x, logits = (t.clone().requires_grad_() for t in inputs)
        out = _layer_like(x, logits, 1.5)
        out.backward(torch.ones_like(out))
        runs.append((out, x.grad, logits.grad))
    assert all(torch.equal(a, b) for a, b in zip(*runs))


def test_permute_and_unpermute_compile_without_graph_breaks():
    torch._dynamo.reset()
    compiled = torch.compile(_layer_like, fullgraph=True, backend="aot_eager")
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(11, 6, generator=gen, requires_grad=True)
    logits = torch.randn(11, 5, generator=gen, requires_grad=True)
    out = compiled(x, logits, 2.0)
    out.sum().backward()
    grads = x.grad, logits.grad
    x.grad = logits.grad = None
    eager = _layer_like(x, logits, 2.0)
    eager.sum().backward()
    torch.testing.assert_close(out, eager)
    torch.testing.assert_close(grads, (x.grad, logits.grad))


def test_permute_refuses_ids_out_of_range():
    with pytest.raises(ValueError, match=r"ids must lie in \[0, num_experts=3\), got values from 0 to 3"):
        permute(torch.randn(2, 4), _ids([[0, 3], [1, 2]]), 3)
    with pytest.raises(ValueError, match="ids must lie in"):
        permute(torch.randn(2, 4), _ids([[-1, 0], [1, 2]]), 3)


def test_permute_refuses_mismatched_operands():
    with pytest.raises(ValueError, match="ids has 3 tokens"):
        permute(torch.randn(2, 4), _ids([[0], [1], [2]]), 3)
    with pytest.raises(TypeError, match="ids has dtype float32"):
        permute(torch.randn(2, 4), torch.zeros(2, 1), 3)
    with pytest.raises(ValueError, match="ids is on meta"):
        permute(torch.randn(2, 4), torch.zeros(2, 1, dtype=torch.int32, device="meta"), 3)
    with pytest.raises(ValueError, match="num_experts must be a positive int"):
        permute(torch.randn(2, 4), _ids([[0], [0]]), 0)


def test_unpermute_refuses_mismatched_operands():
    x_sorted, _, permutation = permute(torch.randn(3, 4), _ids([[0, 1], [1, 0], [0, 1]]), 2)
    with pytest.raises(ValueError, match="weights .* has T·k = 4 slots"):
        unpermute(x_sorted, permutation, torch.ones(2, 2))
    with pytest.raises(TypeError, match="permutation has dtype int32"):
        unpermute(x_sorted, permutation.int(), torch.ones(3, 2))
