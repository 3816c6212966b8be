"""Interview family: designing the collectives of expert-parallel training on 8 MI300X.

Byte counts come from the project's EP layout (:mod:`kernels.comm.ep_layout`) on a seeded
routing, times from the alpha-beta model over datasheet fabrics (:mod:`workbench.comm.model`),
always labelled model.
"""
from __future__ import annotations

import torch

import kernels
import roofline
from kernels.comm.cost_model import ALGORITHMS
from kernels.comm.ep_layout import dispatch_layout

from ...comm import model as comm_model
from ..flashcards import Card
from ...harness.table import html_table
from .evidence import ALPHA_S, BUCKET_BYTES, all_reduce_rows

FAMILY = "Designing an EP all-to-all"


def _comm_card() -> Card:
    def answer():
        rows = all_reduce_rows()
        best = min(rows[:-1], key=lambda r: r["ms"])
        one_link = rows[-1]
        peak = roofline.spec("MI300X").peak("bf16") * 1e12
        params = BUCKET_BYTES / 2   # bf16 gradients
        tokens = best["ms"] * 1e-3 * peak / (4 * params)   # backward: 4 FLOP per parameter per token
        ladders = ", ".join(kernels.ops())
        return (f"Alpha-beta model, with an assumed {ALPHA_S * 1e6:g} us per step: a 1 GiB "
                f"all-reduce on 8 MI300X is fastest as a {best['algorithm']} ({best['ms']:.2f} ms, "
                f"model) when it uses all {best['links used']} Infinity Fabric links. On this full "
                "mesh a ring and a two-shot (reduce-scatter, then all-gather, each one direct step) "
                "move the same bytes per rank; the two-shot needs 2 steps to the ring's 14, so "
                "latency alone separates them. A single ring "
                f"reaches one link per direction: {one_link['ms']:.1f} ms (model). A trace "
                "with a long all-reduce and idle links points at the channel count, not the "
                "fabric."
                "\n\n"
                f"Overlap: the backward of those {params:.3g} bf16 parameters costs 4 FLOP "
                f"per parameter per token, so at MI300X's bf16 peak it takes {tokens:.0f} "
                "tokens per GPU before the compute is as long as the all-reduce it should hide "
                "(model); with fewer tokens the step waits for the network even with perfect "
                "overlap. The workbench has no distributed-training ladder yet (ladders: "
                f"{ladders}), so this is model arithmetic, not a profile.")

    def evidence():
        return [html_table(all_reduce_rows() + all_reduce_rows("H200"),
                           caption=f"all_reduce of 1 GiB on 8 GPUs (model: alpha-beta, datasheet "
                                   f"fabrics, {ALPHA_S * 1e6:g} us per step assumed)")]

    def claims():
        rows = all_reduce_rows()[:-1]
        best = min(rows, key=lambda r: r["ms"])["algorithm"]
        return {alg: alg == best for alg in ALGORITHMS["all_reduce"]}

    return Card("Distributed: all-reduce and overlap",
                "8 MI300X, a 1 GiB gradient all-reduce per step: which algorithm does the "
                "alpha-beta model favour, and when can the backward hide it?",
                answer, evidence, claims, FAMILY)


EXPERTS, TOP_K, RANKS, TOKENS, HIDDEN = 256, 8, 8, 4096, 7168   # DeepSeek-V3's MoE layer


def routing_rows() -> list[dict]:
    """Wire rows per token of one rank's dispatch, naive and deduplicated, for uniform random
    top-8 routing over 256 experts on 8 ranks (a model: real routers are not uniform)."""
    g = torch.Generator().manual_seed(0)
    ids = torch.rand(TOKENS, EXPERTS, generator=g).topk(TOP_K, dim=1).indices
    layout = dispatch_layout(ids, EXPERTS, RANKS)
    return [{"tokens": TOKENS, "experts": EXPERTS, "top-k": TOP_K, "ranks": RANKS,
             "rows per token, naive": layout.rows_naive / TOKENS,
             "rows per token, dedup": layout.rows_dedup / TOKENS}]


def _dedup_card() -> Card:
    def dedup():
        return round(routing_rows()[0]["rows per token, dedup"], 1)

    def answer():
        row = routing_rows()[0]
        return (f"About {dedup():g} rows per token instead of {row['rows per token, naive']:g}: a token's 8 "
                f"experts fall on {dedup():g} distinct ranks on average ({EXPERTS // RANKS} experts per "
                "rank, uniform random routing on a seeded draw, `kernels.comm.ep_layout.dispatch_layout`; "
                "a model, real routers are skewed). Sending one row per (token, rank) and copying it "
                f"to each local expert on arrival saves {1 - dedup() / row['rows per token, naive']:.0%} "
                "of the dispatch bytes, DeepEP's design. DeepSeek-V3 also limits each token to 4 "
                "nodes (its technical report), which bounds the slow inter-node part.")

    def claims():
        right = dedup()
        return {f"about {v:g}": v == right for v in (right, float(TOP_K), round(right / 2, 1), 1.0)}

    return Card("EP all-to-all: deduplicating the dispatch",
                f"Expert parallelism, {EXPERTS} experts on {RANKS} ranks, top-{TOP_K} routing. A "
                "dispatch that sends one row per (token, destination rank) instead of one per "
                "(token, expert) sends how many rows per token?",
                answer, lambda: [html_table(routing_rows(), caption="seeded uniform routing (model)")],
                claims, FAMILY)


def all_to_all_rows() -> list[dict]:
    nbytes = round(routing_rows()[0]["rows per token, dedup"] * TOKENS) * HIDDEN * 2
    return [{**{k: r[k] for k in ("gpu", "algorithm", "latency")}, "bytes": nbytes, "ms": r["seconds"] * 1e3}
            for alpha in (0.0, ALPHA_S) for r in
            (comm_model.predict("MI300X", "all_to_all", alg, nbytes, alpha=alpha) for alg in ALGORITHMS["all_to_all"])]


def _pairwise_card() -> Card:
    def times():
        rows = all_to_all_rows()
        return {(r["latency"], r["algorithm"]): r["ms"] for r in rows}

    def answer():
        t = times()
        bound = "not modelled (bandwidth bound)"
        return (f"They tie on bandwidth: both push (p-1)/p of the buffer through each rank's links, "
                f"{t[(bound, 'pairwise')]:.3f} ms for the dedup bf16 dispatch on 8 MI300X (model, "
                "alpha-beta, datasheet fabric). They differ in messages: pairwise runs p-1 = 7 "
                f"steps, direct one, so with a {ALPHA_S * 1e6:g} us latency per message direct "
                f"takes {t[('given', 'direct')]:.3f} ms and pairwise {t[('given', 'pairwise')]:.3f} ms. "
                "On MI300X's full mesh, direct sends to all 7 peers at once over 7 links; a "
                "pairwise schedule uses one link per step unless it overlaps steps.")

    def claims():
        t = times()
        bound = "not modelled (bandwidth bound)"
        tie = abs(t[(bound, "pairwise")] - t[(bound, "direct")]) < 1e-12
        return {"They tie on bandwidth; only per-message latency separates them":
                    tie and t[("given", "direct")] < t[("given", "pairwise")],
                "Pairwise: it moves fewer bytes per link": t[(bound, "pairwise")] < t[(bound, "direct")],
                "Direct: it moves fewer bytes per link": t[(bound, "direct")] < t[(bound, "pairwise")]}

    return Card("EP all-to-all: pairwise or direct",
                "The dispatch all-to-all on 8 MI300X: pairwise exchange (p-1 steps, one peer each) "
                "or direct (every peer at once). What does the alpha-beta model say separates them?",
                answer, lambda: [html_table(all_to_all_rows(), caption="all_to_all, 8 MI300X (model)")],
                claims, FAMILY)


def cards() -> list[Card]:
    return [_dedup_card(), _pairwise_card(), _comm_card()]
