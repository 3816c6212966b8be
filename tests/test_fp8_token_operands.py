"""A token tensor's two FP8 operands made at once (``quantize.token_operands``) and what the
training op does with them.

The routed rows x (and each output gradient dy) are read by two GEMMs of an expert GEMM's
training step: the forward (dgrad for dy) scaled per token, and wgrad scaled per (group,
feature). Under rowwise one fused quantization makes both (the grouped kernels' ``rows``
mode: 4 launches, x read twice, where the two took 6 launches and 4 reads); under the per-tensor
recipes one cast with the one scale writes both layouts (x read once after its amax pass, where
two casts read it twice). The experts' weights likewise (``quantize.weight_operands``). Checked
here: both operands bit for bit the separate quantizations (odd shapes, groups over several amax
chunks, empty groups, strided and broadcast inputs, every input dtype and FP8 format, given scales
that saturate, outputs poisoned), the tile maxima of a cast with a given scale, the launch counts,
no host sync, the custom op's fake, refusals; and the training op: it saves x's FP8 wgrad operand,
not x, and holds w's dgrad operand; given ``x_operands`` it gives the bits it gives without them;
bad ones are refused by name.
"""
from __future__ import annotations

import pytest
import torch

import fp8_tokens
from fp8_tokens import bits as _bits, offsets as _offsets, tokens as _tokens
from host_sync import no_host_sync
from kernels.fp8.recipes.delayed import HISTORY
from kernels.moe.grouped_gemm_fp8 import grouped_gemm_fp8_train, quantize
from kernels.outputs import poisoned_outputs
from workbench.harness.device_ops import device_ops, stubbed_launches

FORMATS, IDS = fp8_tokens.FORMATS[:3], fp8_tokens.IDS[:3]
E4M3FN = torch.float8_e4m3fn


def _assert_both_operands(t: torch.Tensor, offsets: torch.Tensor, recipe: str, fp8: torch.dtype) -> None:
    """Bit for bit the separate quantizations; under delayed also with a given scale (a tenth of
    t's amax's: values saturate), whose cast returns tile maxima with t's amax as their max."""
    with poisoned_outputs():
        t8, st, tt8, stt = quantize.token_operands(t, offsets, recipe, fp8)
    want_t8, want_st = quantize.tokens(t, recipe, fp8)
    one_scale = want_st[:1] if recipe in quantize.PER_TENSOR and want_st.numel() else None   # tokens() found it
    want_tt8, want_stt = quantize.wgrad_operand(t, offsets, recipe, fp8, one_scale)
    _assert_bits((t8, st, tt8, stt), (want_t8, want_st, want_tt8, want_stt), fp8)
    if recipe == "delayed":
        amax = float(t.float().abs().amax()) if t.numel() else 0.0
        scale = torch.tensor([max(amax / torch.finfo(fp8).max / 10, 1e-6)])
        with poisoned_outputs():
            *got, maxima = quantize.token_operands(t, offsets, recipe, fp8, scale, amax=True)
        want = (*quantize.tokens(t, recipe, fp8, scale), *quantize.wgrad_operand(t, offsets, recipe, fp8, scale))
        _assert_bits(got, want, fp8)
        assert (float(maxima.max()) if maxima.numel() else 0.0) == amax


def _assert_bits(got, want, fp8: torch.dtype) -> None:
    """FP8 tensors equal as bytes with their shapes and strides, scales as values."""
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        if g.dtype == fp8:
            assert g.stride() == w.stride() and torch.equal(_bits(g), _bits(w))
        else:
            assert torch.equal(g, w)


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


def _launches(call, t: torch.Tensor) -> tuple[int, int]:
    """(Triton launches, those given t's memory: each reads t) of ``call``."""
    with stubbed_launches(storages=True) as seen:
        call()
    return seen.count, seen.taking(t)


@pytest.mark.parametrize("recipe, scale, fused, apart", [("rowwise", None, (4, 2), (6, 4)),
                                                         ("tensorwise", None, (3, 2), (3, 3)),
                                                         ("delayed", 0.01, (1, 1), (2, 2))])
def test_launches_reads_and_no_host_sync(recipe, scale, fused, apart):
    """(launches, reads of t). rowwise: chunk amaxes (with each token's max per feature tile), group
    scales, row scales, the cast writing both copies: 4 launches reading t twice, where tokens() and
    wgrad_operand() take 3 each, each reading it twice. tensorwise: the dense op's amax pass and
    scale launch, then the one cast writing both layouts: 3 launches, t read twice, where tokens()
    (amax pass, cast: 2) and wgrad_operand() with the scale it found (1) read it three times. delayed
    (a given scale): the cast alone, one read where two casts read t twice."""
    t, offsets = _tokens(40, 24, torch.bfloat16), _offsets([10, 0, 30])
    scale = None if scale is None else torch.tensor([scale])

    def separately():
        _, st = quantize.tokens(t, recipe, E4M3FN, scale)
        quantize.wgrad_operand(t, offsets, recipe, E4M3FN, st[:1] if recipe in quantize.PER_TENSOR else None)
    assert _launches(lambda: quantize.token_operands(t, offsets, recipe, E4M3FN, scale), t) == fused
    assert not device_ops(lambda: quantize.token_operands(t, offsets, recipe, E4M3FN, scale)).torch_ops
    assert _launches(separately, t) == apart
    with no_host_sync():
        quantize.token_operands(t, offsets, recipe, E4M3FN, scale)


def test_refusals_and_the_custom_op_fake():
    t, offsets = _tokens(5, 3, torch.float32), _offsets([2, 3])
    for recipe in ("blockwise", "mxfp8"):
        with pytest.raises(ValueError, match="token_operands makes both operands at once"):
            quantize.token_operands(t, offsets, recipe, E4M3FN)
    with pytest.raises(ValueError, match="no groups"):
        quantize.token_operands(t, offsets[:0], "rowwise", E4M3FN)
    with pytest.raises(ValueError, match="pass scale"):
        quantize.token_operands(t, offsets, "rowwise", E4M3FN, amax=True)
    t = _tokens(2 * 19, 6, torch.float32).reshape(2, 19, 6)
    # rows per group; with one scale found (tensorwise's); with a given one and its tile maxima (delayed's)
    for scale, per_tensor, amax in ((None, False, False), (None, True, False), (torch.tensor(0.5), True, True)):
        torch.library.opcheck(torch.ops.kernels.grouped_quantize_fp8.default,
                              (t, _offsets([4, 0, 15]), E4M3FN, scale, per_tensor, amax, True),
                              test_utils=("test_faketensor",))


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


@pytest.mark.parametrize("recipe", quantize.SHARED_WEIGHTS)
@pytest.mark.parametrize("dtype, fp8", FORMATS[:2], ids=IDS[:2])
def test_weight_operands_are_forward_weight_and_dgrad_weight_bit_for_bit(recipe, dtype, fp8):
    """The experts' weights both ways from one fused quantization (each expert a problem of K
    tokens in one group, with the row-wise copy beside): the forward's K-contiguous copy with its
    per-(expert, column) scales, or the one scale, and dgrad's N-contiguous one with per-(expert,
    row) scales, or the one scale, bits, shapes and strides; K = 21 (each column's run padded to 32
    bytes), K = 300 (over two amax chunks), and empty experts, rows and columns. tensorwise finds
    its scale (dgrad's cast given the one the forward's found); delayed is given a tenth of w's
    amax's (values saturate) and returns the cast's tile maxima, whose max is w's amax."""
    for g, k, n in ((3, 21, 67), (2, 300, 5), (1, 1, 1), (0, 4, 4), (2, 0, 3), (2, 3, 0)):
        w = _tokens(g * k, n, dtype).reshape(g, k, n)
        amax = float(w.float().abs().amax()) if w.numel() else 0.0
        scale = torch.tensor([max(amax / torch.finfo(fp8).max / 10, 1e-6)]) if recipe == "delayed" else None
        with poisoned_outputs():
            w8, sw, wt8, swt, *maxima = quantize.weight_operands(w, recipe, fp8, scale, amax=scale is not None)
        want_w8, want_sw, *want_maxima = quantize.forward_weight(w, recipe, fp8, scale, scale is not None)
        one = want_sw.reshape(-1)[:1] if recipe == "tensorwise" and want_sw.numel() else scale
        _assert_bits((w8, sw, wt8, swt), (want_w8, want_sw, *quantize.dgrad_weight(w, recipe, fp8, one)), fp8)
        assert len(maxima) == len(want_maxima) == (recipe == "delayed")
        for m in maxima:
            assert (float(m.max()) if m.numel() else 0.0) == amax, (g, k, n)


@pytest.mark.parametrize("recipe, fused, apart", [("rowwise", (15, 2, 2, 2), (21, 4, 4, 4)),
                                                  ("tensorwise", (12, 2, 2, 2), (13, 3, 3, 3)),
                                                  ("delayed", (9, 1, 1, 2), (12, 2, 2, 3))])
def test_a_training_step_makes_each_operand_pair_at_once_and_holds_w_s_dgrad_operand(recipe, fused, apart):
    """(launches, reads of x, of w, of dy) of one step of the op. Forward: x's and w's fused
    quantizations and the GEMM; backward: dy's fused quantization, dX and dW (delayed, as Float8MoE
    calls it with dy's history: and the history's scale, 2 launches, the first given dy for the amax
    it reads while the history is empty, and the record of dy's amax, 1). ``apart``: the step with
    each of x, w and dy cast apart for its two GEMMs, the step's counts plus what the two casts take
    beyond the fused one (measured here): rowwise 21 launches and 4 reads of each, tensorwise 13 and
    3, delayed 12 and 2 (dy 3). The forward keeps w's dgrad operand (FP8, (G, K, N) stored) for the
    backward; with no gradient wanted for x (dx not computed) it makes none."""
    offsets = _offsets([5, 0, 17, 9])
    x, w = _tokens(31, 24, torch.bfloat16), _tokens(4 * 24, 16, torch.bfloat16, seed=1).reshape(4, 24, 16)
    dy = _tokens(31, 16, torch.bfloat16, seed=2)
    scale = torch.tensor([0.01]) if recipe == "delayed" else None
    delayed = dict(amax=True, history_dy=torch.zeros(HISTORY), counts=torch.zeros(6, dtype=torch.int64)) if (
        recipe == "delayed") else {}

    def step(xi, wi):
        out = grouped_gemm_fp8_train(xi, wi, offsets, recipe, E4M3FN, None, scale, scale, **delayed)
        (out[0] if delayed else out).backward(dy)

    xi, wi = x.clone().requires_grad_(), w.clone().requires_grad_()
    assert not device_ops(lambda: step(x.clone().requires_grad_(), w.clone().requires_grad_())).torch_ops.keys() - {
        "clone", "full", "zeros"}
    with stubbed_launches(storages=True) as seen:
        step(xi, wi)
    assert (seen.count, seen.taking(xi), seen.taking(wi), seen.taking(dy)) == fused

    def second(first_scale):   # the scale a per-tensor second cast takes: the one the first found, or given
        return first_scale.reshape(-1)[:1] if recipe == "tensorwise" else scale

    def tokens_apart(t):
        return lambda: quantize.wgrad_operand(t, offsets, recipe, E4M3FN,
                                              second(quantize.tokens(t, recipe, E4M3FN, scale)[1]))

    pairs = [(x, tokens_apart(x), lambda: quantize.token_operands(x, offsets, recipe, E4M3FN, scale)),
             (w, lambda: quantize.dgrad_weight(w, recipe, E4M3FN, second(quantize.forward_weight(
                 w, recipe, E4M3FN, scale)[1])), lambda: quantize.weight_operands(w, recipe, E4M3FN, scale)),
             (dy, tokens_apart(dy), lambda: quantize.token_operands(dy, offsets, recipe, E4M3FN, scale))]
    saved = [tuple(a - b for a, b in zip(_launches(two, t), _launches(one, t))) for t, two, one in pairs]
    assert all(launches >= 0 and reads > 0 for launches, reads in saved), saved
    assert (fused[0] + sum(launches for launches, _ in saved),
            *(reads + more for reads, (_, more) in zip(fused[1:], saved))) == apart
    for needs_dx in (True, False):
        kept = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t) or t, lambda t: t):
            step(x.clone().requires_grad_(needs_dx), w.clone().requires_grad_())
        assert any(t.dtype == E4M3FN and t.shape == (4, 16, 24) for t in kept) == needs_dx
