"""Interview family: designing an LDS layout without bank conflicts (padding, XOR swizzle).

Bank arithmetic is the workbench's one bank model (:mod:`workbench.isa.lds_banks`: 32 banks of
4 bytes, lanes served in groups that move 128 bytes, a group's passes the most distinct
dwords one bank must deliver). How the hardware really groups wide accesses is for
rocprof-compute's LDS bank-conflict counter on a GPU.
"""
from __future__ import annotations

from ..flashcards import Card, one_of
from ...isa.lds_banks import BANK_BYTES, BANKS, conflict_degree
from ...harness.table import html_table

FAMILY = "Designing an LDS swizzle"
LANES = 64


def column_read(row_bytes: int) -> int:
    """Lane i reads the 4-byte word at column 0 of row i of a tile with ``row_bytes`` per row."""
    return conflict_degree([lane * row_bytes for lane in range(LANES)], 4)


def _column_card() -> Card:
    def answer():
        return (f"{column_read(256)}-way: each row of 64 fp32 is 256 bytes, a multiple of the "
                f"{BANKS} banks x {BANK_BYTES} B = 128 bytes, so column 0 of every row sits in bank 0 "
                f"and the {BANKS} lanes served together queue on one bank (model). It is the "
                "access of every transpose through LDS: a tile written by rows, read by columns.")

    def claims():
        return one_of(column_read(256), (1, 2, 16, 32), "{}-way")

    return Card("Swizzle: a column of a row-major tile",
                "A 64x64 fp32 tile is stored row-major in LDS; lane i reads row i, column 0 "
                "(`ds_read_b32`). How many ways do the reads conflict?",
                answer, lambda: [html_table(_padding_rows(), caption="bank model: conflict degree of "
                                                                     "a column read")],
                claims, FAMILY)


def _padding_rows() -> list[dict]:
    return [{"row bytes": b, "padding bytes per row": b - 256, "conflict degree": column_read(b),
             "LDS overhead of a 64-row tile": f"{(b - 256) / 256:.1%}"} for b in (256, 260, 264, 272)]


def _padding_card() -> Card:
    def answer():
        return (f"{column_read(260)}-way, i.e. conflict-free: with 260-byte rows, row i's column 0 "
                f"is word 65·i, bank (65·i) mod 32 = i mod 32, a different bank for each of the 32 "
                f"lanes served together. It costs 4 bytes per 256 ({4 / 256:.1%} of the tile's LDS). "
                f"Pad by 8 bytes instead and the degree is {column_read(264)}: the padding must be "
                "odd in words. The catch: a row of 260 bytes breaks 16-byte alignment, so the "
                "wide `ds_read_b128`/`ds_write_b128` a pipelined GEMM wants are no longer legal "
                "on every row; that is why kernels swizzle instead.")

    def claims():
        return one_of(column_read(260), (1, 2, 4, 32), "{}-way")

    return Card("Swizzle: padding a row by one word",
                "Same tile and access, but each row padded by one 4-byte word (260-byte rows). How "
                "many ways do the reads conflict now, and what does the padding cost?",
                answer, lambda: [html_table(_padding_rows(), caption="bank model")], claims, FAMILY)


SWIZZLES = {"no swizzle": lambda row: 0, "XOR the 16-byte chunk with row % 8": lambda row: row % 8,
            "XOR the 16-byte chunk with row % 4": lambda row: row % 4,
            "XOR the 16-byte chunk with (row // 8) % 8": lambda row: (row // 8) % 8}


def swizzle_rows() -> list[dict]:
    """fp16 64x64 tile, 128-byte rows of eight 16-byte chunks; lane i reads chunk 0 of row i."""
    return [{"layout": name, "conflict degree (ds_read_b128)":
             conflict_degree([row * 128 + ((0 ^ f(row)) * 16) for row in range(LANES)], 16)}
            for name, f in SWIZZLES.items()]


def _swizzle_card() -> Card:
    def degrees():
        return {r["layout"]: r["conflict degree (ds_read_b128)"] for r in swizzle_rows()}

    def answer():
        d = degrees()
        return (f"XOR the 16-byte chunk index with row % 8: {d['no swizzle']}-way becomes "
                f"{d['XOR the 16-byte chunk with row % 8']}-way (model). A row is 128 bytes, all 32 "
                "banks, so unswizzled every row's chunk 0 is banks 0-3 and the 8 lanes that share "
                "a 128-byte pass collide. XOR with row % 8 sends row r's chunk 0 to chunk r % 8: "
                "eight rows, eight different bank quads. The writes use the same XOR, so each "
                "16-byte vector stays whole and aligned (no padding, `ds_write_b128` still "
                f"legal). row % 4 leaves {d['XOR the 16-byte chunk with row % 4']}-way; (row // 8) "
                "% 8 is constant over the 8 rows of a pass and leaves "
                f"{d['XOR the 16-byte chunk with (row // 8) % 8']}-way. "
                "Triton's AMD backend picks such XOR swizzles for its LDS layouts "
                "(`#ttg.swizzled_shared<{vec, perPhase, maxPhase}>`).")

    def claims():
        d = degrees()
        return {name: d[name] == 1 and name != "no swizzle" for name in SWIZZLES}

    return Card("Swizzle: a conflict-free layout without padding",
                "An fp16 64x64 tile, 128-byte rows; lane i reads 16 bytes (`ds_read_b128`) at "
                "chunk 0 of row i. Which layout removes the bank conflicts without padding?",
                answer, lambda: [html_table(swizzle_rows(), caption="bank model")], claims, FAMILY)


def cards() -> list[Card]:
    return [_column_card(), _padding_card(), _swizzle_card()]
