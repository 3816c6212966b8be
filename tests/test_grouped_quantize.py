"""The FP8 grouped GEMM's operands on the fused quantize kernels, bit for bit what the plain
PyTorch passes gave: the wgrad operand on the grouped kernels
(:mod:`kernels.moe.grouped_gemm_fp8.quantize_kernel`) against
:mod:`~kernels.moe.grouped_gemm_fp8.quantize_ref`, per (group, feature), per tensor and with
a given (delayed) scale that saturates (empty groups, groups over several 256-token amax
chunks, tokens past the last offset, T not a multiple of 16, odd C, every input dtype and
FP8 format, outputs poisoned); the amax launch's grid, whatever the group count; the
forward's weight (their batched launch), the token operands and dgrad's weight (the dense
op, with a given scale too) against :func:`kernels.gemm_fp8.formats.quantize_fp8`
(``scale_of`` and ``cast``, the project's definition); which launches each scale skips;
no host sync; bad inputs refused by name; the custom op's fake.
"""
from __future__ import annotations

import pytest
import torch

from fp8_tokens import FORMATS, IDS, bits as _bits, offsets as _offsets, tokens as _tokens
from host_sync import no_host_sync
from kernels.gemm_fp8.formats import quantize_fp8
from kernels.moe.grouped_gemm_fp8 import quantize, quantize_kernel
from kernels.moe.grouped_gemm_fp8.quantize_ref import (forward_weight_per_tensor_reference,
                                                       wgrad_per_tensor_reference, wgrad_rowwise_reference)
from kernels.outputs import poisoned_outputs

MODES = ["rowwise", "tensorwise", "delayed"]


def _history_scale(t: torch.Tensor, fp8: torch.dtype) -> torch.Tensor | None:
    """A delayed scale from a history below this tensor's amax (a twentieth of it: its
    outlier and the largest others saturate); a float32 one-element tensor."""
    amax = t.float().abs().amax() if t.numel() else torch.tensor(1.0)
    return (amax / torch.finfo(fp8).max / 20).reshape(1)


@pytest.fixture
def per_tensor_launches_only(monkeypatch):
    """Fails any per-(group, feature) amax launch; once called, the per-tensor amax too."""
    monkeypatch.setattr(quantize_kernel, "_chunk_amax_kernel", None)
    monkeypatch.setattr(quantize_kernel, "_group_scale_kernel", None)

    def forbid_tensor_amax():
        monkeypatch.setattr(quantize_kernel, "tensor_scale", None)
    return forbid_tensor_amax


def _assert_reference(t: torch.Tensor, offsets: torch.Tensor, fp8: torch.dtype, mode: str = "rowwise") -> None:
    """wgrad_operand under ``mode`` bit for bit its reference (delayed: a saturating given scale)."""
    given = _history_scale(t, fp8) if mode == "delayed" else None
    with poisoned_outputs():
        q, scale = quantize.wgrad_operand(t, offsets, mode, fp8, given)
    if mode == "rowwise":
        want_q, want_scale = wgrad_rowwise_reference(t, offsets, fp8)
    else:
        want_q, want_scale = wgrad_per_tensor_reference(t, offsets, fp8, given)
    assert q.dtype == fp8 and q.shape == want_q.shape and q.stride() == want_q.stride()
    assert torch.equal(scale, want_scale)
    assert torch.equal(_bits(q), _bits(want_q))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype, fp8", FORMATS, ids=IDS)
def test_wgrad_operand_is_the_reference_bit_for_bit(dtype, fp8, mode):
    """Groups of 0 (first and middle), 1 and 70 tokens (a group spanning tile edges,
    T = 81 not a multiple of 16 or 64), 67 features (odd, two ragged feature tiles); per
    scale of each recipe: per (group, feature), per tensor, a given (delayed) one."""
    sizes = [0, 5, 0, 1, 70, 5]
    _assert_reference(_tokens(sum(sizes), 67, dtype), _offsets(sizes), fp8, mode)


@pytest.mark.parametrize("given", [False, True], ids=["tensorwise", "delayed"])
def test_per_tensor_operands_run_no_grouped_amax_and_a_given_scale_no_amax_at_all(given, per_tensor_launches_only):
    """tensorwise: one per-tensor amax (the dense op's launch), then the grouped cast;
    delayed: the cast alone. Outputs as the reference; under delayed more than the outlier saturates."""
    if given:
        per_tensor_launches_only()
    t, offsets, fp8 = _tokens(40, 9, torch.bfloat16), _offsets([30, 0, 10]), torch.float8_e4m3fn
    _assert_reference(t, offsets, fp8, "delayed" if given else "tensorwise")
    q, _ = quantize.wgrad_operand(t, offsets, "delayed" if given else "tensorwise", fp8,
                                  _history_scale(t, fp8) if given else None)
    assert ((q.float().abs() == 448).sum() > 1) == given   # tensorwise: the outlier alone at the max


@pytest.mark.parametrize("dtype, fp8", FORMATS, ids=IDS)
def test_the_cast_with_a_given_scale_returns_the_amax_the_torch_pass_gives(dtype, fp8):
    """Delayed scaling's record for the grouped operands (the forward's expert weights, a
    batch of one-group problems): the cast's tile maxima (one per tile of its grid, every one
    written: poisoned outputs), whose max is bitwise t.abs().amax() (ragged 64-token and 64-feature
    tiles, several batch entries, the outlier in the middle one; no tokens: none, so 0); the bytes
    are those without ``amax``."""
    from kernels.gemm_fp8.quantize import reduce_maxima
    w = _tokens(3 * 70, 67, dtype).reshape(3, 70, 67)
    scale = _history_scale(w, fp8)
    for t in (w, w[:, :0]):
        with poisoned_outputs():
            q, got_scale, maxima = quantize.forward_weight(t, "delayed", fp8, scale, amax=True)
        want = t.abs().amax().float() if t.numel() else torch.zeros(())
        assert maxima.shape == quantize_kernel.tile_maxima_shape(*t.shape, 1) == ((3, 2, 2) if t.numel() else (0,))
        assert not maxima.isnan().any()
        amax = reduce_maxima(maxima)
        assert amax.shape == () and amax.view(torch.int32) == want.view(torch.int32)
        plain_q, plain_scale = quantize.forward_weight(t, "delayed", fp8, scale)
        assert torch.equal(_bits(q), _bits(plain_q)) and torch.equal(got_scale, plain_scale)


def test_groups_over_several_amax_chunks():
    """Tokens split over programs of CHUNK (256) tokens: a group over chunks 0 and 1, two
    within chunk 1 (the second ending on its edge), an empty one between, one starting on a
    chunk edge and covering chunks 2 to 4 (3 whole), a 1-token group at the end; T = 1113."""
    chunk = quantize_kernel.CHUNK
    sizes = [0, chunk + 44, 3, 0, chunk - 47, 2 * chunk + 88, 1]
    assert sum(sizes[:5]) == 2 * chunk and sum(sizes) == 4 * chunk + 89
    _assert_reference(_tokens(sum(sizes), 5, torch.bfloat16, seed=3), _offsets(sizes), torch.float8_e4m3fnuz)


class _Grids:
    """Stands for a kernel: records each launch grid, launches nothing."""

    def __init__(self):
        self.grids = []

    def run(self, *args, grid, **kwargs):
        self.grids.append(grid)


def test_amax_programs_do_not_depend_on_the_group_count(monkeypatch):
    """The docstring's shape, T = 8192 bf16 tokens, C = 2048 (grids read, nothing run): 32
    chunks x 32 feature blocks = 1024 amax programs for 1, 8 or 128 groups (groups x C/64
    before: 256 for 8); the per-group scale launch has groups x C/64 programs."""
    kernels = {name: _Grids() for name in ("_chunk_amax_kernel", "_group_scale_kernel", "_cast_transpose_kernel")}
    for name, recorder in kernels.items():
        monkeypatch.setattr(quantize_kernel, name, recorder)
    t = torch.empty((1, 8192, 2048), dtype=torch.bfloat16)
    for groups in (1, 8, 128):
        quantize_kernel.launch(t, _offsets([8192 // groups] * groups), torch.float8_e4m3fnuz)
    assert kernels["_chunk_amax_kernel"].grids == [(32, 32, 1)] * 3
    assert kernels["_group_scale_kernel"].grids == [(1, 32, 1), (8, 32, 1), (128, 32, 1)]
    assert kernels["_cast_transpose_kernel"].grids == [(128, 32, 1)] * 3


def test_tokens_past_the_last_offset_count_to_the_last_group():
    """Unchecked offsets that end before T: those tokens join the last group's amax, as
    :func:`.quantize.group_of_rows` says (an outlier among them sets its scale)."""
    t = _tokens(40, 9, torch.float32)
    t[38, 4] = 1e4
    offsets = torch.tensor([10, 20, 30], dtype=torch.int32)
    _assert_reference(t, offsets, torch.float8_e4m3fn)
    _, scale = quantize.wgrad_operand(t, offsets, "rowwise", torch.float8_e4m3fn)
    assert scale[2, 4] == 1e4 / 448


def test_strided_and_broadcast_tokens_read_as_their_values():
    """A transposed view and a stride-0 one (what autograd hands a sum's gradient as)."""
    offsets = _offsets([7, 0, 12])
    _assert_reference(_tokens(9, 19, torch.bfloat16).t(), offsets, torch.float8_e4m3fn)
    _assert_reference(torch.tensor(-3.5).expand(19, 9), offsets, torch.float8_e4m3fn)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("rows, cols, sizes", [(0, 5, [0, 0]), (0, 3, []), (6, 0, [2, 4]), (3, 4, [3])],
                         ids=["T=0", "G=0", "C=0", "one group"])
def test_empty_shapes_and_one_group(rows, cols, sizes, mode):
    _assert_reference(_tokens(rows, cols, torch.bfloat16), _offsets(sizes), torch.float8_e4m3fn, mode)


@pytest.mark.parametrize("dtype, fp8", FORMATS[:3], ids=IDS[:3])
def test_forward_weight_is_each_experts_columnwise_quantization(dtype, fp8):
    """The batched launch: per expert, scales per column along K and the K-contiguous copy,
    bit for bit formats.quantize_fp8(w[g], "col"), the plain passes it replaced; K = 21,
    so each column's run is padded to 32 bytes and the view skips the padding."""
    w = _tokens(3 * 21, 67, dtype).reshape(3, 21, 67)
    with poisoned_outputs():
        q, scale = quantize.forward_weight(w, "rowwise", fp8)
    assert q.shape == (3, 21, 67) and q.stride() == (67 * 32, 1, 32) and scale.shape == (3, 67)
    for g in range(3):
        want, want_scale = quantize_fp8(w[g], fp8, "col")
        assert torch.equal(_bits(q[g]), _bits(want)) and torch.equal(scale[g], want_scale[0])


@pytest.mark.parametrize("given", [False, True], ids=["tensorwise", "delayed"])
@pytest.mark.parametrize("dtype, fp8", FORMATS, ids=IDS)
def test_per_tensor_forward_weight_is_the_reference_bit_for_bit(dtype, fp8, given):
    """The batched launch with one scale: each expert's K-contiguous copy (K = 21, each
    column's run padded to 32 bytes), bit for bit the plain cast and transposed copy."""
    w = _tokens(3 * 21, 67, dtype).reshape(3, 21, 67)
    scale = _history_scale(w, fp8) if given else None
    with poisoned_outputs():
        q, got_scale = quantize.forward_weight(w, "delayed" if given else "tensorwise", fp8, scale)
    want, want_scale = forward_weight_per_tensor_reference(w, fp8, scale)
    assert q.shape == (3, 21, 67) and q.stride() == (67 * 32, 1, 32)
    assert torch.equal(_bits(q), _bits(want)) and torch.equal(got_scale, want_scale)


def test_no_host_sync():
    sizes = [3, 0, 20]
    t, offsets = _tokens(sum(sizes), 11, torch.bfloat16), _offsets(sizes)
    with no_host_sync():
        quantize.wgrad_operand(t, offsets, "rowwise", torch.float8_e4m3fnuz)
        quantize.forward_weight(t.reshape(23, 11, 1), "rowwise", torch.float8_e4m3fnuz)
        for scale in (None, torch.tensor(0.5)):
            quantize.wgrad_operand(t, offsets, "tensorwise", torch.float8_e4m3fnuz, scale)
            quantize.forward_weight(t.reshape(23, 11, 1), "tensorwise", torch.float8_e4m3fnuz, scale)


@pytest.mark.parametrize("recipe", MODES)
@pytest.mark.parametrize("dtype, fp8", FORMATS, ids=IDS)
def test_token_operands_and_dgrad_weight_on_the_dense_op_match_scale_of_and_cast(recipe, dtype, fp8):
    """tokens() and dgrad_weight() call kernels.gemm_fp8.quantize ("row" or "tensor", with
    delayed's given scale); its rounding (the kernel's round to nearest even) gives exactly
    the bits of formats.cast."""
    granularity = "row" if recipe == "rowwise" else "tensor"
    x, w = _tokens(21, 37, dtype), _tokens(3 * 5, 19, dtype, seed=1).reshape(3, 5, 19)
    sx, sw = (_history_scale(x, fp8), _history_scale(w, fp8)) if recipe == "delayed" else (None, None)
    with poisoned_outputs():
        q, scale = quantize.tokens(x, recipe, fp8, sx)
        wt, swt = quantize.dgrad_weight(w, recipe, fp8, sw)
    want, want_scale = quantize_fp8(x, fp8, granularity, None if sx is None else sx.reshape(()))
    assert torch.equal(_bits(q), _bits(want)) and torch.equal(scale, want_scale.expand(21, 1).reshape(21))
    want, want_scale = quantize_fp8(w.reshape(15, 19), fp8, granularity, None if sw is None else sw.reshape(()))
    assert wt.shape == (3, 19, 5) and wt.transpose(1, 2).is_contiguous()
    assert torch.equal(_bits(wt.transpose(1, 2)).reshape(15, 19), _bits(want))
    assert torch.equal(swt, want_scale.expand(15, 1).reshape(3, 5))


@pytest.mark.parametrize("call, error, match", [
    (lambda t, o: quantize.quantize_groups(t, o.long(), torch.float8_e4m3fn), TypeError, "offsets"),
    (lambda t, o: quantize.quantize_groups(t.int(), o, torch.float8_e4m3fn), TypeError, "t has dtype int32"),
    (lambda t, o: quantize.quantize_groups(t, o, torch.bfloat16), TypeError, "fp8 must be one of"),
    (lambda t, o: quantize.quantize_groups(t[0], o, torch.float8_e4m3fn), ValueError, "t must be 2-D"),
    (lambda t, o: quantize.quantize_groups(t, o[:0], torch.float8_e4m3fn), ValueError, "no groups"),
    (lambda t, o: quantize.quantize_groups(t, o, torch.float8_e4m3fn, torch.ones(2)), ValueError, "one number"),
    (lambda t, o: quantize.quantize_groups(t, o, torch.float8_e4m3fn, torch.ones(1).double()), TypeError,
     "scale has dtype"),
])
def test_bad_inputs_are_refused_by_name(call, error, match):
    with pytest.raises(error, match=match):
        call(_tokens(4, 3, torch.float32), _offsets([1, 3]))


def test_custom_op_fake_matches_the_kernels():
    t, offsets = _tokens(2 * 19, 6, torch.float32).reshape(2, 19, 6), _offsets([4, 0, 15])
    for extra in ((), (None, True), (torch.tensor(0.5), True), (torch.tensor(0.5), True, True)):
        # per group; per tensor; given; given, with the cast's amax
        torch.library.opcheck(torch.ops.kernels.grouped_quantize_fp8.default, (t, offsets, torch.float8_e4m3fn, *extra),
                              test_utils=("test_faketensor",))
