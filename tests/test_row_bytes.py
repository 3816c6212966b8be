"""``kernels.comm.row_bytes``: parts of several dtypes packed per row survive any permutation
of the rows (what an all-to-all does to them) and unpack to their bits."""
from __future__ import annotations

import pytest
import torch

from kernels.comm import row_bytes


def _parts(rows: int):
    gen = torch.Generator().manual_seed(rows)
    return (torch.randn(rows, 7, generator=gen).to(torch.float8_e4m3fn),   # an FP8 row
            torch.randn(rows, generator=gen),                              # a float32 per row
            torch.randint(0, 256, (rows, 3), generator=gen, dtype=torch.uint8))


@pytest.mark.parametrize("rows", [0, 1, 6])
def test_packed_rows_permute_and_unpack_to_their_bits(rows):
    parts = _parts(rows)
    packed = row_bytes.pack(*parts)
    assert packed.dtype == torch.uint8 and packed.shape == (rows, 7 + 4 + 3)
    order = torch.randperm(rows, generator=torch.Generator().manual_seed(1))
    got = row_bytes.unpack(packed[order], row_bytes.layout(*parts))
    for g, want in zip(got, parts, strict=True):
        assert g.dtype == want.dtype and g.shape == want.shape and g.is_contiguous()
        assert torch.equal(g.view(torch.uint8), want[order].view(torch.uint8))


def test_mismatched_parts_and_layouts_are_refused():
    q, scale, _ = _parts(4)
    with pytest.raises(ValueError, match="every part needs the same rows"):
        row_bytes.pack(q, scale[:3])
    with pytest.raises(ValueError, match="rows of 11 bytes do not hold the layout"):
        row_bytes.unpack(row_bytes.pack(q, scale), row_bytes.layout(q))
