"""The MXFP8 grouped GEMM's transposed operands on the grouped cast's MX launch
(:func:`kernels.moe.grouped_gemm_fp8.quantize_kernel.mx_launch`), bit for bit the plain PyTorch passes
it replaced: the forward's weight against :func:`kernels.moe.grouped_gemm_mxfp8.spec.quantize_weight`,
the wgrad operand against :func:`_wgrad_reference` (the padded copy and ``quantize_one``, kept
here as the definition). Fresh random inputs with outliers and a -0.0; empty groups, one-token
groups, groups over several 64-token tiles, T = 0, G = 1, C and K not multiples of 32; every
input dtype, e4m3fn and e5m2; strided and broadcast inputs; unchecked offsets (rows past the
last offset, or offsets past T); outputs poisoned. One training step runs the kernel three
times and no index_copy_ or new_zeros; no host sync; the custom op's fake.
"""
from __future__ import annotations

import pytest
import torch

from host_sync import no_host_sync
from e8m0_cases import adversarial_groups
from kernels.gemm_fp8.quantize_ref import dequantize, quantize_one
from kernels.microscaling import BLOCK
from kernels.moe.grouped_gemm import spec as grouped_spec
from kernels.moe.grouped_gemm_fp8 import grouped_gemm_fp8_train
from kernels.moe.grouped_gemm_fp8.quantize import group_of_rows
from kernels.moe.grouped_gemm_fp8 import quantize_kernel
from kernels.moe.grouped_gemm_mxfp8 import quantize
from kernels.moe.grouped_gemm_mxfp8.spec import quantize_weight
from kernels.outputs import poisoned_outputs
from kernels.triton_support import cdiv

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
FORMATS = [torch.float8_e4m3fn, torch.float8_e5m2]
RULES = ["ocp", "round_up"]   # the e8m0 scale rules


def _wgrad_reference(t: torch.Tensor, offsets: torch.Tensor, ends: torch.Tensor, fp8: torch.dtype,
                     rule: str = "ocp") -> tuple[torch.Tensor, torch.Tensor]:
    """The plain passes :func:`quantize.wgrad_operand` ran before its kernel: :func:`_padded_copy`,
    then ``quantize_one``'s ``mx32`` by the e8m0 rule ``rule``."""
    return quantize_one(_padded_copy(t, offsets, ends), "mx32", fp8, rule)


def _padded_copy(t: torch.Tensor, offsets: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """A zeroed (C, R) copy, each group's rows moved to its padded start by ``index_copy_``
    (rows past offsets[-1] as zeros)."""
    (rows, cols), groups = t.shape, offsets.shape[0]
    padded = t.new_zeros((cols, cdiv(rows + (BLOCK - 1) * groups, BLOCK) * BLOCK))
    if rows and groups:
        sizes = torch.diff(offsets, prepend=offsets.new_zeros(1)).clamp(min=0)
        shift = (offsets - sizes) - (ends - cdiv(sizes, BLOCK) * BLOCK)   # start minus padded start
        ids = group_of_rows(offsets, rows)
        row = torch.arange(rows, device=t.device)
        grouped = (row < offsets[-1])[:, None]
        padded.index_copy_(1, row - shift.long()[ids], torch.where(grouped, t, 0).t())
    return padded


def _tokens(rows: int, cols: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Random values with magnitudes spread per row and column (neighbouring blocks get other
    exponents), one outlier 1000 times the mean magnitude and a -0.0, in fp16's range."""
    gen = torch.Generator().manual_seed(seed)
    t = torch.randn(rows, cols, generator=gen) * torch.randn(rows, 1, generator=gen).exp()
    t = t * torch.randn(1, cols, generator=gen).exp()
    if t.numel() > 1:
        t.view(-1)[t.numel() // 3] = 1000 * t.abs().mean()
        t.view(-1)[t.numel() // 2] = -0.0
    return t.to(dtype)


def _offsets(sizes) -> torch.Tensor:
    return grouped_spec.offsets_from_sizes(torch.tensor(sizes, dtype=torch.int64))


def _assert_same(got: tuple[torch.Tensor, torch.Tensor], want: tuple[torch.Tensor, torch.Tensor]) -> None:
    (q, scales), (want_q, want_scales) = got, want
    assert q.dtype == want_q.dtype and q.shape == want_q.shape
    assert scales.dtype == torch.uint8 and scales.shape == want_scales.shape
    assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8))
    assert torch.equal(scales, want_scales)


def _assert_wgrad(t: torch.Tensor, offsets: torch.Tensor, fp8: torch.dtype = torch.float8_e4m3fn,
                  rule: str = "ocp") -> None:
    ends = quantize.padded_ends(offsets)
    with poisoned_outputs():
        got = quantize.wgrad_operand(t, offsets, ends, fp8, rule)
    assert got[0].is_contiguous() and got[1].is_contiguous()   # token-contiguous (C, R), (C, R/32)
    _assert_same(got, _wgrad_reference(t, offsets, ends, fp8, rule))


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("fp8", FORMATS, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_wgrad_operand_is_the_plain_passes_bit_for_bit(dtype, fp8, rule):
    """Groups of 0 (first and middle), 5, 1, 70 (over two 64-position tiles) and 33 tokens
    (a 32-token block and one of 1), C = 67 (a ragged feature tile); the outlier sets its
    block's exponent only. Either e8m0 rule."""
    sizes = [0, 5, 0, 1, 70, 33]
    _assert_wgrad(_tokens(sum(sizes), 67, dtype), _offsets(sizes), fp8, rule)


@pytest.mark.parametrize("fp8", FORMATS, ids=str)
def test_round_up_wgrad_operand_near_powers_of_two_and_the_clamp_saturates_nothing(fp8):
    """The dense tests' adversarial blocks (amax exactly fmax 2^k and the next float up, over
    e8m0's range; subnormal quotients; an all-zero block), each row a feature's 32 tokens,
    then 51 more tokens of them so blocks straddle groups: bit for bit the plain passes under
    both rules; under round-up every element over its block's scale is at most fmax (float64)."""
    t = adversarial_groups(fp8).t().contiguous()   # (32 tokens, C features)
    t = torch.cat([t, -t[:20], t[5:]])             # 71 tokens
    offsets = _offsets([20, 0, 51])
    ends = quantize.padded_ends(offsets)
    for rule in RULES:
        _assert_wgrad(t, offsets, fp8, rule)
    _, scales = quantize.wgrad_operand(t, offsets, ends, fp8, "round_up")
    padded = _padded_copy(t, offsets, ends)
    per_element = dequantize(torch.ones_like(padded), scales, "mx32", torch.float64)
    assert float((padded.double().abs() / per_element).max()) <= torch.finfo(fp8).max


@pytest.mark.parametrize("sizes, cols", [([0, 0], 5), ([40], 9), ([], 3), ([2, 4], 0), ([1], 1), ([32, 32, 64], 32)],
                         ids=["T=0", "G=1", "G=0", "C=0", "one token", "aligned"])
def test_wgrad_operand_edge_shapes(sizes, cols):
    _assert_wgrad(_tokens(sum(sizes), cols, torch.bfloat16, seed=1), _offsets(sizes))


def test_wgrad_operand_of_many_groups_in_one_tile():
    """Nine groups, several of them inside one 64-position tile (BLOCK_G 16), and a last group
    whose padded end leaves positions of its tile past every group."""
    sizes = [3, 31, 32, 0, 1, 64, 2, 95, 7]
    _assert_wgrad(_tokens(sum(sizes), 20, torch.float16, seed=2), _offsets(sizes), torch.float8_e5m2)


def test_strided_and_broadcast_tokens_read_as_their_values():
    """A transposed view (features contiguous no more) and a stride-0 one (a sum's gradient)."""
    offsets = _offsets([7, 0, 12])
    _assert_wgrad(_tokens(35, 19, torch.bfloat16).t(), offsets)
    _assert_wgrad(torch.tensor(-3.5).expand(19, 35), offsets)


def test_rows_past_the_last_offset_are_copied_nowhere():
    """Unchecked offsets ending before T: those rows (an outlier among them) reach neither the
    copy nor a scale; offsets past T: the last groups take the rows there are; no groups at
    all: nothing is copied."""
    t = _tokens(40, 9, torch.float32)
    t[38, 4] = 1e4
    offsets = torch.tensor([10, 20, 30], dtype=torch.int32)
    _assert_wgrad(t, offsets)
    q, scales = quantize.wgrad_operand(t, offsets, quantize.padded_ends(offsets), torch.float8_e4m3fn)
    assert not q[:, 74:].view(torch.uint8).any() and not scales[:, 3:].any()
    _assert_wgrad(t, torch.tensor([10, 35, 60], dtype=torch.int32))
    _assert_wgrad(t, torch.tensor([50, 60], dtype=torch.int32))
    _assert_wgrad(t, torch.zeros(0, dtype=torch.int32))   # no groups: every row past them, all zeros


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("fp8", FORMATS, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("k", [37, 21, 64, 1], ids=lambda k: f"K={k}")
def test_forward_weight_is_quantize_weight_bit_for_bit(dtype, fp8, k, rule):
    """Each expert's K-contiguous copy, blocks of 32 along K (partial where K is not a
    multiple of 32), N = 67; three experts, the outlier in one of them; either e8m0 rule."""
    w = _tokens(3 * k, 67, dtype, seed=k).reshape(3, k, 67)
    with poisoned_outputs():
        got = quantize.forward_weight(w, fp8, rule)
    assert got[0].transpose(1, 2).is_contiguous() and got[1].is_contiguous()   # K-contiguous
    _assert_same(got, quantize_weight(w, fp8, rule))


def test_forward_weight_of_one_expert_strided_and_empty():
    """G = 1; a K-contiguous w (strides along N of K); K = 0 and N = 0."""
    w = _tokens(45, 70, torch.bfloat16, seed=5).reshape(1, 45, 70)
    for case in (w, w.transpose(1, 2).contiguous().transpose(1, 2), w[:, :0], w[:, :, :0]):
        with poisoned_outputs():
            got = quantize.forward_weight(case, torch.float8_e4m3fn)
        assert got[0].transpose(1, 2).is_contiguous()   # whatever w's strides (not the reference's)
        _assert_same(got, quantize_weight(case, torch.float8_e4m3fn))


class _Counted:
    """Stands for the kernel: counts each launch and runs it."""

    def __init__(self, kernel):
        self.kernel, self.grids = kernel, []

    def run(self, *args, grid, **kwargs):
        self.grids.append(grid)
        return self.kernel.run(*args, grid=grid, **kwargs)


def _forbidden(*args, **kwargs):
    raise AssertionError("a plain PyTorch pass built an MXFP8 operand")


def _zeros_of_offsets_only(new_zeros):
    """``Tensor.new_zeros``, refused on a float tensor (the old padded copy was t.new_zeros):
    :func:`quantize.padded_ends` still prepends a zero to the int32 offsets."""
    def guarded(self, *args, **kwargs):
        if self.is_floating_point():
            _forbidden()
        return new_zeros(self, *args, **kwargs)
    return guarded


def test_one_training_step_runs_the_kernel_and_no_plain_pass(monkeypatch):
    """Forward: the weight's copy (a batch of G experts); backward: the wgrad copies of x
    and dy (one problem each). Neither index_copy_ nor a float new_zeros runs; no host read."""
    counted = _Counted(quantize_kernel._cast_transpose_kernel)
    monkeypatch.setattr(quantize_kernel, "_cast_transpose_kernel", counted)
    monkeypatch.setattr(torch.Tensor, "index_copy_", _forbidden)
    monkeypatch.setattr(torch.Tensor, "new_zeros", _zeros_of_offsets_only(torch.Tensor.new_zeros))
    sizes, k, n = [5, 0, 40], 8, 5
    gen = torch.Generator().manual_seed(6)
    x, w = torch.randn(45, k, generator=gen), torch.randn(3, k, n, generator=gen)
    x.requires_grad_(), w.requires_grad_()
    with no_host_sync():
        y = grouped_gemm_fp8_train(x, w, _offsets(sizes), "mxfp8", check_offsets=False)
        assert counted.grids == [(1, 1, 3)]
        y.backward(torch.randn(45, n, generator=gen))
    padded = cdiv(45 + 31 * 3, 32) * 32   # R: 160 positions, in three tiles of 64
    assert padded == 160 and counted.grids == [(1, 1, 3), (3, 1, 1), (3, 1, 1)]


def test_custom_op_fake_matches_the_kernel():
    t, offsets = _tokens(19, 6, torch.float32).reshape(1, 19, 6), _offsets([4, 0, 15])
    ends = quantize.padded_ends(offsets)
    for rule in RULES:
        torch.library.opcheck(torch.ops.kernels.grouped_quantize_mxfp8.default,
                              (t, offsets, ends, torch.float8_e4m3fn, 96, rule), test_utils=("test_faketensor",))
