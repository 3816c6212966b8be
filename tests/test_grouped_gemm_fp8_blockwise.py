"""The FP8 grouped GEMM under DeepSeek-V3's blockwise recipe (1 x 128 tiles of x and dy,
128 x 128 blocks of each expert's w, scales applied per 128-block inside the reduction):
``grouped_gemm_fp8_train(..., "blockwise")``'s forward, dX and dW against the float64
product of the FP8 operands each GEMM was given (dequantized per element by the dense
GEMM's scale semantics, :func:`kernels.gemm_fp8.operands.scales_per_element`) and, loosely,
against the high-precision GEMM; the forward kernel and the dW kernel on their own with
random per-block scales (a scale read from the wrong block shows), groups that share a
128-token block, empty groups and NaN bytes in the padding; bad block scales; the custom
ops under opcheck (empty operands: ``test_grouped_gemm_fp8_backward.py``). Every K and N
is ragged (not a multiple of 128 or of the tile).
"""
from __future__ import annotations

import pytest
import torch

import kernels
from fp8_quantizations import AtenCalls
from grouped_fp8_training import close, problem, run
from host_sync import no_host_sync
from kernels.gemm_fp8.operands import scales_per_element
from kernels.moe.grouped_gemm import spec as grouped_spec
from kernels.moe.grouped_gemm_fp8 import dw as dw_module
from kernels.moe.grouped_gemm_fp8 import grouped_gemm_fp8_dw, grouped_gemm_fp8_train, quantize, ref, v0_one_launch
from kernels.outputs import poisoned_outputs

E4M3FN, E4M3FNUZ = torch.float8_e4m3fn, torch.float8_e4m3fnuz
SIZES = [3, 0, 130, 2]   # an empty group; group 2 runs from token 3 across the 128-token boundary
K, N = 131, 129          # two 128-blocks each, the second ragged


def _deq(a, b, sa, sb):
    """float64 a (M, K) and b (K, N), each element times its scale (dense GEMM semantics)."""
    sa, sb = scales_per_element(a, b, sa, sb)
    return a.double() * sa.double(), b.double() * sb.double()


def _grouped(x8, sx, w8, sw, offsets):
    """float64 per-group product of block-scaled operands: sx (T, K/128), sw (G, K/128, N/128)."""
    out = torch.zeros(x8.shape[0], w8.shape[2], dtype=torch.float64)
    for g, (s, e) in enumerate(grouped_spec.group_bounds(offsets)):
        a, b = _deq(x8[s:e], w8[g], sx[s:e], sw[g])
        out[s:e] = a @ b
    return out


def _dw(xt8, sxt, dyt8, sdyt, offsets):
    """float64 dw of wgrad operands with one scale per 128 tokens (from token 0) and feature."""
    xd, dyd = _deq(xt8, dyt8.t(), sxt.t(), sdyt)    # (K, R), (R, N)
    return torch.stack([xd[:, s:e] @ dyd[s:e] for s, e in grouped_spec.group_bounds(offsets)])


def _expected(x, w, dy, offsets, fp8):
    """float64 forward, dx and dw of the operands each GEMM gets from :mod:`.quantize`."""
    y = _grouped(*quantize.tokens(x, "blockwise", fp8), *quantize.forward_weight(w, "blockwise", fp8), offsets)
    dx = _grouped(*quantize.tokens(dy, "blockwise", fp8), *quantize.dgrad_weight(w, "blockwise", fp8), offsets)
    (xt8, sxt), (dyt8, sdyt) = (quantize.wgrad_operand(t, offsets, "blockwise", fp8) for t in (x, dy))
    return y, dx, _dw(xt8, sxt, dyt8, sdyt, offsets)


@pytest.mark.parametrize("fp8,dtype,rtol", [
    pytest.param(E4M3FN, torch.float32, 1e-5, marks=pytest.mark.slow),   # about 20 s on 2 busy cores
    (E4M3FNUZ, torch.bfloat16, 1e-2)], ids=["e4m3fn-fp32", "e4m3fnuz-bf16"])
def test_forward_and_both_gradients_match_the_dequantized_product(fp8, dtype, rtol):
    x, w, dy, offsets = problem(SIZES, K, N, dtype=dtype, seed=4)
    y, dx, dw = run(x, w, dy, offsets, "blockwise", fp8)
    for got, want in zip((y, dx, dw), _expected(x, w, dy, offsets, fp8)):
        assert got.dtype == dtype and got.shape == want.shape
        close(got, want, rtol)                  # fp32 accumulation (bf16: one rounding of it)
    assert torch.equal(dw[1], torch.zeros(K, N, dtype=dtype))   # the empty group's expert
    # against the high-precision GEMM: only quantization error (e4m3: 2^-4 relative per
    # element), so scales read from the wrong block or group would show here
    x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
    y64 = grouped_spec.reference(x64, w64, offsets)
    y64.backward(dy.double())
    for got, want in ((y, y64), (dx, x64.grad), (dw, w64.grad)):
        close(got, want.detach(), 0.15)


def _block_scales(gen, *shape):
    """Positive scales two binades apart at random, so a scale taken from the wrong block is
    off by a factor of up to 16."""
    return torch.randint(-2, 3, shape, generator=gen).float().exp2()


@pytest.mark.parametrize("fp8", [E4M3FN, E4M3FNUZ], ids=str)
def test_forward_kernel_scales_each_k_block_of_rows_and_weight_blocks(fp8):
    """Three K blocks and two column blocks per expert; sw passed as a strided view (dX's)."""
    sizes, k, n = [7, 0, 30, 3], 260, 136
    gen = torch.Generator().manual_seed(5)
    t, g, kb, nb = sum(sizes), len(sizes), 3, 2
    offsets = grouped_spec.offsets_from_sizes(torch.tensor(sizes))
    x = (torch.randn(t, k, generator=gen) * 20).to(fp8)
    w = (torch.randn(g, k, n, generator=gen) * 20).to(fp8)
    sx, sw = _block_scales(gen, t, kb), _block_scales(gen, g, nb, kb).transpose(1, 2)
    with poisoned_outputs():
        for fn in (v0_one_launch.grouped_gemm_fp8_v0, kernels.grouped_gemm_fp8):
            close(fn(x, sx, w, sw, offsets, torch.float32), _grouped(x, sx, w, sw, offsets), 1e-6)


def test_dw_kernel_masks_groups_that_share_a_token_block_and_never_reads_the_padding():
    """Groups that start mid-block (7, 157), one that spans a block boundary, a one-token and
    an empty group, and tokens padded with e4m3fn NaN bytes past T."""
    sizes, k, n = [7, 150, 0, 1, 40], 19, 133
    gen = torch.Generator().manual_seed(3)
    t = sum(sizes)
    r = t + 13
    offsets = grouped_spec.offsets_from_sizes(torch.tensor(sizes))
    xt = torch.full((k, r), 0x7F, dtype=torch.uint8).view(E4M3FN)     # 0x7F: NaN
    dyt = torch.full((n, r), 0x7F, dtype=torch.uint8).view(E4M3FN)
    xt[:, :t] = (torch.randn(k, t, generator=gen) * 50).to(E4M3FN)
    dyt[:, :t] = (torch.randn(n, t, generator=gen) * 50).to(E4M3FN)
    sx, sdy = _block_scales(gen, 2, k), _block_scales(gen, 2, n)      # ceil(211 / 128) blocks
    with poisoned_outputs():
        dw = grouped_gemm_fp8_dw(xt, sx, dyt, sdy, offsets, scale_block=128)
    clean = lambda q: torch.where(q.float().isnan(), 0.0, q.float()).to(E4M3FN)   # noqa: E731
    close(dw, _dw(clean(xt), sx, clean(dyt), sdy, offsets), 1e-6)
    assert torch.equal(dw[2], torch.zeros(k, n))


def test_bad_block_scales_are_refused_by_name():
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(9, 130, generator=gen).to(E4M3FN), torch.randn(2, 130, 40, generator=gen).to(E4M3FN)
    offsets = torch.tensor([4, 9], dtype=torch.int32)
    sx, sw = torch.ones(9, 2), torch.ones(2, 2, 1)
    with pytest.raises(ValueError, match=r"sw has shape \(2, 40\); expected \(2, 2, 1\)"):
        kernels.grouped_gemm_fp8(x, sx, w, torch.ones(2, 40), offsets)   # block x, row-wise w
    with pytest.raises(ValueError, match=r"sx has shape \(9, 1\); expected \(9, 2\)"):
        kernels.grouped_gemm_fp8(x, torch.ones(9, 1), w, sw, offsets)
    with pytest.raises(NotImplementedError, match="row-wise scales only"):
        ref.grouped_gemm_fp8_ref(x, sx, w, sw, offsets)
    xt, dyt = torch.zeros(4, 144, dtype=E4M3FN), torch.zeros(3, 144, dtype=E4M3FN)
    with pytest.raises(ValueError, match="scale_block must be 0"):
        grouped_gemm_fp8_dw(xt, torch.ones(2, 4), dyt, torch.ones(2, 3), offsets, scale_block=64)
    with pytest.raises(ValueError, match=r"sdy has shape \(1, 3\); expected \(2, 3\), one per 128 tokens"):
        grouped_gemm_fp8_dw(xt, torch.ones(2, 4), dyt, torch.ones(1, 3), offsets, scale_block=128)


def test_one_backward_is_two_grouped_launches_and_the_ops_check_out(monkeypatch):
    """As the row-wise recipe: forward one launch, backward two (dX, dW), no host read; the
    dW op with block scales and the training op under opcheck."""
    launches = []
    forward, dw = v0_one_launch.grouped_mm_fp8, dw_module.grouped_dw_fp8
    monkeypatch.setattr(v0_one_launch, "grouped_mm_fp8", lambda *a: launches.append("mm") or forward(*a))
    monkeypatch.setattr(dw_module, "grouped_dw_fp8", lambda *a: launches.append("dw") or dw(*a))
    x, w, dy, offsets = problem([3, 0, 6], k=8, n=5)
    x.requires_grad_(), w.requires_grad_()
    with no_host_sync():
        grouped_gemm_fp8_train(x, w, offsets, "blockwise", E4M3FN, check_offsets=False).backward(dy)
    assert launches == ["mm", "mm", "dw"]
    (xt, sxt), (dyt, sdyt) = (quantize.wgrad_operand(t.detach(), offsets, "blockwise", E4M3FN) for t in (x, dy))
    torch.library.opcheck(torch.ops.kernels.grouped_gemm_fp8_dw.default,
                          (xt, sxt, dyt, sdyt, offsets, torch.float32, 128),
                          test_utils=("test_faketensor", "test_aot_dispatch_dynamic"))
    torch.library.opcheck(torch.ops.kernels.grouped_gemm_fp8_train.default,
                          (x, w, offsets, "blockwise", E4M3FN, torch.float8_e5m2, None, None, [], []),
                          test_utils=("test_autograd_registration", "test_faketensor"))


@pytest.mark.parametrize("k,tokens,pads", [(256, 32, 0), (131, 32, 2), (256, 37, 1)],
                         ids=["aligned", "ragged-k", "ragged-tokens"])
def test_operands_are_padded_only_where_a_size_is_ragged(k, tokens, pads):
    """Each expert's weight is cut into blocks of 128 rows of K and a wgrad operand into 16s of
    tokens: where the sizes are multiples already the operands are read in place, with no pad
    (``F.pad`` copies even with nothing to add); a ragged K pads the forward's and dgrad's
    weight, a ragged token count the wgrad operand. The bits are those of the padded copies."""
    gen = torch.Generator().manual_seed(7)
    w = torch.randn(2, k, 64, generator=gen).to(torch.bfloat16)
    x = torch.randn(tokens, k, generator=gen).to(torch.bfloat16)
    offsets = torch.tensor([tokens // 2, tokens], dtype=torch.int32)
    with AtenCalls() as seen:
        got = (quantize.forward_weight(w, "blockwise", E4M3FNUZ), quantize.dgrad_weight(w, "blockwise", E4M3FNUZ),
               quantize.wgrad_operand(x, offsets, "blockwise", E4M3FNUZ))
    assert [name for name, _ in seen.calls].count("constant_pad_nd") == pads
    kp, rp = -(-k // 128) * 128, -(-tokens // 16) * 16
    padded_w = torch.nn.functional.pad(w, (0, 0, 0, kp - k)).reshape(2 * kp, 64)
    qw, sw = kernels.gemm_fp8.quantize(padded_w.t(), "block128x128", E4M3FNUZ)
    assert torch.equal(got[0][0].view(torch.uint8), qw.view(64, 2, kp).permute(1, 2, 0)[:, :k].view(torch.uint8))
    assert torch.equal(got[0][1], sw.view(sw.shape[0], 2, kp // 128).permute(1, 2, 0))
    padded_x = torch.nn.functional.pad(x, (0, 0, 0, rp - tokens))
    qx, sx = kernels.gemm_fp8.quantize(padded_x.t(), "block1x128", E4M3FNUZ)
    assert torch.equal(got[2][0].view(torch.uint8), qx.view(torch.uint8)) and torch.equal(got[2][1], sx.t())
