"""Causal attention's tail: the order in which query blocks launch decides how long the last CUs run.

With causal masking, query block i of a head visits the key blocks up to its diagonal
(v3's loop bound), so the programs of one head range from one key block to all of them.
A CU that frees up takes the next program in launch order; the launch ends when the
last program does. Launching the short programs first leaves the long ones for the end,
where a few CUs run while the rest idle; launching the longest first (LPT: longest
processing time) leaves short ones to fill the gaps.

This is a model: each key block costs one unit, every CU slot takes the next program in
launch order as soon as it is free (list scheduling), and nothing else (XCD round robin,
L2 reuse, clocks) is modelled. Only a GPU can time the orders.
"""
from __future__ import annotations

import heapq

HEAD_ORDERS = ("v4", "longest_first", "zigzag")   # orders within a head, heads one after another
ORDERS = (*HEAD_ORDERS, "lpt")


def key_blocks(s: int, s_k: int, block_m: int, block_n: int) -> list[int]:
    """Key blocks each causal query block visits: v3's loop bound, the keys up to the block's
    last row (top-left aligned as in SDPA) and at most all of S_k."""
    for name, value in (("s", s), ("s_k", s_k), ("block_m", block_m), ("block_n", block_n)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    blocks_k = -(-s_k // block_n)
    return [min(blocks_k, -(-(i + 1) * block_m // block_n)) for i in range(-(-s // block_m))]


def within_head(n: int, order: str) -> list[int]:
    """The query blocks of one head in launch order. "v4": program id 0 is the query block
    and the fastest grid axis, so a head's blocks launch shortest first; "longest_first":
    reversed; "zigzag": the longest, then the shortest, then the second longest, ..."""
    if order == "v4":
        return list(range(n))
    if order == "longest_first":
        return list(range(n - 1, -1, -1))
    if order == "zigzag":
        pairs = [(n - 1 - i, i) for i in range(n // 2)]
        return [b for pair in pairs for b in pair] + ([n // 2] if n % 2 else [])
    raise ValueError(f"order must be one of {HEAD_ORDERS}, got {order!r}")


def launch_work(work: list[int], heads: int, order: str) -> list[int]:
    """The work of every program of the grid in launch order for ``heads`` (batch x heads)
    heads. "lpt" makes the query block the slow axis, longest first: every head's longest
    block, then every head's second longest, ...; the others launch head after head, each
    head's blocks in :func:`within_head`'s order."""
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    if order == "lpt":
        return [work[i] for i in within_head(len(work), "longest_first") for _ in range(heads)]
    one_head = [work[i] for i in within_head(len(work), order)]
    return one_head * heads


def makespan(work: list[int], slots: int) -> int:
    """When the last program ends if ``slots`` programs run at once and a free slot takes the
    next program in ``work``'s order (list scheduling)."""
    if slots < 1:
        raise ValueError(f"slots must be >= 1, got {slots}")
    free = [0] * min(slots, len(work))
    heapq.heapify(free)
    for units in work:
        heapq.heappush(free, heapq.heappop(free) + units)
    return max(free, default=0)
