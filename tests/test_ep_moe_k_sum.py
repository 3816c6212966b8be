"""The expert-parallel layer's k-sums (the sender's weighted sum of a token's k slot rows, and
in the backward each slot's weighted output gradient, the routing weights' gradient and the
sum of a token's k input gradients) are the Triton k-sums ``Float8MoE`` runs
(:mod:`kernels.moe.layer_ladder.slot_sum`, :mod:`kernels.moe.layer_ladder.combine_backward`):
over one forward and backward on 2 gloo processes no torch op touches a (T, k, dim) tensor,
none computes over the (T·k, dim) slot rows, and in bf16 none writes them in float32; the
results are the single-process layer's as ``tests/test_ep_moe.py`` holds them (fp32: the
reassociation bound; bf16: its bf16 tolerance), kernel outputs poisoned. Odd shapes: k = 1
and 3, T = 19 and 7 on the two ranks (not multiples of the k-sum's 16-token tile), dim 129
(past its 128-column tile), 2 chunks for k = 3. On a one-rank group, where the owner's rows
are the single-process layer's, the same kernels give the same bits: the FP8 layer's output and
gradients are ``Float8MoE``'s (the fp32 output is ``kernels.MoE``'s to the reassociation bound:
its GEMMs are tiled otherwise).
"""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import kernels
from kernels.comm.launch import run_local
from kernels.moe.ep_fp8_layer import Float8ExpertParallelMoE
from kernels.moe.fp8_layer import Float8MoE
from kernels.outputs import poisoned_outputs

from ep_gradients import differs, grads_of, grads_per_dy
from rows_by_hidden import RowsByHidden

pytestmark = pytest.mark.timeout(600)

DIM, HIDDEN, EXPERTS, TOKENS = 129, 20, 4, (19, 7)
ARITHMETIC = {"aten.mul", "aten.sum", "aten.add", "aten._to_copy"}
"""Torch ops that would compute over the slot rows rather than move them."""


CASES = [(top_k, chunks, dtype) for top_k, chunks in ((1, 1), (3, 2)) for dtype in (torch.float32, torch.bfloat16)]
"""(k, EP chunks, dtype) of the 2-rank test's cases."""


def _layer_and_tokens(top_k, dtype):
    """The single-process layer of k = ``top_k``, and each rank's tokens and output gradients."""
    torch.manual_seed(top_k)
    full = kernels.MoE(DIM, HIDDEN, EXPERTS, top_k).to(dtype)
    g = torch.Generator().manual_seed(10 + top_k)
    xs = [torch.randn(n, DIM, generator=g).to(dtype) for n in TOKENS]
    gs = [torch.randn(n, DIM, generator=g).to(dtype) for n in TOKENS]
    return full, xs, gs


def _references(rank, world):
    """Per case, the single-process layer's results on all ranks' tokens. Every rank needs all of
    them; each runs its share of the cases (the same layer and tokens as the others would: the
    same bits) and the ranks gather them, rather than every rank running every case."""
    share = {}
    for i, (top_k, _, dtype) in enumerate(CASES):
        if i % world == rank:
            full, xs, gs = _layer_and_tokens(top_k, dtype)
            share[i] = grads_of(full, torch.cat(xs), torch.cat(gs))
    shares = [None] * world
    dist.all_gather_object(shares, share)
    gathered = {i: result for share in shares for i, result in share.items()}
    return [gathered[i] for i in range(len(CASES))]


def _case(rank, top_k, dtype, chunks, reference, failures):
    """One EP forward and backward of this rank's tokens against the single-process layer's
    ``reference`` on all ranks' tokens, mismatches appended to ``failures``; returns (the
    case's name, the recorders of the ops seen on (T·k, dim) and on (T, k, dim) tensors)."""
    full, xs, gs = _layer_and_tokens(top_k, dtype)
    out_all, dx_all, g_all = reference
    ep = kernels.MoE.from_full(full, dist.group.WORLD, ep_chunks=chunks)
    t = TOKENS[rank]
    with poisoned_outputs(), RowsByHidden((t * top_k, DIM)) as slots, \
            RowsByHidden((t, top_k, DIM)) as by_token:
        out, dx, grads = grads_of(ep, xs[rank], gs[rank])
    rows = slice(sum(TOKENS[:rank]), sum(TOKENS[:rank + 1]))
    experts = slice(ep.local_experts.start, ep.local_experts.stop)
    received = ep.expert_counts.clone()
    dist.all_reduce(received)   # dropless: this rank's experts' rows, as its owner computes on them
    assert top_k == 1 or int(received[experts].sum()) != t * top_k, (
        "the owner's rows have the slot rows' shape: the recorders would see the owner's ops too")
    dist.all_reduce(grads["router.weight"])
    pairs = {"out": (out, out_all[rows]), "dx": (dx, dx_all[rows]),
             "drouter (summed)": (grads["router.weight"], g_all["router.weight"])}
    pairs |= {f"d{n}": (grads[n], g_all[n][experts]) for n in ("gate", "up", "down")}
    name = f"k {top_k} {dtype}"
    for key, (got, want) in pairs.items():
        try:
            assert got.dtype == dtype and got.isfinite().all()
            if dtype == torch.bfloat16:      # test_ep_moe's bf16 tolerance
                torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)
            elif key.startswith("drouter"):  # test_ep_moe's for summed replicated gradients
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
            else:
                assert (why := differs(got, want)) is None, why
        except AssertionError as err:
            failures.append(f"{name}: {key}: {err}")
    return name, slots, by_token


def _cases(rank, world):
    failures, seen = [], []
    for (top_k, chunks, dtype), reference in zip(CASES, _references(rank, world)):
        name, slots, by_token = _case(rank, top_k, dtype, chunks, reference, failures)
        seen.append((name, top_k, dtype, slots.ops, slots.torch_ops(), slots.float32_outputs(), by_token.ops))
    return failures, seen


def test_ep_layer_sums_slots_with_triton_k_sums_and_matches_the_single_process_layer():
    """No (T, k, dim) tensor at all; for k > 1 (where (T·k, dim) is no other tensor's shape: k = 1
    makes it x's) no arithmetic torch op over the slot rows, and in bf16 no float32 copy of them;
    results as the single-process layer's."""
    for failures, seen in run_local(_cases, 2, timeout=540, group_timeout=400):
        assert failures == []
        for name, top_k, dtype, slot_ops, torch_ops, float32_outputs, by_token in seen:
            assert by_token == [], (name, by_token)
            if top_k > 1:
                assert slot_ops and not torch_ops & ARITHMETIC, (name, torch_ops)
                if dtype == torch.bfloat16:
                    assert float32_outputs == [], (name, float32_outputs)


def _one_rank(rank, world):
    """On a 1-rank group, where the owner's rows are the single-process layer's rows in its
    order: per (layer, FP8 dispatch, k), which results equal the single-process layer's bit
    for bit (v3's output: to the reassociation bound)."""
    def layers(top_k, dtype):
        torch.manual_seed(top_k)
        full = kernels.MoE(DIM, HIDDEN, EXPERTS, top_k).to(dtype)
        return full, kernels.MoE.from_full(full, dist.group.WORLD, ep_chunks=2)

    same = {}
    for top_k in (1, 3):
        g = torch.Generator().manual_seed(20 + top_k)
        x, dy = torch.randn(TOKENS[0], DIM, generator=g), torch.randn(TOKENS[0], DIM, generator=g)
        full, ep = layers(top_k, torch.float32)
        with poisoned_outputs():
            results = {("v3", False): (grads_of(full, x, dy), grads_of(ep, x, dy))}
        # the output gradient as autograd may hand it: dense, a row broadcast (stride (0, 1)), a
        # scalar's (stride (0, 0), from out.sum().backward()); each layer runs one forward for
        # all of them (grads_per_dy), FP8 dispatch with the dense one
        grads_out = {"rowwise": dy.bfloat16(), "rowwise, dy a broadcast row": dy[0].bfloat16().expand_as(dy),
                     "rowwise, dy a broadcast scalar": torch.ones((), dtype=torch.bfloat16).expand_as(dy)}
        with poisoned_outputs():
            # the single-process layer's results per output gradient, run once: FP8 dispatch is
            # the EP layer's alone, so with it and without, the same layer on the same x and dy
            reference = Float8MoE.from_moe(layers(top_k, torch.bfloat16)[0], "rowwise", torch.float8_e4m3fn)
            references = dict(zip(grads_out, grads_per_dy(reference, x.bfloat16(), list(grads_out.values()))))
            for dispatch, kinds in ((False, list(grads_out)), (True, ["rowwise"])):
                ep = Float8ExpertParallelMoE.from_ep(layers(top_k, torch.bfloat16)[1], "rowwise", torch.float8_e4m3fn)
                ep.fp8_dispatch = dispatch
                got = grads_per_dy(ep, x.bfloat16(), [grads_out[kind] for kind in kinds])
                results |= {(kind, dispatch): (references[kind], b) for kind, b in zip(kinds, got)}
        for (kind, dispatch), ((a_out, a_dx, a_grads), (b_out, b_dx, b_grads)) in results.items():
            if kind == "v3":   # other GEMM tiles: the reassociation bound (test docstring)
                same[kind, dispatch, top_k] = {"out": differs(b_out, a_out) is None}
                continue
            same[kind, dispatch, top_k] = {"out": torch.equal(a_out, b_out), "dx": torch.equal(a_dx, b_dx)} | {
                n: torch.equal(a_grads[n], b_grads[n]) for n in a_grads}
    return same


def test_on_one_rank_the_k_sums_give_the_single_process_layers_bits():
    """One rank: fp32 output as ``kernels.MoE``'s to the reassociation bound (v3 rounds ``acc·w``
    to fp32 and adds the k rows in slot order, the EP layer multiplies the weight-1 row by w in
    fp32 and adds in the same order, but its expert GEMMs are the grouped GEMM's, tiled otherwise
    than v3's fused kernel: on the CPU each tile's product is a BLAS call whose summation order
    follows the tile's shape and the CPU, and OpenBLAS's AVX2 (Haswell) kernels gave other bits
    where its AVX-512 ones gave the same; its backward is not v3's, :mod:`kernels.moe.ep_layer`);
    the FP8 layer (rowwise) ``Float8MoE``'s output and every gradient bit for bit, the GEMMs, the
    k-sums and the combine's backward being the same kernels in the same order; with FP8
    dispatch all but gate's and up's weight gradients (requantized from the dequantized rows,
    :mod:`kernels.moe.ep_fp8_layer`). The output gradient also comes broadcast, as autograd
    hands a sum's (strides (0, 1), (0, 0))."""
    everything = {"out", "dx", "router.weight", "gate", "up", "down"}
    for (kind, dispatch, top_k), same in run_local(_one_rank, 1, timeout=540, group_timeout=400)[0].items():
        want = {"out"} if kind == "v3" else everything - ({"gate", "up"} if dispatch else set())
        assert {key for key, equal in same.items() if equal} >= want, (kind, dispatch, top_k, same)
