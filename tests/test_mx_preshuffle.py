"""Pre-shuffled e8m0 scales (kernels/mx_preshuffle.py): the layout byte by byte, and
the MX GEMM (MXFP4 and MXFP8) giving bit for bit the product of the row-major scales, at
shapes that end inside a 32-row stripe, an 8-scale chunk and (MXFP8) a 32-element block;
the MXFP8 quantize writing the layout itself, and the mxfp8 recipe that has it do so.
The gfx950 machine code it buys is pinned where that target's reports are built
(tests/test_gemm_mxfp4.py, tests/test_mxfp8.py; the quantize's, tests/test_fp8_quantize_isa.py).
"""
from __future__ import annotations

import re
from collections import Counter

import pytest
import torch

import kernels
from kernels.gemm_fp8 import mx_matmul
from kernels.gemm_mxfp4 import FORMAT, quantize_mxfp4
from kernels.gemm_mxfp4.formats import MXFP8
from kernels.gemm_mxfp4.launch import takes_preshuffled
from kernels.mx_preshuffle import preshuffle, preshuffled_shape, unshuffle
from kernels.outputs import poisoned_outputs
from workbench import isa
from workbench.isa import parse as isa_parse

SPEC = kernels.spec("gemm_mxfp4")
V0 = kernels.get("gemm_mxfp4", "v0")


@pytest.mark.parametrize("rows, blocks, transposed", [(45, 11, False), (64, 16, False), (64, 16, True)],
                         ids=["padded", "whole-stripes-and-chunks", "whole-transposed-view"])
def test_each_lanes_four_scales_are_one_word_of_its_stripe_and_chunk(rows, blocks, transposed):
    """Row 16a + b, scale 4c + d of stripe t and chunk h is byte 256h + 64d + 4b + 2c + a of
    row t: the module docstring's formula, checked at every position of an odd shape (a partial
    stripe and chunk, zero-filled), of whole stripes and chunks (no padding), and of a
    non-contiguous view of them."""
    gen = torch.Generator().manual_seed(0)
    scales = torch.randint(1, 255, (blocks, rows) if transposed else (rows, blocks), generator=gen,
                           dtype=torch.uint8)
    scales = scales.t() if transposed else scales
    shuffled = preshuffle(scales)
    assert shuffled.shape == preshuffled_shape(rows, blocks) and shuffled.is_contiguous()
    assert preshuffled_shape(45, 11) == (2, 512)
    expected = torch.zeros_like(shuffled)
    for row in range(rows):
        for block in range(blocks):
            (t, r), (h, s) = divmod(row, 32), divmod(block, 8)
            (a, b), (c, d) = divmod(r, 16), divmod(s, 4)
            expected[t, 256 * h + 64 * d + 4 * b + 2 * c + a] = scales[row, block]
    assert torch.equal(shuffled, expected)          # padding included: zero bytes, never 0xFF
    assert torch.equal(unshuffle(shuffled, rows, blocks), scales)


@pytest.mark.parametrize("rows, blocks", [(0, 11), (45, 0), (0, 0)])
def test_scales_of_no_rows_or_no_blocks_shuffle_to_their_shape_and_back(rows, blocks):
    """An empty batch (an FP8 Linear's x of no tokens) reaches preshuffle: no size to infer."""
    scales = torch.zeros(rows, blocks, dtype=torch.uint8)
    shuffled = preshuffle(scales)
    assert shuffled.shape == preshuffled_shape(rows, blocks)
    assert unshuffle(shuffled, rows, blocks).shape == (rows, blocks)


def test_quantize_mxfp4_writes_preshuffled_scales_for_a_gemm_operand():
    x = torch.randn(40, 96, generator=torch.Generator().manual_seed(1))
    packed, scales = quantize_mxfp4(x, axis=1)
    assert torch.equal(quantize_mxfp4(x, axis=1, preshuffled=True)[1], preshuffle(scales))
    assert torch.equal(quantize_mxfp4(x, preshuffled=True)[0], packed)
    with pytest.raises(ValueError, match="2-D x quantized along its last axis"):
        quantize_mxfp4(x, axis=0, preshuffled=True)


def _shuffled(inputs):
    a, sa, b, sb = inputs
    return a, preshuffle(sa), b, preshuffle(sb)


@pytest.mark.parametrize("dtype, shape", [
    (FORMAT, (37, 45, 288)),     # 2 stripes of A, 2 of B, 9 blocks: a second, partial chunk
    (MXFP8, (33, 70, 300)),      # K ends inside a block too; B's third stripe holds 6 rows
], ids=["mxfp4", "mxfp8"])
def test_preshuffled_scales_give_the_row_major_product_bit_for_bit(dtype, shape):
    """The interpreter runs the pre-shuffled path (takes_preshuffled) with 256-deep K steps;
    any layout of either operand gives the same bits as row-major scales do, rung and op."""
    assert takes_preshuffled("interpreter", "") and not takes_preshuffled("hip", "gfx942")
    plain = SPEC.make_inputs(shape, dtype, seed=7)
    with poisoned_outputs():
        expected = V0(*plain, out_dtype=torch.float32)
        a, sa, b, sb = _shuffled(plain)
        for inputs in ((a, sa, b, sb), (a, sa, b, plain[3]), (a, plain[1], b, sb)):
            assert torch.equal(V0(*inputs, out_dtype=torch.float32), expected)
        assert torch.equal(kernels.matmul_mxfp4(a, sa, b, sb, torch.float32), expected)
        if dtype == MXFP8:
            assert torch.equal(mx_matmul(a, sa, b.t(), sb, torch.float32), expected)
    reference = SPEC.reference(*plain)                                  # float64
    assert (expected.double() - reference).abs().max() <= 1e-5 * reference.abs().max()   # fp32 sums only
    ref = kernels.registry.reference_rung("gemm_mxfp4")
    assert torch.equal(ref(a, sa, b, sb, torch.float32), ref(*plain, torch.float32))


def test_a_scale_shape_of_neither_layout_is_refused_naming_both():
    a, _, b, sb = SPEC.make_inputs((40, 8, 64), FORMAT)
    wrong = torch.zeros(2, 128, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"a_scales has shape \(2, 128\).*needs \(40, 2\).*or \(2, 256\) pre-shuffled"):
        V0(a, wrong, b, sb)


def _loop_ops(report) -> Counter:
    return Counter(m for m in map(isa_parse.mnemonic, report.hot_loop.splitlines()) if m)


@pytest.mark.parametrize("dtype", [FORMAT, MXFP8], ids=["mxfp4", "mxfp8"])
def test_gfx950_reads_preshuffled_scales_without_byte_loads_or_8_bit_lds(dtype):
    """The launch gfx950 runs (pre-shuffled scales, 16x16x128 scaled MFMAs) against the same
    GEMM with row-major scales: the per-byte scale loads and 8-bit LDS reads are gone from
    the hot loop; each operand's scales come in one 2-byte load per lane, pass LDS in 16-bit
    writes and are read back as 32-bit words. No spills, no fewer waves, fewer LDS reads."""
    shuffled = isa.inspect("gemm_mxfp4", "v0", "gfx950", dtype=dtype)
    plain = isa.inspect("gemm_mxfp4", "v0", "gfx950", dtype=dtype, overrides={"PRESHUFFLED": False})
    ops, before = _loop_ops(shuffled), _loop_ops(plain)
    assert before["buffer_load_ubyte"] and before["ds_read_u8"], plain.summary()     # row-major's cost
    assert set(plain.matrix_instructions) == {"v_mfma_scale_f32_32x32x64_f8f6f4"}, plain.summary()
    assert set(shuffled.matrix_instructions) == {"v_mfma_scale_f32_16x16x128_f8f6f4"}, shuffled.summary()
    assert not [op for op in ops if op == "buffer_load_ubyte" or re.fullmatch(r"ds_\w+_[bui]8\w*", op)], ops
    assert ops["buffer_load_ushort"] == 2 and ops["ds_write_b16"] == 2, ops
    assert "ds_read_b32" in ops and {op for op in ops if op.startswith("ds_read")} <= {
        "ds_read_b128", "ds_read_b32", "ds_read2st64_b32"}, ops
    assert (shuffled.spills, shuffled.sgpr_spills, shuffled.scratch_bytes) == (0, 0, 0), shuffled.summary()
    assert shuffled.occupancy.value >= plain.occupancy.value
    def lds_reads(loop):
        return sum(n for op, n in loop.items() if op.startswith("ds_read"))
    assert lds_reads(ops) < lds_reads(before)


@pytest.mark.parametrize("m, k", [(45, 70), (130, 128), (257, 520), (64, 256), (0, 70), (40, 0)],
                         ids=["partial-stripe-block-and-chunk", "k128", "many-tiles", "whole", "no-rows", "no-k"])
@pytest.mark.parametrize("transpose", [True, False])
def test_the_mx_quantize_writes_the_bytes_preshuffle_makes_of_its_row_major_scales(m, k, transpose):
    """quantize(..., "mx32", preshuffled=True) writes both orientations' scales in the layout
    itself, bitwise preshuffle() of the row-major call's, padding zeros included, into poisoned
    outputs: M = 45 or 257 ends inside a stripe, K/32 = 3 or 17 inside a chunk (one tile along K,
    or five: the last tile's half chunk is zeroed by it), K = 128 is half a chunk, 64 x 256 whole
    stripes and chunks (x.T's two scales a row a partial one); no rows or no K give the empty
    layout's shapes. q and q_t are the same."""
    from kernels.gemm_fp8 import quantize
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m + k))
    plain = quantize(x, "mx32", MXFP8, transpose=transpose, scale_rule="round_up")
    with poisoned_outputs():
        shuffled = quantize(x, "mx32", MXFP8, transpose=transpose, scale_rule="round_up", preshuffled=True)
    for i, (got, row_major) in enumerate(zip(shuffled, plain, strict=True)):
        if i % 2:   # the scales: (rows, blocks) row-major, pre-shuffled by the cast
            assert got.dtype == torch.uint8 and got.is_contiguous()
            assert torch.equal(got, preshuffle(row_major)), (i, got.shape)
        else:
            assert torch.equal(got.view(torch.uint8), row_major.view(torch.uint8))


def test_an_mxfp8_linear_gives_the_bits_of_row_major_scales_preshuffled_before_each_gemm():
    """fp8_linear("mxfp8") forward and backward, whose quantize writes pre-shuffled scales on the
    interpreter, against the path it replaces: the same quantize writing row-major scales,
    preshuffle() of each just before mx_matmul. y, dx and dw bitwise, outputs poisoned;
    M = 45 and N = 37 end inside a stripe, K = 70 inside a block."""
    from kernels.fp8.linear import fp8_linear
    from kernels.gemm_fp8 import quantize

    gen = torch.Generator().manual_seed(3)
    x, w, dy = (torch.randn(*shape, generator=gen) for shape in ((45, 70), (37, 70), (45, 37)))
    def mx(t):
        return quantize(t, "mx32", MXFP8, transpose=True, scale_rule="round_up")
    with poisoned_outputs():
        (x8, sx, xt8, sxt), (w8, sw, wt8, swt), (dy8, sdy, dyt8, sdyt) = mx(x), mx(w), mx(dy)
        before = (mx_matmul(x8, preshuffle(sx), w8.t(), preshuffle(sw), torch.float32),
                  mx_matmul(dy8, preshuffle(sdy), wt8.t(), preshuffle(swt), torch.float32),
                  mx_matmul(dyt8, preshuffle(sdyt), xt8.t(), preshuffle(sxt), torch.float32))
        xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
        y = fp8_linear(xg, wg, "mxfp8")
        now = (y, *torch.autograd.grad(y, (xg, wg), dy))
    for name, got, want in zip(("y", "dx", "dw"), now, before, strict=True):
        assert torch.equal(got, want), name


def test_the_mxfp8_recipe_gives_the_bits_of_row_major_scales_on_targets_that_read_those(monkeypatch):
    """Where mx_matmul reads row-major scales (gfx942, Hopper: takes_preshuffled is false) the
    recipe quantizes them row-major and saves them so; its three GEMMs give the bits of the
    pre-shuffled path the interpreter takes, and what it saves has the shapes saved_like states."""
    from kernels.fp8.recipes import mxfp8
    gen = torch.Generator().manual_seed(3)
    x, w, dy = (torch.randn(*shape, generator=gen) for shape in ((45, 70), (37, 70), (45, 37)))
    recipe, results = mxfp8.MXFP8(), []
    with poisoned_outputs():
        for reads_shuffled in (True, False):
            monkeypatch.setattr(mxfp8, "takes_preshuffled", lambda *target: reads_shuffled)
            saved = recipe.forward(x, w, MXFP8, torch.float32)[1]
            like = recipe.saved_like(x, w, MXFP8)
            assert [t.shape for t in saved] == [t.shape for t in like]
            scale_shapes = [(70, 2), (70, 2)] if not reads_shuffled else [preshuffled_shape(70, 2)] * 2
            assert [saved.x_scale.shape, saved.w_scale.shape] == scale_shapes
            results.append(recipe.gemms(x, w, dy, MXFP8))
    for name in ("forward", "dgrad", "wgrad"):
        assert torch.equal(results[0][name], results[1][name]), name


@pytest.mark.parametrize("rows, blocks, ops", [(64, 16, {"clone": 1}),
                                               (45, 11, {"new_zeros": 1, "copy_": 1, "clone": 1})])
def test_whole_stripes_and_chunks_shuffle_in_one_device_op(rows, blocks, ops):
    """A GEMM operand of whole 32-row stripes and 8-scale chunks (a training shape: tokens and K
    multiples of 32 and 256) needs no zero fill: the permuting copy alone, one launch on a GPU."""
    from workbench.harness.device_ops import device_ops

    scales = torch.ones(rows, blocks, dtype=torch.uint8)
    seen = device_ops(lambda: preshuffle(scales))
    assert (seen.triton, dict(seen.torch_ops)) == (0, ops)
