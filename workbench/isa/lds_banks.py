"""A bank model of one ``ds_read_b128``/``ds_write_b128`` on CDNA3 (gfx942), to reason about
LDS conflicts on a CPU.

The LDS of a CDNA3 CU has 32 banks of 4 bytes (ROCm blog "Avoiding LDS Bank Conflicts on AMD
GPUs Using CK-Tile Framework", 2025), and a 16-byte-per-lane access is served in 8 phases of 8
consecutive lanes, 0-7, 8-15, ..., 56-63 (Composable Kernel docs, "Understanding AMD GPU LDS
and Bank Conflicts"): 8 lanes x 16 bytes fill one row of the 32 banks. Within a phase each bank
serves one dword per pass, and lanes reading the same dword share it. The model counts the sum
over the phases of the busiest bank's distinct dwords: 8 passes when conflict-free. It models the
documented rule; a GPU's ``SQ_LDS_BANK_CONFLICT`` counter is the measurement.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

BANKS = 32
BANK_BYTES = 4
WAVE = 64
WIDTH = 16                                   # bytes per lane of a b128 access
LANES_PER_PHASE = BANKS * BANK_BYTES // WIDTH  # 8
CONFLICT_FREE = WAVE // LANES_PER_PHASE        # 8 passes


def group_passes(addresses: Sequence[int], width: int = WIDTH) -> list[int]:
    """Per group of lanes served together (as many as move 128 bytes: 8 at 16 bytes, 32 at 4),
    the passes it takes: the most distinct dwords any bank must deliver (a dword several lanes
    read is a broadcast, one pass). ``addresses[lane]`` is a byte address; ``width`` the bytes
    each lane reads (4, 8 or 16)."""
    if width not in (4, 8, 16):
        raise ValueError(f"width must be 4, 8 or 16 bytes, got {width!r}")
    group, counts = BANKS * BANK_BYTES // width, []
    for start in range(0, len(addresses), group):
        dwords = defaultdict(set)
        for address in addresses[start:start + group]:
            for word in range(address // BANK_BYTES, (address + width) // BANK_BYTES):
                dwords[word % BANKS].add(word)
        counts.append(max(len(words) for words in dwords.values()))
    return counts


def conflict_degree(addresses: Sequence[int], width: int) -> int:
    """Passes the worst group of lanes needs: 1 when the access is conflict-free."""
    return max(group_passes(addresses, width), default=1)


def passes(addresses: Sequence[int]) -> int:
    """Bank passes of one wave's b128 access; ``addresses[lane]`` is the lane's byte address."""
    if len(addresses) != WAVE:
        raise ValueError(f"addresses must hold one byte address per lane of a {WAVE}-lane wave, "
                         f"got {len(addresses)}")
    bad = [a for a in addresses if a < 0 or a % WIDTH]
    if bad:
        raise ValueError(f"addresses must be non-negative and {WIDTH}-byte aligned, got {bad[0]}")
    return sum(group_passes(addresses, WIDTH))


def tile_addresses(rows: Sequence[int], chunks: Sequence[int], row_bytes: int,
                   pad_bytes: int = 0, xor_rows: int = 1) -> list[int]:
    """Byte addresses of lanes reading 16-byte chunk ``chunks[i]`` of row ``rows[i]`` of a
    row-major LDS tile: plain, padded (``pad_bytes`` after every row), or XOR-swizzled (chunk
    ``c`` of row ``r`` stored at chunk ``c ^ (r % xor_rows)``, the form of CK's and Triton's
    swizzles), so the three layouts can be compared with :func:`passes`."""
    if row_bytes % WIDTH or (row_bytes // WIDTH) % xor_rows:
        raise ValueError(f"row_bytes ({row_bytes}) must hold a whole number of {WIDTH}-byte "
                         f"chunks, a multiple of xor_rows ({xor_rows})")
    return [r * (row_bytes + pad_bytes) + (c ^ (r % xor_rows)) * WIDTH
            for r, c in zip(rows, chunks, strict=True)]

