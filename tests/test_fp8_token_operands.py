"""A token tensor's two FP8 operands made at once (``quantize.token_operands``) and what the
training op does with them.

The routed rows x (and each output gradient dy) are read by two GEMMs of an expert GEMM's
training step: the forward (dgrad for dy) scaled per token, and wgrad scaled per (group,
feature). Under rowwise one fused quantization makes both (the grouped kernels' ``rows``
mode: 4 launches, x read twice, where the two took 6 launches and 4 reads); under tensorwise
the two casts share the one scale. Checked here: both operands bit for bit the separate
quantizations (odd shapes, groups over several amax chunks, empty groups, strided and
broadcast inputs, every input dtype and FP8 format, outputs poisoned), the launch count, no
host sync, the custom op's fake, refusals; and the training op: under rowwise it saves x's FP8
wgrad operand, not x; given ``x_operands`` it gives the bits it gives without them; bad ones
are refused by name.
"""
from __future__ import annotations

import pytest
import torch

import fp8_tokens
from fp8_tokens import bits as _bits, offsets as _offsets, tokens as _tokens
from host_sync import no_host_sync
from kernels.moe.grouped_gemm_fp8 import grouped_gemm_fp8_train, quantize
from kernels.outputs import poisoned_outputs
from workbench.harness.device_ops import device_ops

FORMATS, IDS = fp8_tokens.FORMATS[:3], fp8_tokens.IDS[:3]
E4M3FN = torch.float8_e4m3fn


def _assert_both_operands(t: torch.Tensor, offsets: torch.Tensor, recipe: str, fp8: torch.dtype) -> None:
    with poisoned_outputs():
        t8, st, tt8, stt = quantize.token_operands(t, offsets, recipe, fp8)
    want_t8, want_st = quantize.tokens(t, recipe, fp8)
    one_scale = want_st[:1] if recipe == "tensorwise" and want_st.numel() else None   # the scale tokens() found
    want_tt8, want_stt = quantize.wgrad_operand(t, offsets, recipe, fp8, one_scale)
    for got, want in ((t8, want_t8), (tt8, want_tt8)):
        assert got.dtype == fp8 and got.shape == want.shape and got.stride() == want.stride()
        assert torch.equal(_bits(got), _bits(want))
    assert torch.equal(st, want_st) and torch.equal(stt, want_stt)


@pytest.mark.parametrize("recipe", quantize.SHARED_OPERANDS)
@pytest.mark.parametrize("dtype, fp8", FORMATS, ids=IDS)
@pytest.mark.parametrize("sizes, cols", [([0, 5, 0, 1, 70, 5], 67), ([300, 4, 250, 0], 130)],
                         ids=["odd", "over-chunks"])
def test_both_operands_are_the_separate_quantizations_bit_for_bit(recipe, dtype, fp8, sizes, cols):
    """Empty first and middle groups, one token, T = 81 or 554 (not a multiple of 16 or 64;
    groups of 300 and 250 tokens run over several 256-token amax chunks), 67 and 130 features
    (ragged feature tiles, three of them for 130: each token's scale is the max over its tiles)."""
    _assert_both_operands(_tokens(sum(sizes), cols, dtype), _offsets(sizes), recipe, fp8)


@pytest.mark.parametrize("recipe", quantize.SHARED_OPERANDS)
def test_strided_broadcast_and_empty_tokens(recipe):
    offsets = _offsets([7, 0, 12])
    _assert_both_operands(_tokens(9, 19, torch.bfloat16).t(), offsets, recipe, E4M3FN)
    _assert_both_operands(torch.tensor(-3.5).expand(19, 9), offsets, recipe, E4M3FN)
    # 11 tokens past the last group's end (capacity padding): the last group runs to T, so each of
    # them gets its row-wise scale from the amax launch like any other (rowwise's outputs are poisoned)
    _assert_both_operands(_tokens(30, 19, torch.bfloat16), offsets, recipe, E4M3FN)
    for rows, cols, sizes in ((0, 5, [0, 0]), (6, 0, [2, 4]), (3, 4, [3])):
        _assert_both_operands(_tokens(rows, cols, torch.bfloat16), _offsets(sizes), recipe, E4M3FN)


def test_rowwise_is_four_launches_and_no_torch_op_or_host_sync():
    """Chunk amaxes (with each token's max per feature tile), group scales, row scales, the cast
    writing both copies: 4 launches, where tokens() and wgrad_operand() take 3 each."""
    t, offsets = _tokens(40, 24, torch.bfloat16), _offsets([10, 0, 30])
    ops = device_ops(lambda: quantize.token_operands(t, offsets, "rowwise", E4M3FN))
    assert (ops.triton, dict(ops.torch_ops)) == (4, {})
    separate = device_ops(lambda: (quantize.tokens(t, "rowwise", E4M3FN),
                                   quantize.wgrad_operand(t, offsets, "rowwise", E4M3FN)))
    assert separate.triton == 6
    with no_host_sync():
        for recipe in quantize.SHARED_OPERANDS:
            quantize.token_operands(t, offsets, recipe, E4M3FN)


def test_refusals_and_the_custom_op_fake():
    t, offsets = _tokens(5, 3, torch.float32), _offsets([2, 3])
    for recipe in ("blockwise", "mxfp8"):
        with pytest.raises(ValueError, match="token_operands makes both operands at once"):
            quantize.token_operands(t, offsets, recipe, E4M3FN)
    with pytest.raises(ValueError, match="no groups"):
        quantize.token_operands(t, offsets[:0], "rowwise", E4M3FN)
    with pytest.raises(ValueError, match="pass scale"):
        quantize.token_operands(t, offsets, "rowwise", E4M3FN, amax=True)
    torch.library.opcheck(torch.ops.kernels.grouped_quantize_fp8.default,
                          (_tokens(2 * 19, 6, torch.float32).reshape(2, 19, 6), _offsets([4, 0, 15]), E4M3FN,
                           None, False, False, True), test_utils=("test_faketensor",))


def _step(x, w, offsets, dy, recipe, x_operands=None, scales=(None, None)):
    x, w = x.clone().requires_grad_(), w.clone().requires_grad_()
    out = grouped_gemm_fp8_train(x, w, offsets, recipe, E4M3FN, torch.float8_e5m2, *scales, x_operands=x_operands)
    out.backward(dy)
    return out.detach(), x.grad, w.grad


@pytest.mark.parametrize("recipe", quantize.SHARED_OPERANDS)
def test_the_op_given_x_operands_gives_the_same_bits_and_saves_the_wgrad_operand_not_x(recipe):
    """Given x's operands (what an MoE layer hands gate's and up's GEMMs) the op's output and both
    gradients are the bits it gives making its own; it saves x's FP8 wgrad operand and no tensor of
    x's dtype and shape. Under rowwise the op makes them itself when w's gradient is wanted (the
    fused quantization), so it saves no x either way. delayed: with history-like scales given (a
    tenth of x's and w's amaxes: they saturate)."""
    sizes = [5, 0, 17, 9]
    offsets = _offsets(sizes)
    x, w = _tokens(sum(sizes), 24, torch.bfloat16), _tokens(4 * 24, 16, torch.bfloat16, seed=1).reshape(4, 24, 16)
    dy = _tokens(sum(sizes), 16, torch.bfloat16, seed=2)
    scales = tuple((t.float().abs().amax() / 448 / 10).reshape(1) for t in (x, w)) if recipe == "delayed" else (
        None, None)
    made = quantize.token_operands(x, offsets, recipe, E4M3FN, scales[0])
    own, given = _step(x, w, offsets, dy, recipe, scales=scales), _step(x, w, offsets, dy, recipe, made, scales)
    assert all(torch.equal(a, b) for a, b in zip(own, given, strict=True))
    for operands in ((made, None) if recipe == "rowwise" else (made,)):
        saved = []
        xi = x.clone().requires_grad_()
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
            grouped_gemm_fp8_train(xi, w.clone().requires_grad_(), offsets, recipe, E4M3FN, None, *scales,
                                   x_operands=operands)
        assert not any(t.dtype == x.dtype and t.shape == x.shape for t in saved)
        assert any(t.dtype == E4M3FN and t.shape == (24, 32) for t in saved)   # K x T padded to 16


def test_bad_x_operands_are_refused_by_name():
    offsets = _offsets([3, 4])
    x, w = _tokens(7, 8, torch.bfloat16), _tokens(2 * 8, 4, torch.bfloat16).reshape(2, 8, 4)
    made = quantize.token_operands(x, offsets, "rowwise", E4M3FN)
    with pytest.raises(ValueError, match="x_operands are x quantized under"):
        grouped_gemm_fp8_train(x, w, offsets, "blockwise", E4M3FN, x_operands=made)
    with pytest.raises(TypeError, match="four tensors"):
        grouped_gemm_fp8_train(x, w, offsets, "rowwise", E4M3FN, x_operands=made[:2])
    with pytest.raises(ValueError, match="do not quantize this x"):
        grouped_gemm_fp8_train(x[:6], w, offsets, "rowwise", E4M3FN, x_operands=made, check_offsets=False)
    with pytest.raises(ValueError, match="do not quantize this x"):
        grouped_gemm_fp8_train(x, w, offsets, "rowwise", torch.float8_e4m3fnuz, x_operands=made)


@pytest.mark.parametrize("dtype, fp8", FORMATS[:2], ids=IDS[:2])
def test_weight_operands_are_forward_weight_and_dgrad_weight_bit_for_bit(dtype, fp8):
    """The experts' weights both ways from one fused quantization (each expert a problem of K
    tokens in one group, with the row-wise copy beside): the forward's K-contiguous copy with its
    per-(expert, column) scales and dgrad's N-contiguous one with per-(expert, row) scales, bits,
    shapes and strides; K = 21 (each column's run padded to 32 bytes), K = 300 (over two amax
    chunks), and empty experts, rows and columns."""
    for g, k, n in ((3, 21, 67), (2, 300, 5), (1, 1, 1), (0, 4, 4), (2, 0, 3), (2, 3, 0)):
        w = _tokens(g * k, n, dtype).reshape(g, k, n)
        with poisoned_outputs():
            w8, sw, wt8, swt = quantize.weight_operands(w, fp8)
        for got, want in zip((w8, sw, wt8, swt), (*quantize.forward_weight(w, "rowwise", fp8),
                                                  *quantize.dgrad_weight(w, "rowwise", fp8))):
            assert got.shape == want.shape and got.stride() == want.stride(), (g, k, n)
            assert torch.equal(_bits(got) if got.dtype == fp8 else got, _bits(want) if want.dtype == fp8 else want)


def test_a_rowwise_training_step_is_fifteen_launches_and_holds_w_s_dgrad_operand():
    """Forward: x's and w's fused quantizations (4 launches each) and the GEMM; backward: dy's fused
    quantization, dX and dW: 15 launches where quantizing each operand for each GEMM took 21. The
    forward keeps w's dgrad operand (FP8, (G, K, N) stored) for the backward; with no gradient
    wanted for x (dx not computed) it makes none."""
    offsets = _offsets([5, 0, 17, 9])
    x, w = _tokens(31, 24, torch.bfloat16), _tokens(4 * 24, 16, torch.bfloat16, seed=1).reshape(4, 24, 16)
    dy = _tokens(31, 16, torch.bfloat16, seed=2)

    def step():
        xi, wi = x.clone().requires_grad_(), w.clone().requires_grad_()
        grouped_gemm_fp8_train(xi, wi, offsets, "rowwise", E4M3FN).backward(dy)

    ops = device_ops(step)
    assert ops.triton == 15, ops
    # each of x, w and dy quantized both ways at once (4 launches) where separately it took 6: 21 before
    fused = device_ops(lambda: quantize.weight_operands(w, E4M3FN)).triton
    separate = device_ops(lambda: (quantize.forward_weight(w, "rowwise", E4M3FN),
                                   quantize.dgrad_weight(w, "rowwise", E4M3FN))).triton
    assert (fused, separate) == (4, 6) and ops.triton + 3 * (separate - fused) == 21
    for needs_dx in (True, False):
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
            grouped_gemm_fp8_train(x.clone().requires_grad_(needs_dx), w.clone().requires_grad_(), offsets,
                                   "rowwise", E4M3FN)
        assert any(t.dtype == E4M3FN and t.shape == (4, 16, 24) for t in saved) == needs_dx
