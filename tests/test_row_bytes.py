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


@pytest.mark.parametrize("rows", [0, 1, 6])
@pytest.mark.parametrize("fp8_width", [8, 7], ids=["aligned", "unaligned"])
def test_views_share_the_rows_bytes_where_their_dtype_allows(rows, fp8_width):
    """views() gives unpack()'s values; a part whose offset and row length are multiples of its
    item size is a view into the rows (no copy), the float32 scale after 7 FP8 bytes a copy."""
    gen = torch.Generator().manual_seed(rows)
    parts = (torch.randn(rows, fp8_width, generator=gen).to(torch.float8_e4m3fn),
             torch.randn(rows, 1, generator=gen))
    packed = row_bytes.pack(*parts)[torch.randperm(rows, generator=gen)]
    layout = row_bytes.layout(*parts)
    got = row_bytes.views(packed, layout)
    for g, want in zip(got, row_bytes.unpack(packed, layout), strict=True):
        assert g.dtype == want.dtype and g.shape == want.shape
        assert torch.equal(g.view(torch.uint8), want.view(torch.uint8))
    if rows:
        shared = [g.untyped_storage().data_ptr() == packed.untyped_storage().data_ptr() for g in got]
        assert shared == [True, fp8_width % 4 == 0]
