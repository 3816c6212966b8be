"""Interview family: deriving the FlashAttention-2 backward and choosing how to write dQ.

The identities are checked numerically here (float64 on a small random problem), the
product counts read from the spec and from attention v5's source, and the cost of atomics
shown by summing the same fp32 partials in two orders.
"""
from __future__ import annotations

import ast
import inspect
import textwrap

import torch

import kernels
from kernels.attention import v5_backward

from ..flashcards import Card, one_of
from ...harness.table import html_table

FAMILY = "FA2 backward and the dQ strategy"
SEED = 0


def delta_rows() -> list[dict]:
    """max |rowsum(dO ∘ O) - rowsum(P ∘ dP)| on random float64 inputs, without and with a mask."""
    g = torch.Generator().manual_seed(SEED)
    q, k, v, do = (torch.randn(24, 16, generator=g, dtype=torch.float64) for _ in range(4))
    rows = []
    for causal in (False, True):
        s = q @ k.T / 4
        if causal:
            s = s.masked_fill(~torch.ones(24, 24, dtype=torch.bool).tril(), float("-inf"))
        p = s.softmax(-1)
        o, dp = p @ v, do @ v.T
        gap = ((do * o).sum(-1) - (p * dp).sum(-1)).abs().max().item()
        rows.append({"causal": causal, "max |rowsum(dO∘O) - rowsum(P∘dP)|": gap})
    return rows


def _delta_card() -> Card:
    def answer():
        worst = max(r["max |rowsum(dO∘O) - rowsum(P∘dP)|"] for r in delta_rows())
        return ("Because they are equal: O = P V, so rowsum(dO ∘ O) = Σⱼ Pᵢⱼ (dO Vᵀ)ᵢⱼ = "
                f"rowsum(P ∘ dP) (float64, random inputs, with and without a causal mask: the "
                f"largest difference is {worst:.1e}). The softmax gradient dS = P ∘ (dP - Δ) needs "
                "Δ per row before any key block is visited; from O and dO it is one cheap "
                "preprocess pass (v5's `_bwd_delta_kernel`), from P and dP it would need the whole "
                "row of P, which FlashAttention never stores.")

    def claims():
        worst = max(r["max |rowsum(dO∘O) - rowsum(P∘dP)|"] for r in delta_rows())
        dense, causal = (r["max |rowsum(dO∘O) - rowsum(P∘dP)|"] for r in delta_rows())
        return {"They are equal, since O = P V; and O and dO are at hand": worst < 1e-12,
                "It is an approximation, good enough in bf16": 1e-12 <= worst < 1e-2,
                "It holds only without a causal mask": dense < 1e-12 <= causal}

    return Card("FA2 backward: the Δ term",
                "The backward needs Δᵢ = rowsum(P ∘ dP)ᵢ for dS = P ∘ (dP - Δ). FlashAttention-2 "
                "computes rowsum(dO ∘ O) instead. Why may it?",
                answer, lambda: [html_table(delta_rows(), caption="float64, 24 queries, 24 keys, D = 16")],
                claims, FAMILY)


def products(function) -> int:
    """``tl.dot`` calls one execution of ``function`` makes: of an if/else, the larger branch."""
    def count(nodes) -> int:
        total = 0
        for node in nodes:
            if isinstance(node, ast.If):
                total += max(count(node.body), count(node.orelse))
            else:
                total += sum(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                             and n.func.attr == "dot" for n in ast.walk(node))
        return total
    tree = ast.parse(textwrap.dedent(inspect.getsource(getattr(function, "fn", function))))
    return count(tree.body[0].body)


def product_rows() -> list[dict]:
    spec = kernels.spec("attention")
    shape = (1, 1, 1, 128, 128, 64, False)
    fa2 = round(2 * spec.backward_flops(shape) / spec.flops(shape))
    dkdv, dq = products(v5_backward._dkdv_step), products(v5_backward._dq_step)
    return [{"backward": "FlashAttention-2 (spec's FLOP count: 2.5x the forward's 2)", "products": fa2,
             "deterministic": "no: dQ by atomics"},
            {"backward": f"v5: dK/dV launch {dkdv} + dQ launch {dq}", "products": dkdv + dq,
             "deterministic": "yes"}]


def _products_card() -> Card:
    def counts():
        fa2, v5 = (r["products"] for r in product_rows())
        return fa2, v5

    def answer():
        fa2, v5 = counts()
        return (f"{fa2} and {v5}. FA2 recomputes S = QKᵀ, then dP = dO Vᵀ, dV += Pᵀ dO, dK += dSᵀ Q "
                f"and dQ += dS K: {fa2} products, one program per key block. v5 splits the work so "
                "no two programs write the same element: the dK/dV launch (one program per key "
                "block) and the dQ launch (one per query block) each recompute S and dP, "
                f"{v5} products, {v5}/{fa2} of the matrix work (counted from the source of "
                "`_dkdv_step` and `_dq_step`).")

    def claims():
        return one_of(counts(), ((5, 7), (4, 7), (5, 5), (7, 5)), "{0[0]} and {0[1]}")

    return Card("FA2 backward: products per block pair",
                "How many matrix products per (query block, key block) pair does FlashAttention-2's "
                "backward compute, and how many does a deterministic split with separate dK/dV "
                "and dQ launches (attention v5)?",
                answer, lambda: [html_table(product_rows(), caption="spec and v5 source")],
                claims, FAMILY)


def atomic_rows(blocks: int = 64) -> list[dict]:
    """One dQ tile's fp32 partials from ``blocks`` key blocks, summed in two arrival orders."""
    g = torch.Generator().manual_seed(SEED)
    partials = torch.randn(blocks, 64, 64, generator=g)
    forward = torch.zeros(64, 64)
    for block in partials:
        forward += block
    backward = torch.zeros(64, 64)
    for block in partials.flip(0):
        backward += block
    differ = int((forward != backward).sum())
    return [{"key blocks": blocks, "dQ elements": forward.numel(), "elements that differ between orders": differ,
             "largest difference": (forward - backward).abs().max().item()}]


def _dq_card() -> Card:
    def answer():
        row = atomic_rows()[0]
        fa2, v5 = (r["products"] for r in product_rows())
        return ("Determinism. Atomics add each key block's dQ partial in whatever order the "
                "programs finish; fp32 addition is not associative, so the bits change run to run: "
                f"summing the same {row['key blocks']} partials in two orders changes "
                f"{row['elements that differ between orders']} of {row['dQ elements']} elements here. "
                "Bitwise-reproducible training (debugging a loss spike, comparing runs) needs the "
                f"same bits. v5 pays {v5}/{fa2} of the matrix work for it; the alternatives are "
                "atomics (fastest, nondeterministic), or dQ partials per key block written out and "
                "reduced in a fixed order (deterministic, costs memory and a pass).")

    def claims():
        row = atomic_rows()[0]
        fa2, v5 = (r["products"] for r in product_rows())
        return {f"Run-to-run determinism, paid with {v5}/{fa2} of the matrix work":
                    row["elements that differ between orders"] > 0 and v5 > fa2,
                "Atomics would give wrong gradients, not just different bits": row["largest difference"] > 1e-3,
                "The order of fp32 additions cannot change dQ, so it is for speed":
                    row["elements that differ between orders"] == 0}

    return Card("FA2 backward: choosing the dQ strategy",
                "FlashAttention-2 accumulates dQ with atomic adds from every key block's program. "
                "Attention v5 runs a separate dQ launch instead. What does it buy, at what price?",
                answer, lambda: [html_table(atomic_rows(), caption="fp32, seeded random partials"),
                                 html_table(product_rows(), caption="products per block pair")],
                claims, FAMILY)


def cards() -> list[Card]:
    return [_delta_card(), _products_card(), _dq_card()]
