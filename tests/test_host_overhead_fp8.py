"""What a Float8Linear costs a GPU's host per call, counted (not timed, so it holds on any CPU under
any load): the device ops of its forward and of its backward per recipe
(:mod:`workbench.harness.device_ops`), and the eager path that skips the custom op's dispatch giving
the custom op's results bit for bit. The Python calls per call are bounded with the other public
ops' in tests/test_host_overhead.py (the benchmark's Float8Linear cases)."""
from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import kernels
import kernels.fp8
from kernels import eager
from workbench.harness import device_ops as device_ops_module
from workbench.harness.device_ops import device_ops

# Device ops (Triton launches + torch ops that run a kernel) of a training-mode Float8Linear 128->96
# with a bias on x (64, 128) fp32, per forward and per backward (torch.autograd.grad of x, weight
# and bias: the bias's sum included, no gradient accumulation). Measured at commit 1df93df, before
# issue 22's host pass, they were tensorwise 16 and 15, rowwise 26 and 20, blockwise 4 and 9, delayed 41 and 26, mxfp8 8 and
# 21: scale_of's four torch ops per tensor scale, five zeros per backward for the outputs that take
# no gradient, delayed scaling's bookkeeping in torch ops. After it the cast computes tensor's scale
# and one launch row's (quantize_kernel), the backward makes no zeros, delayed's scale and record
# are a launch each, and its given scales are saved for the backward as they are (no copies).
# mxfp8's were 10 and 16, of them its scales' pre-shuffles (a zero fill, a copy and the permuting
# clone each, two per forward and four per backward: K = 128 is 4 scales a row, a partial 8-scale
# chunk); its quantize now writes them pre-shuffled (tests/test_mx_preshuffle.py). tensorwise's were
# 8 and 6 while a torch amax reduced its amax pass's tile maxima; the cast now reduces the pass's
# partials itself, and delayed's current amax (read while its history is empty) is the pass and one
# reducing launch instead of the pass and a torch amax (launches 9 and 6 then, the same totals).
# delayed's were 17 and 10 (launches 11 and 7) until its scale's launch reduced the history and the
# amax pass's partials itself and its record's the cast's tile maxima (kernels.fp8.history_ops): no
# history.amax(), no torch amax of the tile maxima, no stack of x's and w's, no partials' reduce
# launch; per tensor the amax pass, the scale, the cast and the record.
# Counted on the path an eager call takes (the layer's own autograd.Function), which device_ops keeps.
# Now each is its Triton launches (the quantize passes and the GEMMs; rowwise's scale launches,
# delayed's amax passes, scales and records) and one torch op, the bias's add forward and its
# gradient's sum backward:
LAUNCHES = {"tensorwise": (5, 4), "rowwise": (7, 5), "blockwise": (3, 3), "delayed": (9, 6), "mxfp8": (3, 3)}


def _layer(recipe: str) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    layer = kernels.fp8.Float8Linear.from_linear(torch.nn.Linear(128, 96), recipe)
    return layer, torch.randn(64, 128, requires_grad=True), torch.randn(64, 96)


@pytest.mark.parametrize("recipe", list(LAUNCHES))
def test_a_float8_linears_device_ops_per_forward_and_backward_are_its_launches_and_the_bias(recipe):
    if kernels.fp8.get(recipe).needs:
        pytest.skip(kernels.fp8.get(recipe).needs)
    layer, x, dy = _layer(recipe)
    inputs = (x, layer.weight, layer.bias)
    forward = device_ops(lambda: layer(x))
    y = layer(x)
    backward = device_ops(lambda: torch.autograd.grad(y, inputs, dy, retain_graph=True))
    assert (forward.triton, backward.triton) == LAUNCHES[recipe], (forward, backward)
    # no torch op but the bias's add and, in the backward, its gradient's sum (delayed's bookkeeping
    # is its launches: no history.amax(), no stack of amaxes; no zeros for outputs without a gradient)
    assert (dict(forward.torch_ops), dict(backward.torch_ops)) == ({"add": 1}, {"sum": 1}), (forward, backward)


def test_device_ops_count_what_a_custom_op_runs_and_no_view_or_allocation():
    a = torch.randn(8, 8)
    seen = device_ops(lambda: (a.reshape(64).new_empty(3), a.t().reshape(64), a + 1, torch.empty(2).fill_(0)))
    # a transposed tensor's reshape copies it: a launch
    assert seen.triton == 0 and dict(seen.torch_ops) == {"clone": 1, "add": 1, "fill_": 1}
    x = torch.randn(40, 72)
    for granularity in ("tensor", "row"):
        for transpose in (False, True):   # seen inside the custom op (a dispatch mode takes it)
            seen = device_ops(lambda: kernels.gemm_fp8.quantize(x, granularity, torch.float8_e4m3fn,
                                                                transpose=transpose))
            # the amax pass, row's scale launch, the cast, which reduces tensor's partials itself
            # (quantize_kernel's docstring)
            want = {"tensor": 2, "row": 3}[granularity]
            assert (seen.triton, seen.total) == (want, want), (granularity, transpose, seen)
    assert not device_ops_module.launches(torch.ops.aten.view.default)
    assert not device_ops_module.launches(torch.ops.aten.promote_types.default)   # returns a dtype
    assert device_ops_module.launches(torch.ops.aten.copy_.default)


class _Passing(TorchDispatchMode):
    """A caller's dispatch mode that changes nothing."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def test_device_ops_count_the_path_an_eager_call_takes():
    """The counting mode is hidden from kernels.eager.path, which would take any dispatch mode for a
    tracer and run the custom op: counted, a call that needs a gradient runs its autograd.Function,
    as it does uncounted; a mode of the caller's own is still seen."""
    x = torch.randn(4, requires_grad=True)
    paths = []
    device_ops(lambda: paths.append(eager.path(x)))
    assert paths == [eager.AUTOGRAD] * 2   # the warm-up call and the counted one
    with _Passing():
        paths.clear()
        device_ops(lambda: paths.append(eager.path(x)))
    assert paths == [eager.CUSTOM_OP] * 2


class _Watching(TorchFunctionMode):
    """A torch-function mode that changes nothing but makes every public op take its custom op."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise", "blockwise", "delayed"])
def test_the_eager_autograd_path_gives_the_custom_ops_bits(recipe):
    """An eager call that needs a gradient runs fp8_linear's own autograd.Function, not the custom
    op: the output, the gradients and delayed scaling's state are the custom op's, bit for bit, on
    odd shapes (ragged tiles) and fresh values."""
    results = []
    for watched in (False, True):
        torch.manual_seed(7)
        layer = kernels.fp8.Float8Linear.from_linear(torch.nn.Linear(72, 40), recipe)
        x = torch.randn(3, 11, 72, requires_grad=True)
        dy = torch.randn(3, 11, 40)
        with _Watching() if watched else torch.enable_grad():
            y = layer(x)
            grads = torch.autograd.grad(y, (x, layer.weight, layer.bias), dy)
        results.append((y, *grads, *layer.buffers()))
    assert results[0][0].grad_fn is not None
    for eager_result, custom_op_result in zip(*results, strict=True):
        assert eager_result.dtype == custom_op_result.dtype
        assert torch.equal(eager_result, custom_op_result)


@pytest.mark.parametrize("given", ["x", "w", "both"])
def test_a_given_scale_on_either_side_runs_the_custom_op_and_matches_the_eager_path(given):
    """fp8_linear takes a caller's per-tensor scale for x, w or both: the custom op returns none of
    them as an output (a custom op's output may not alias an input), so it runs where a tracer makes
    calls take it, with the eager path's bits."""
    from kernels.fp8.linear import fp8_linear

    torch.manual_seed(3)
    x, w, dy = torch.randn(9, 40), torch.randn(24, 40), torch.randn(9, 24)
    scales = {"scale_x": torch.tensor(0.01), "scale_w": torch.tensor(0.02)}
    scales = {k: v for k, v in scales.items() if given == "both" or k.endswith(given)}
    results = []
    for watched in (False, True):
        xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
        with _Watching() if watched else torch.enable_grad():
            y = fp8_linear(xg, wg, "tensorwise", **scales)
            results.append((y, *torch.autograd.grad(y, (xg, wg), dy)))
    for eager_result, custom_op_result in zip(*results, strict=True):
        assert torch.equal(eager_result, custom_op_result)
