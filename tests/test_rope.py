"""``kernels.rope``: the rotation and its gradient against float64 and against the training
model's ``apply_rope`` itself, in every dtype and in the layouts a training step passes, empty
and one-pair shapes, bad inputs, the custom ops under opcheck and torch.compile, and one
launch a direction."""
from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import AotEagerAndRecordGraphs
from torch.utils._python_dispatch import TorchDispatchMode

import kernels
from kernels.outputs import poisoned_outputs
from kernels.rotary import op as rope_op
from kernels.rotary.kernel import DTYPES, settings
from rounding_units import UNIT
from workbench.harness.device_ops import device_ops, stubbed_launches
from workbench.train.layers import apply_rope, rope_tables

SHAPES = [(2, 3, 17, 6), (1, 6, 5, 64), (2, 2, 3, 2)]
"""(B, H, S, D): odd heads over several programs and a D that is no power of two (masked
columns), a GQA query's 6 heads at the presets' head dim, one pair a row."""


def _heads(b, h, s, d, dtype, gen, layout="model"):
    """x (B, H, S, D): ``"model"`` as the training step passes it (a (B, S, H, D) projection,
    ``transpose(1, 2)``), ``"contiguous"``, ``"sliced"`` (rows of a wider buffer: not dense) or
    ``"strided"`` (every other element of the last dim)."""
    if layout == "model":
        return torch.randn(b, s, h, d, generator=gen).to(dtype).transpose(1, 2)
    if layout == "contiguous":
        return torch.randn(b, h, s, d, generator=gen).to(dtype)
    if layout == "sliced":
        return torch.randn(b, h, s, d + 6, generator=gen).to(dtype)[..., 3:d + 3]
    return torch.randn(b, h, s, 2 * d, generator=gen).to(dtype)[..., ::2]


def _tables(s, d, gen):
    """cos and sin (S, D/2) of fresh random angles, float32."""
    angles = torch.rand(s, d // 2, generator=gen, dtype=torch.float64) * 200 - 100
    return angles.cos().float(), angles.sin().float()


def _rotated(x, cos, sin, sign=1):
    """x's pairs rotated by ``sign`` times each angle, in float64."""
    pairs = x.double().unflatten(-1, (-1, 2))
    even, odd, cos, sin = pairs[..., 0], pairs[..., 1], cos.double(), sign * sin.double()
    return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)


def _close(got, x, cos, sin, sign=1):
    """``got`` within one rounding to x's dtype of the float64 rotation of x, plus fp32's: the
    two products and their sum each rounded, relative to the pair's length (which cancellation
    cannot exceed)."""
    exact = _rotated(x, cos, sin, sign)
    length = x.double().unflatten(-1, (-1, 2)).norm(dim=-1).repeat_interleave(2, dim=-1)
    assert got.dtype == x.dtype and got.shape == x.shape and not got.isnan().any()
    err = (got.double() - exact).abs()
    assert (err <= UNIT[x.dtype] * exact.abs() + 2.0 ** -21 * length).all(), err.max()


def _check_rotation(x, cos, sin, dy_values):
    """y and dx (dy, of ``dy_values``, laid out as attention's backward hands it back: as y) into
    poisoned outputs, each within :func:`_close` of the float64 rotation; both laid out as x."""
    dy = torch.empty_like(x).copy_(dy_values)
    with poisoned_outputs():
        y = kernels.rope(x, cos, sin)
        dx, = torch.autograd.grad(y, x, dy)
    _close(y, x, cos, sin)
    _close(dx, dy, cos, sin, sign=-1)
    assert y.stride() == x.stride() and dx.stride() == x.stride()


@pytest.mark.parametrize("layout", ["model", "contiguous"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_rotation_and_its_gradient_match_float64_rounded_once(shape, dtype, layout):
    """y and dx (dy laid out as attention's backward hands it back: as y) into poisoned
    outputs; both laid out as x."""
    gen = torch.Generator().manual_seed(sum(shape) + len(layout))
    x = _heads(*shape, dtype, gen, layout).requires_grad_()
    cos, sin = _tables(shape[2], shape[3], gen)
    _check_rotation(x, cos, sin, torch.randn(shape, generator=gen))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", ["model", "sliced", "strided"])
def test_equals_the_models_apply_rope_and_its_gradient(dtype, layout):
    """Bit for bit, result and gradient, on rope_tables' cos and sin, in the model's layout, on
    rows of a wider buffer and on a last dim of stride 2 (read as they are, no copy): the kernel
    computes eager's fp32 products and sums in eager's order, and the interpreter's NumPy
    contracts none into a fused multiply-add (a GPU may, which moves fp32's last bit). The
    result is laid out as eager's: ``torch.empty_like(x)``."""
    b, h, s, d = 2, 4, 9, 64
    gen = torch.Generator().manual_seed(7 + len(layout))
    x = _heads(b, h, s, d, dtype, gen, layout).requires_grad_()
    x_eager = x.detach().clone().requires_grad_()
    cos, sin = rope_tables(s, d, 500000.0)
    dy = torch.randn(b, h, s, d, generator=gen).to(dtype)
    with poisoned_outputs():
        y = kernels.rope(x, cos, sin)
        y.backward(dy)
    want = apply_rope(x_eager, cos, sin)
    want.backward(dy)
    assert torch.equal(y, want) and torch.equal(x.grad, x_eager.grad)
    assert y.stride() == torch.empty_like(x).stride()


@pytest.mark.parametrize("shape", [(0, 3, 5, 4), (2, 0, 5, 4), (2, 3, 0, 4), (2, 3, 5, 0)], ids=str)
def test_empty_dims_give_torchs_empty_result_and_gradient(shape):
    gen = torch.Generator().manual_seed(3)
    x = _heads(*shape, torch.bfloat16, gen).requires_grad_()
    cos, sin = _tables(shape[2], shape[3], gen)
    y = kernels.rope(x, cos, sin)
    want = apply_rope(x.detach(), cos, sin)
    assert (y.shape, y.dtype, y.stride()) == (want.shape, want.dtype, torch.empty_like(x).stride())
    y.sum().backward()
    assert x.grad.shape == x.shape


def test_an_expanded_gradient_and_input_are_read_as_they_are():
    """``y.sum()``'s gradient is a stride-0 expansion, and x may be one along H (a head
    broadcast): both rotated with no copy; the results are dense (``torch.empty_like``'s)."""
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(2, 1, 5, 8, generator=gen).expand(2, 3, 5, 8).requires_grad_()
    cos, sin = _tables(5, 8, gen)
    with poisoned_outputs():
        y = kernels.rope(x, cos, sin)
        y.sum().backward()
    _close(y, x, cos, sin)
    _close(x.grad, torch.ones_like(x), cos, sin, sign=-1)
    one = torch.ones(())
    counted = device_ops(lambda: torch.autograd.grad(kernels.rope(x, cos, sin).sum(), x, one))
    assert (counted.triton, dict(counted.torch_ops)) == (2, {"sum": 1})   # no copy of x or of the gradient


def test_not_cast_under_autocast():
    """x keeps its dtype under torch.autocast, as apply_rope's result does."""
    gen = torch.Generator().manual_seed(5)
    x = _heads(1, 2, 3, 8, torch.float32, gen)
    cos, sin = _tables(3, 8, gen)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = kernels.rope(x, cos, sin)
    assert y.dtype == torch.float32 and torch.equal(y, kernels.rope(x, cos, sin))


def test_bad_inputs_get_clear_errors():
    gen = torch.Generator().manual_seed(2)
    x = _heads(1, 2, 3, 8, torch.bfloat16, gen)
    cos, sin = _tables(3, 8, gen)
    cases = [
        ((x[..., :7], cos, sin), ValueError, r"D=7 must be even"),
        ((x, cos[:2], sin), ValueError, r"cos has shape \(2, 4\); it must be \(S, D/2\) = \(3, 4\)"),
        ((x, cos, sin[:, :3]), ValueError, r"sin has shape \(3, 3\); it must be \(S, D/2\) = \(3, 4\)"),
        ((x, cos.bfloat16(), sin), TypeError, r"cos has dtype bfloat16; this kernel takes float32"),
        ((x.double(), cos, sin), TypeError, r"x has dtype float64"),
        ((x[0], cos, sin), ValueError, r"x must be 4-D"),
        ((x, cos.to("meta"), sin), ValueError, r"cos is on meta"),
        ((x, cos, sin.requires_grad_()), ValueError, r"sin requires grad, but rope gives cos and sin no gradient"),
    ]
    for args, error, message in cases:
        with pytest.raises(error, match=message):
            kernels.rope(*args)


def test_rows_past_int32_are_refused():
    """B·H·S = 2^31 rows (an expansion, no memory): the kernel numbers rows in int32. Launches
    are stubbed, so without the check the call would return instead of raising."""
    x = torch.zeros(1, 1, 1, 2, dtype=torch.bfloat16).expand(2 ** 16, 2 ** 15, 1, 2)
    with stubbed_launches(), pytest.raises(ValueError, match=r"x has B·H·S = 2147483648 rows; rope takes fewer than 2\^31"):
        kernels.rope(x, torch.ones(1, 1), torch.zeros(1, 1))


def test_devices_differing_are_named(monkeypatch):
    """Two devices the backend takes (two GPUs): ``validate.same_device``'s error. Here the
    tables' device is made another's by a stand-in for the per-argument check, which alone
    would stop a meta tensor first."""
    monkeypatch.setattr(rope_op.validate, "tensor", lambda *args, **kwargs: None)
    x = torch.zeros(1, 1, 2, 4)
    with pytest.raises(ValueError, match=r"tensors are on different devices \(x: cpu, cos: meta, sin: cpu\)"):
        kernels.rope(x, torch.zeros(2, 2, device="meta"), torch.zeros(2, 2))


def test_a_repeated_call_skips_the_checks(monkeypatch):
    """The launch plan of inputs of one metadata is kept: a second call neither checks nor
    configures again; other metadata (a new S) does."""
    gen = torch.Generator().manual_seed(9)
    x = _heads(1, 2, 3, 8, torch.float16, gen)
    cos, sin = _tables(3, 8, gen)
    rope_op._PLANS.clear()
    first = kernels.rope(x, cos, sin)
    monkeypatch.setattr(rope_op._Checked, "__init__", lambda *args: pytest.fail("checked again"))
    assert torch.equal(kernels.rope(x, cos, sin), first)
    with pytest.raises(pytest.fail.Exception, match="checked again"):
        kernels.rope(x[:, :, :2], cos[:2], sin[:2])


def _refuse(*args):
    raise AssertionError("the custom op was called")


def test_an_eager_call_skips_the_custom_ops_and_a_watched_one_takes_them(monkeypatch):
    """Without a gradient the launch plan runs; with one, :class:`_Rope`, whose backward runs
    the backward's implementation; under a dispatch mode (a tracer's) both custom ops run."""
    gen = torch.Generator().manual_seed(12)
    x = _heads(1, 2, 3, 8, torch.float16, gen)
    cos, sin = _tables(3, 8, gen)
    want = kernels.rope(x, cos, sin)
    with monkeypatch.context() as patch:
        patch.setattr(rope_op, "_rope", _refuse)
        patch.setattr(rope_op, "_rope_backward", _refuse)
        assert torch.equal(kernels.rope(x, cos, sin), want)
        y = kernels.rope(x.requires_grad_(), cos, sin)
        assert type(y.grad_fn).__name__ == "_RopeBackward"
        y.backward(torch.ones_like(y))
    called = []
    for name in ("_rope", "_rope_backward"):
        real = getattr(rope_op, name)
        monkeypatch.setattr(rope_op, name, lambda *args, real=real, name=name: called.append(name) or real(*args))
    with _Watching():
        y = kernels.rope(x, cos, sin)
        dx, = torch.autograd.grad(y, x, torch.ones_like(y))
    assert called == ["_rope", "_rope_backward"] and torch.equal(y, want) and torch.equal(dx, x.grad)


class _Watching(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def test_custom_ops_pass_opcheck():
    gen = torch.Generator().manual_seed(4)
    x = _heads(2, 3, 5, 6, torch.bfloat16, gen).requires_grad_()
    cos, sin = _tables(5, 6, gen)
    torch.library.opcheck(torch.ops.kernels.rope.default, (x, cos, sin))
    torch.library.opcheck(torch.ops.kernels.rope_backward.default, (x.detach(), cos, sin))


@pytest.mark.filterwarnings("ignore:Your compiler for AOTAutograd")   # the recording backend's
def test_torch_compile_keeps_both_ops_without_graph_breaks():
    """fullgraph: one graph, the forward custom op in AOT autograd's forward graph and the
    backward one in its backward graph; the compiled result and gradient are the eager op's."""
    def loss(x, cos, sin):
        return (kernels.rope(x, cos, sin).float() ** 2).sum()

    gen = torch.Generator().manual_seed(6)
    x = _heads(1, 3, 4, 8, torch.bfloat16, gen).requires_grad_()
    cos, sin = _tables(4, 8, gen)
    want = loss(x, cos, sin)
    want_grad, = torch.autograd.grad(want, x)
    backend = AotEagerAndRecordGraphs()
    value = torch.compile(loss, fullgraph=True, backend=backend)(x, cos, sin)
    grad, = torch.autograd.grad(value, x)
    assert torch.equal(value, want) and torch.equal(grad, want_grad)
    assert len(backend.graphs) == 1
    assert _targets(backend.fw_graphs) == {torch.ops.kernels.rope.default}
    assert _targets(backend.bw_graphs) == {torch.ops.kernels.rope_backward.default}


def _targets(graphs) -> set:
    """The ``kernels::`` ops the graphs call."""
    return {node.target for graph in graphs for node in graph.graph.nodes
            if isinstance(node.target, torch._ops.OpOverload) and node.target.namespace == "kernels"}


@pytest.mark.parametrize("grad", [False, True], ids=["no grad", "grad"])
def test_one_launch_forward_and_one_backward(grad):
    """No torch op beside the launch (the allocation launches nothing), either direction,
    where the model's apply_rope runs 9 forward and 12 backward (what the op's docstring says)."""
    gen = torch.Generator().manual_seed(8)
    x = _heads(2, 3, 5, 8, torch.bfloat16, gen).requires_grad_(grad)
    cos, sin = _tables(5, 8, gen)
    for rope, launches, torch_ops in ((kernels.rope, 1, 0), (apply_rope, 0, 9)):
        forward = device_ops(lambda: rope(x, cos, sin))
        assert (forward.triton, forward.total) == (launches, launches + torch_ops)
    if grad:
        dy = torch.randn(x.shape, generator=gen).to(x.dtype)
        for rope, launches, torch_ops in ((kernels.rope, 1, 0), (apply_rope, 0, 12)):
            y = rope(x, cos, sin)
            backward = device_ops(lambda: torch.autograd.grad(y, x, dy, retain_graph=True))
            assert (backward.triton, backward.total) == (launches, launches + torch_ops)


@pytest.mark.parametrize("dtype, d, rows, warps", [
    (torch.bfloat16, 64, 32, 4), (torch.bfloat16, 128, 16, 4), (torch.float32, 128, 8, 4),
    (torch.bfloat16, 2, 1024, 4), (torch.bfloat16, 6, 256, 4), (torch.bfloat16, 8192, 1, 16),
    (torch.bfloat16, 65536, 1, 16)])
def test_a_tile_is_one_16_byte_vector_a_thread(dtype, d, rows, warps):
    """settings: 4 waves of 64 threads, 16 bytes each, over whole rows; a row past that takes
    more warps (at most 16)."""
    config = settings(d, dtype)
    assert (config["BLOCK_ROWS"], config["num_warps"]) == (rows, warps)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_on_this_gpu_the_steps_rotation_matches_float64(dtype):
    """gpu-moe-small's q (16 heads of 64) at S = 2048, laid out as the step passes it, on the real
    backend: y and dx within the CPU's bound (a GPU's fused multiply-adds stay inside its fp32
    term) and laid out as x."""
    device = kernels.backend.current().device
    gen = torch.Generator().manual_seed(11)
    x = _heads(2, 16, 2048, 64, dtype, gen).to(device).requires_grad_()
    cos, sin = rope_tables(2048, 64, 10000.0, device)
    _check_rotation(x, cos, sin, torch.randn(x.shape, generator=gen))
