"""``tensor``'s amax without a torch reduction: the amax pass leaves at most PARTIALS partial maxima
and the kernel that needs the amax reduces them itself (the cast, or the one launch of
tensor_amax / tensor_scale). Bitwise the torch pass (a max is exact), on ragged tiles, with the
amax in every tile in turn and grids of fewer partials than tiles (PARTIALS made small), into
poisoned outputs. The partials are poisoned with +inf, not the outputs' NaN (which the kernels' max
ignores), and followed by more +inf: a reduction that reads a partial the pass did not write, or
one past the pass's count, finds an inf amax, which no finite x has (the cast's test says which
miscounts were planted)."""
from __future__ import annotations

import pytest
import torch

from kernels import plans
from kernels.gemm_fp8 import quantize, quantize_kernel
from kernels.gemm_fp8.formats import scale_of
from kernels.gemm_fp8.quantize_kernel import tensor_amax, tensor_scale
from kernels.gemm_fp8.quantize_ref import quantize_reference
from kernels.outputs import new_output, poisoned_outputs
from workbench.harness.device_ops import device_ops
from quantize_checks import activations, assert_same

E4M3FN, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
SHAPES = [(1, 1), (1, 300), (300, 1), (130, 257), (300, 300)]   # 300 x 300: 3 x 3 tiles of 128, 44 past the 2nd


def _torch_amax(x: torch.Tensor) -> torch.Tensor:
    return x.abs().amax().float()


def _same_bits(got: torch.Tensor, want: torch.Tensor) -> bool:
    return got.dtype == torch.float32 and got.shape == () and bool(got.view(torch.int32) == want.view(torch.int32))


@pytest.fixture
def inf_partials(monkeypatch):
    """The amax pass's partials (what ``_AmaxPass`` allocates, nothing else) start as +inf and go
    on past their end with PARTIALS more +infs, in one buffer: a reduction reading a partial not
    written, or up to PARTIALS past the count, gets amax inf. +inf because the kernels' max keeps
    it where it skips NaN, and no finite x's amax is inf."""
    in_pass = []
    amax_pass = quantize_kernel._AmaxPass.__call__

    def call(self, *args, **kwargs):
        in_pass.append(self)
        try:
            return amax_pass(self, *args, **kwargs)
        finally:
            in_pass.pop()

    def allocate(shape, dtype, device):
        if not in_pass:
            return new_output(shape, dtype, device)
        assert len(shape) == 1 and dtype == torch.float32, (shape, dtype)   # the partials
        return torch.full((shape[0] + quantize_kernel.PARTIALS,), float("inf"), device=device)[:shape[0]]
    monkeypatch.setattr(quantize_kernel._AmaxPass, "__call__", call)
    monkeypatch.setattr(quantize_kernel, "new_output", allocate)


@pytest.fixture(params=[1, 4, quantize_kernel.PARTIALS], ids=lambda p: f"partials{p}")
def partials(request, monkeypatch):
    """PARTIALS as the amax pass and the cast take it; 300 x 300's 9 tiles are then scanned by
    1 program, by 4 (tiles p, p + 4, ...: 3, 2, 2 and 2 of them), or one each (9 of 1024 read
    back, the rest masked). The plans keep the count, so they are made anew."""
    monkeypatch.setattr(quantize_kernel, "PARTIALS", request.param)
    plans.invalidate()
    yield request.param
    plans.invalidate()


def _cases(shape, dtype):
    """x with its amax (a negative value) in each tile in turn, and the all-zero, the all-negative
    and the largest-finite x."""
    x = activations(shape, seed=shape[0] + shape[1], dtype=dtype)
    for r in range(0, shape[0], 128):
        for c in range(0, shape[1], 128):
            y = x.clone()
            y[min(r + 77, shape[0] - 1), min(c + 5, shape[1] - 1)] = -2e4
            yield y
    yield torch.zeros(shape, dtype=dtype)
    yield -x.abs() - 1
    yield torch.full(shape, -torch.finfo(dtype).max, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_tensor_amax_and_scale_are_the_torch_pass_bitwise(shape, dtype, partials, inf_partials):
    for x in _cases(shape, dtype):
        want = _torch_amax(x)
        with poisoned_outputs():
            amax, scale = tensor_amax(x), tensor_scale(x, E4M3FN)
        assert _same_bits(amax, want), (amax, want)
        assert _same_bits(scale, scale_of(want, E4M3FN)), (scale, want)


def test_an_inf_gives_the_amax_and_scale_torch_gives():
    """No program sees all of x, so nothing is checked: an inf is its amax and an inf scale, as
    torch's pass gives."""
    x = activations((130, 257), seed=3)
    x[129, 256] = -float("inf")
    with poisoned_outputs():
        amax, scale = tensor_amax(x), tensor_scale(x, E5M2)
    assert _same_bits(amax, _torch_amax(x)) and amax == float("inf")
    assert _same_bits(scale, scale_of(_torch_amax(x), E5M2))


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_the_amax_is_read_only_unless_the_device_says_not_to(shape, partials, inf_partials):
    """Delayed scaling's ``unless``: 0 (an empty history) reads x; > 0 reads nothing, so an x
    of 5s gives 0, which no read of it could (an x of NaN could: the pass's max ignores a NaN)."""
    x = activations(shape, seed=5)
    with poisoned_outputs():
        assert _same_bits(tensor_amax(x, torch.tensor(0.0)), _torch_amax(x))
        assert _same_bits(tensor_amax(torch.full_like(x, 5.0), torch.tensor(2.0)), torch.zeros(()))


@pytest.mark.parametrize("shape", [(1, 1), (300, 300)], ids=str)
def test_the_delayed_pass_reads_x_only_while_its_history_is_all_zero(shape, partials):
    """tensor_partials with delayed scaling's history as ``unless``: all 0 it reads x (the
    partials' max is the torch pass's amax), and a value > 0 in any one of its 16 entries, the
    last included, reads nothing (an x of 5s: every partial 0); one launch, no torch op."""
    from kernels.fp8.recipes.delayed import HISTORY
    from kernels.gemm_fp8.quantize_kernel import partial_count, tensor_partials
    x = activations(shape, seed=6)
    with poisoned_outputs():
        found = tensor_partials(x, torch.zeros(HISTORY))
    assert found.shape == (partial_count(*shape),) and _same_bits(found.max(), _torch_amax(x))
    _reads_nothing_once_an_entry_is_set(x, HISTORY)
    history = torch.zeros(HISTORY)
    history[-1] = 1e-30
    seen = device_ops(lambda: tensor_partials(x, history))
    assert (seen.triton, seen.total) == (1, 1), seen


@pytest.mark.parametrize("entries", [3, 5])
def test_an_unless_of_any_length_is_read_to_its_end_and_no_further(entries):
    """An ``unless`` whose length is not a power of two (the kernel loads the next power of two,
    masked): a value > 0 at any of its positions reads nothing, and all 0 reads x although the
    number after its end (the rest of the buffer it is a view of) is > 0."""
    from kernels.gemm_fp8.quantize_kernel import tensor_partials
    x = activations((40, 30), seed=7)
    beyond = torch.zeros(8)
    beyond[entries] = 1.0
    with poisoned_outputs():
        found = tensor_partials(x, beyond[:entries])
    assert _same_bits(found.max(), _torch_amax(x))
    _reads_nothing_once_an_entry_is_set(x, entries)


def _reads_nothing_once_an_entry_is_set(x: torch.Tensor, entries: int) -> None:
    """An x of 5s with an ``unless`` of ``entries`` zeros but one > 0, at each position in turn:
    every partial 0 (the pass read nothing)."""
    from kernels.gemm_fp8.quantize_kernel import tensor_partials
    fives = torch.full_like(x, 5.0)
    for at in range(entries):
        unless = torch.zeros(entries)
        unless[at] = 1e-30
        with poisoned_outputs():
            assert not tensor_partials(fives, unless).any(), at


def test_an_empty_x_has_amax_0_and_scale_1_without_a_launch():
    from kernels.gemm_fp8.quantize_kernel import tensor_partials
    history = torch.zeros(16)
    for x in (torch.ones(0, 5), torch.ones(5, 0)):
        assert device_ops(lambda: tensor_partials(x, history)).total == 0
        assert tensor_partials(x, history).shape == (0,)
        amax = device_ops(lambda: tensor_amax(x))
        scale = device_ops(lambda: tensor_scale(x, E4M3FN))
        assert amax.triton == scale.triton == 0
        assert tensor_amax(x) == 0 and tensor_scale(x, E4M3FN) == 1


@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_the_tensor_cast_reduces_the_partials_itself_bitwise(shape, transpose, partials, inf_partials):
    """Each program of the cast reads all the partials: q, q_t and the scale are the
    reference's, with the amax in any tile. The cast counts the partials from its grid, the amax
    pass from x's shape (quantize_kernel.partial_count): a host count above the cast's fails here
    (checked: the host's without its PARTIALS bound, the cast's of one grid axis: a partial with
    the amax is not read), and one below it (checked: the cast's one more: the partial past the
    pass's count is the fixture's +inf)."""
    for x in _cases(shape, torch.bfloat16):
        with poisoned_outputs():
            got = quantize(x, "tensor", E4M3FN, transpose=transpose)
        assert_same(got, quantize_reference(x, "tensor", E4M3FN, transpose=transpose))


@pytest.mark.parametrize("transpose", [False, True])
def test_per_tensor_scales_take_two_launches_and_no_torch_op(transpose):
    """quantize's ``tensor``: the amax pass and the cast; tensor_amax and tensor_scale: the amax
    pass and the launch that reduces its partials (the torch amax and scale_of's four ops
    before, each a launch on a GPU)."""
    x = torch.randn(300, 260)
    for call in (lambda: quantize(x, "tensor", E4M3FN, transpose=transpose),
                 lambda: tensor_amax(x), lambda: tensor_scale(x, E4M3FN),
                 lambda: tensor_amax(x, torch.tensor(1.0))):
        seen = device_ops(call)
        assert (seen.triton, seen.total) == (2, 2), seen


def test_the_partials_reduction_is_one_binary_for_every_count(monkeypatch):
    """The reducing launch does not specialize its count of partials (one per tile, up to
    PARTIALS: a shape's): x with 1, 16 and 17 tiles launch it with every argument of one class
    for gfx942, where a specialized count would be a constant or divisible by 16."""
    from launch_classes import GFX942, classes, jit_launch, recorded_launches
    tile = quantize_kernel.TILE
    with recorded_launches(monkeypatch, stub=True) as launches:
        for tiles_m in (1, 16, 17):
            tensor_amax(torch.ones(tiles_m * tile, 1))
    seen = [classes(jit_launch(fn, args, GFX942, monkeypatch)) for fn, args in launches
            if fn is quantize_kernel._tensor_amax_kernel]
    assert len(seen) == 3 and seen[0] == seen[1] == seen[2], seen


def test_a_nan_in_x_is_ignored_by_the_kernels_max():
    """The kernels' max (tl.maximum without NaN propagation: numpy's fmax in the interpreter) skips a
    NaN, where torch's amax returns NaN: the amax is the other elements'."""
    x = activations((300, 260), seed=8)
    finite = x.abs().amax()
    x[17, 33] = float("nan")
    assert _same_bits(tensor_amax(x), finite)
