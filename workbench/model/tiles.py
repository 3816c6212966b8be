"""Output tiles in launch order, the waves of them that run together, and their memory traffic.

A launch of ``T`` tile programs on ``C`` CUs holding ``R`` programs each runs in waves
of ``C x R`` programs (wave quantization: a last, partial wave costs nearly a whole
one). Workgroups are dealt to the XCDs round robin (:mod:`kernels.xcd`), each XCD with
its own L2 in front of the shared Infinity Cache (MALL) and HBM.

Traffic of one wave, the tiles that run at the same time (the model's rule: they walk
K together, so operand blocks they share are fetched once; tiles of different waves
share nothing):

* ``l2``: every tile requests its A rows and B columns over the whole K;
* ``llc``: what the XCDs' L2s miss: per XCD, the distinct A row blocks and B column
  blocks its tiles read;
* ``hbm``: the distinct A row blocks and B column blocks of the whole wave.

The C tile each program writes (v6's split units: an fp32 partial tile; its fixup
kernel: the partials it reads, too) is added to every level.
"""
from __future__ import annotations

from dataclasses import dataclass


def grouped(index: int, tiles_m: int, tiles_n: int, group_m: int) -> tuple[int, int]:
    """The (row, column) tile of program ``index`` in grouped order: ``group_m`` tile rows
    per group, walked column by column (the GEMM rungs' order from v3 on)."""
    group_size = group_m * tiles_n
    first_m = (index // group_size) * group_m
    rows = min(tiles_m - first_m, group_m)
    return first_m + (index % group_size) % rows, (index % group_size) // rows


def round_robin(index: int, xcds: int) -> int:
    """The XCD that runs hardware program id ``index`` (:mod:`kernels.xcd`)."""
    return index % xcds


@dataclass(frozen=True)
class Wave:
    """Programs that run at the same time: each as (XCD, (tile row, tile column)), and the
    K extent each of them walks."""

    placed: tuple[tuple[int, tuple[int, int]], ...]
    k: int
    out_bytes: float | None = None   # what each program writes; None: its C tile in the dtype
    read_bytes: float = 0.0          # what each program reads besides A and B (v6's fixup: partials)


def waves(programs: int, slots: int) -> list[range]:
    """Program ids of each wave, in dispatch order."""
    return [range(start, min(start + slots, programs)) for start in range(0, programs, slots)]


def traffic(wave: Wave, shape: tuple[int, int, int], block: tuple[int, int], elem_bytes: float,
            xcds: int) -> dict[str, float]:
    """Bytes each memory level moves for one wave of a GEMM (the rule in the module docstring)."""
    m, n, _ = shape
    bm, bn = block
    return block_traffic(wave, lambda i: min(bm, m - i * bm), lambda j: min(bn, n - j * bn),
                         lambda i, j: j, elem_bytes, xcds)


def block_traffic(wave: Wave, rows, cols, b_block, elem_bytes: float, xcds: int) -> dict[str, float]:
    """:func:`traffic` for tiles whose B block is not their column alone: ``rows(i)`` and
    ``cols(j)`` are the extents of tile ``(i, j)``, ``b_block(i, j)`` names the B block it
    reads (a GEMM's column ``j``; a grouped GEMM's (expert of row tile ``i``, ``j``))."""
    k = wave.k
    tiles = [tile for _, tile in wave.placed]
    out_bytes = (sum(rows(i) * cols(j) for i, j in tiles) * elem_bytes if wave.out_bytes is None
                 else len(tiles) * wave.out_bytes) + len(tiles) * wave.read_bytes
    requested = sum(rows(i) + cols(j) for i, j in tiles) * k * elem_bytes

    def distinct(part) -> float:
        b_blocks = {b_block(i, j): cols(j) for i, j in part}
        return (sum(rows(i) for i in {t[0] for t in part}) + sum(b_blocks.values())) * k * elem_bytes

    per_xcd = [[t for x_of, t in wave.placed if x_of == x] for x in range(xcds)]
    return {"l2": requested + out_bytes,
            "llc": sum(distinct(p) for p in per_xcd if p) + out_bytes,
            "hbm": distinct(tiles) + out_bytes}
