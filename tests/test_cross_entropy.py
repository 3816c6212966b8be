"""``kernels.cross_entropy`` (:mod:`kernels.loss.ops`) against a float64 evaluation and against
``F.cross_entropy(logits.float(), targets)``, the line of the training model it replaces: loss
and gradient, every dtype, odd vocabularies, ignored rows, views, empty inputs, bad inputs,
determinism, its custom ops under opcheck and torch.compile, autocast, and its device ops."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kernels
from kernels.loss import ops
from kernels.loss.cross_entropy_kernels import DTYPES
from kernels.outputs import poisoned_outputs
from torch.utils._python_dispatch import TorchDispatchMode

from workbench.harness.device_ops import device_ops

SCALE = 30.0   # logits of tens: exp() overflows fp32 unless the row's max is subtracted


def _inputs(rows, vocab, dtype, seed, ignored=(), ignore_index=-100):
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(rows, vocab, generator=gen) * SCALE).to(dtype)
    targets = torch.randint(0, max(vocab, 1), (rows,), generator=gen)
    targets[list(ignored)] = ignore_index
    return logits, targets


def _exact(logits, targets, ignore_index=-100):
    """Loss and its gradient (dloss = 1) in float64, from the logits' values."""
    x = logits.double().requires_grad_()
    loss = F.cross_entropy(x, targets, ignore_index=ignore_index)
    loss.backward()
    return loss.detach(), x.grad


def _torch(logits, targets, dloss, ignore_index=-100):
    """The model's line: fp32 loss and its gradient, cast back to the logits' dtype."""
    x = logits.detach().requires_grad_()
    loss = F.cross_entropy(x.float(), targets, ignore_index=ignore_index)
    (grad,) = torch.autograd.grad(loss, x, dloss)
    return loss.detach(), grad


def _ours(logits, targets, dloss, ignore_index=-100):
    x = logits.detach().requires_grad_()
    with poisoned_outputs():
        loss = kernels.cross_entropy(x, targets, ignore_index)
        (grad,) = torch.autograd.grad(loss, x, dloss)
    return loss.detach(), grad


def _assert_close(ours, baseline, exact, factor):
    """Ours within ``factor`` times torch's error (the design's rule), plus a few fp32 units of
    the largest exact value: torch may round luckily closer on a tensor of few elements."""
    assert ours.dtype == baseline.dtype and ours.shape == baseline.shape
    assert torch.equal(ours.isnan(), exact.isnan())
    err, base = ((t.double() - exact).nan_to_num().abs().max() for t in (ours, baseline))
    floor = 4 * 2.0 ** -24 * exact.nan_to_num().abs().max()
    assert err <= factor * base + floor, (float(err), float(base))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rows, vocab, ignored", [(37, 1000, (3, 17)), (16, 3001, ()), (5, 2 * 4096 + 7, (0,)),
                                                  (4, 1, (2,)), (1, 32003, ()), (2, 2 ** 18 + 3, ())])
def test_loss_and_gradient_match_float64_within_torchs_error(rows, vocab, ignored, dtype):
    """Fresh logits of scale 30, odd vocabularies (one past two blocks, 32003, past 256K), ignored
    rows, and a gradient of the loss times 3 (dloss is read, not assumed 1); outputs poisoned."""
    logits, targets = _inputs(rows, vocab, dtype, seed=rows + vocab, ignored=ignored)
    dloss = torch.tensor(3.0)
    exact_loss, exact_grad = _exact(logits, targets)
    loss, grad = _ours(logits, targets, dloss)
    torch_loss, torch_grad = _torch(logits, targets, dloss)
    assert loss.shape == () and loss.dtype == torch.float32
    _assert_close(loss, torch_loss, exact_loss, factor=2)
    _assert_close(grad, torch_grad, exact_grad * 3, factor=3)
    assert (grad[list(ignored)] == 0).all()


@pytest.mark.parametrize("ignore_index", [-100, 0, 5])
def test_ignore_index_is_torchs(ignore_index):
    """A row whose target is ``ignore_index`` (also one inside [0, V)) counts in neither the sum nor
    the mean, and gets a zero gradient; every row ignored gives nan and zero gradients, as torch."""
    logits, targets = _inputs(9, 40, torch.float32, seed=ignore_index + 200, ignored=(1, 4), ignore_index=ignore_index)
    for targets_now in (targets, torch.full_like(targets, ignore_index)):
        loss, grad = _ours(logits, targets_now, torch.tensor(1.0), ignore_index)
        torch_loss, torch_grad = _torch(logits, targets_now, torch.tensor(1.0), ignore_index)
        torch.testing.assert_close(loss, torch_loss, equal_nan=True)
        torch.testing.assert_close(grad, torch_grad)
    assert loss.isnan() and (grad == 0).all()


def test_an_ignored_row_of_nan_gets_a_zero_gradient():
    """Ignored, a row of NaN logits leaves the loss torch's (finite) and gets a zero gradient,
    where torch's is NaN (``0·exp(nan)``); the other rows' gradients are torch's."""
    logits, targets = _inputs(5, 30, torch.float32, seed=12, ignored=(3,))
    logits[3] = float("nan")
    (loss, grad), (torch_loss, torch_grad) = _ours(logits, targets, torch.tensor(1.0)), \
        _torch(logits, targets, torch.tensor(1.0))
    torch.testing.assert_close(loss, torch_loss)
    assert (grad[3] == 0).all() and torch_grad[3].isnan().all()
    torch.testing.assert_close(grad[[0, 1, 2, 4]], torch_grad[[0, 1, 2, 4]])


@pytest.mark.parametrize("vocab", [0, 7])
def test_no_rows_gives_torchs_nan_and_an_empty_gradient(vocab):
    logits, targets = _inputs(0, vocab, torch.bfloat16, seed=1)
    loss, grad = _ours(logits, targets, torch.tensor(1.0))
    assert loss.isnan() and grad.shape == (0, vocab) and grad.dtype == torch.bfloat16


def _views(dtype):
    """Logits views the kernels read in place (rows of a wider buffer, one row broadcast, stride
    0) or copy (columns not adjacent), and a strided view of the targets."""
    wide, targets = _inputs(12, 45, dtype, seed=7)
    targets %= 37
    return {"row stride": (wide[:, :37], targets),
            "broadcast row": (wide[:1, :37].expand(12, 37), targets),
            "columns apart": (_inputs(37, 12, dtype, seed=8)[0].t(), targets),
            "strided targets": (wide[:6, :37], targets[::2])}


@pytest.mark.parametrize("view", ["row stride", "broadcast row", "columns apart", "strided targets"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_views_give_the_contiguous_result(view, dtype):
    logits, targets = _views(dtype)[view]
    loss, grad = _ours(logits, targets, torch.tensor(1.0))
    dense_loss, dense_grad = _ours(logits.contiguous(), targets.contiguous(), torch.tensor(1.0))
    assert torch.equal(loss, dense_loss) and torch.equal(grad, dense_grad)
    _assert_close(loss, _torch(logits, targets, torch.tensor(1.0))[0], _exact(logits, targets)[0], factor=2)


def test_two_runs_give_the_same_bits():
    logits, targets = _inputs(64, 3001, torch.bfloat16, seed=11, ignored=(5,))
    first, again = _ours(logits, targets, torch.tensor(1.0)), _ours(logits, targets, torch.tensor(1.0))
    assert all(torch.equal(a, b) for a, b in zip(first, again))


def test_targets_out_of_range_give_nan_or_torchs_error_where_asked():
    """Unchecked, the bad row makes the loss and its own gradient row NaN, never a finite wrong
    value; ``check_targets=True`` raises torch's IndexError (and passes good targets)."""
    logits, targets = _inputs(6, 20, torch.float32, seed=3, ignored=(0,))
    kernels.cross_entropy(logits, targets, check_targets=True)
    for bad in (20, -3):
        targets[2] = bad
        loss, grad = _ours(logits, targets, torch.tensor(1.0))
        assert loss.isnan() and grad[2].isnan().all() and not grad[[0, 1, 3, 4, 5]].isnan().any()
        with pytest.raises(IndexError, match=f"Target {bad} is out of bounds"):
            F.cross_entropy(logits, targets)
        with pytest.raises(IndexError, match=f"Target {bad} is out of bounds"):
            kernels.cross_entropy(logits, targets, check_targets=True)


@pytest.mark.parametrize("logits, targets, ignore_index, error, match", [
    (torch.randn(4, 5, dtype=torch.float64), torch.zeros(4, dtype=torch.long), -100, TypeError, "dtype float64"),
    (torch.randn(4, 5), torch.zeros(4, dtype=torch.int32), -100, TypeError, "int64"),
    (torch.randn(5), torch.zeros(5, dtype=torch.long), -100, ValueError, "logits must be 2-D"),
    (torch.randn(4, 5), torch.zeros(4, 1, dtype=torch.long), -100, ValueError, "targets must be 1-D"),
    (torch.randn(4, 5), torch.zeros(3, dtype=torch.long), -100, ValueError, "targets has 3 rows, logits 4"),
    (torch.randn(4, 5, device="meta"), torch.zeros(4, dtype=torch.long, device="meta"), -100, ValueError, "logits is on meta"),
    (torch.randn(4, 5), torch.zeros(4, dtype=torch.long, device="meta"), -100, ValueError, "targets is on meta"),
    (torch.randn(4, 5), torch.zeros(4, dtype=torch.long), 1.5, TypeError, "ignore_index must be an int"),
    (torch.randn(4, 5).tolist(), torch.zeros(4, dtype=torch.long), -100, TypeError, "logits must be a torch.Tensor"),
], ids=["logits dtype", "targets dtype", "logits rank", "targets rank", "rows", "logits device", "targets device",
        "ignore_index", "not a tensor"])
def test_bad_inputs_are_refused(logits, targets, ignore_index, error, match):
    with pytest.raises(error, match=match):
        kernels.cross_entropy(logits, targets, ignore_index)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_the_state_holds_each_rows_loss_max_and_log_sum_then_the_count(dtype):
    """The forward's second output, which the backward reads, as the kernels' module lays it out:
    R row losses (0 where ignored), R maxima, R logs of the sums of exp(x - max), the rows
    counted; every value written (outputs poisoned), from a strided view of the targets."""
    rows, vocab = 7, 300
    logits, targets = _inputs(rows, vocab, dtype, seed=13, ignored=(2, 5))
    targets = torch.stack([targets, targets], 1)[:, 0]   # stride 2
    with poisoned_outputs():
        loss, state = torch.ops.kernels.cross_entropy(logits, targets, -100)
    assert state.shape == (3 * rows + 1,) and state.dtype == torch.float32
    x = logits.double()
    top = x.max(1).values
    exact_losses = F.cross_entropy(x, targets, reduction="none")
    torch.testing.assert_close(state[:rows].double(), exact_losses, rtol=1e-6, atol=1e-5)
    assert torch.equal(state[rows:2 * rows], logits.float().max(1).values)
    torch.testing.assert_close(state[2 * rows:3 * rows].double(), (x - top[:, None]).exp().sum(1).log())
    assert state[3 * rows] == rows - 2
    torch.testing.assert_close(loss, state[:rows].sum() / (rows - 2))


def test_the_custom_ops_pass_opcheck():
    logits, targets = _inputs(6, 33, torch.bfloat16, seed=4, ignored=(1,))
    torch.library.opcheck(torch.ops.kernels.cross_entropy.default, (logits.requires_grad_(), targets, -100))
    loss, state = torch.ops.kernels.cross_entropy(logits.detach(), targets, -100)
    torch.library.opcheck(torch.ops.kernels.cross_entropy_backward.default,
                          (torch.tensor(2.0), logits.detach(), targets, state, -100))


def test_torch_compile_keeps_the_op_in_one_graph():
    def step(logits, targets):
        return kernels.cross_entropy(logits * 2, targets)

    logits, targets = _inputs(8, 50, torch.bfloat16, seed=5, ignored=(2,))
    explained = torch._dynamo.explain(step)(logits, targets)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    x, y = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    compiled(x, targets).backward()
    expected = step(y, targets)
    expected.backward()
    assert torch.equal(compiled(logits, targets), expected.detach()) and torch.equal(x.grad, y.grad)


class _Seen(TorchDispatchMode):
    """Records the ops dispatched under it: a watcher, which must see the custom ops."""

    def __init__(self):
        super().__init__()
        self.ops = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(str(func))
        return func(*args, **(kwargs or {}))


def test_an_eager_call_skips_the_custom_ops_and_a_watched_one_takes_them(monkeypatch):
    logits, targets = _inputs(6, 50, torch.bfloat16, seed=10, ignored=(1,))
    expected = _ours(logits, targets, torch.tensor(1.0))
    with monkeypatch.context() as patch:
        for name in ("_forward", "_backward_op"):
            patch.setattr(ops, name, lambda *args: pytest.fail("the custom op was called"))
        assert torch.equal(kernels.cross_entropy(logits, targets), expected[0])
        assert all(torch.equal(a, b) for a, b in zip(_ours(logits, targets, torch.tensor(1.0)), expected))
    x = logits.clone().requires_grad_()
    with _Seen() as seen:
        loss = kernels.cross_entropy(x, targets)
        (grad,) = torch.autograd.grad(loss, x)
    assert {"kernels.cross_entropy.default", "kernels.cross_entropy_backward.default"} <= seen.ops
    assert torch.equal(loss, expected[0]) and torch.equal(grad, expected[1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_autocast_does_not_cast_the_logits(dtype):
    """Under a bf16 autocast region the loss and gradient are those outside it: the logits are read
    in their own dtype (fp32 logits are not rounded to bf16 first)."""
    logits, targets = _inputs(7, 300, dtype, seed=6)
    outside = _ours(logits, targets, torch.tensor(1.0))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside = _ours(logits, targets, torch.tensor(1.0))
    assert all(torch.equal(a, b) for a, b in zip(outside, inside))


def test_device_ops_are_the_row_pass_and_the_mean_forward_and_one_pass_backward():
    """Exact Triton launches and no torch op: 2 forward (with or without a gradient), 1 backward;
    logits whose columns are not adjacent add their copy."""
    logits, targets = _inputs(8, 40, torch.bfloat16, seed=8)
    forward = device_ops(lambda: kernels.cross_entropy(logits, targets))
    assert (forward.triton, dict(forward.torch_ops)) == (2, {})
    x = logits.clone().requires_grad_()
    assert device_ops(lambda: kernels.cross_entropy(x, targets)).triton == 2
    loss, dloss = kernels.cross_entropy(x, targets), torch.tensor(1.0)
    backward = device_ops(lambda: torch.autograd.grad(loss, x, dloss, retain_graph=True))
    assert (backward.triton, dict(backward.torch_ops)) == (1, {})
    columns_apart = logits.t().contiguous().t()
    apart = device_ops(lambda: kernels.cross_entropy(columns_apart, targets))
    assert (apart.triton, dict(apart.torch_ops)) == (2, {"clone": 1})


def test_the_custom_ops_launches_are_each_backends_own(fake_gpu):
    """The custom ops' implementations keep their launches per metadata and backend: bf16 logits
    launched on the interpreter store through its bf16 workaround, the same inputs on a GPU do
    not, so a process that changes backend (a test pretending to be a GPU) gets that one's."""
    logits, targets = torch.randn(3, 40).bfloat16(), torch.randint(40, (3,))
    on_cpu = ops._launches(logits, targets, -100)
    fake_gpu("hip", "gfx942")
    on_gpu = ops._launches(logits, targets, -100)
    assert on_cpu.gradient_args[-1] is True and on_gpu.gradient_args[-1] is False   # INTERP_BF16, last
    assert ops._launches(logits, targets, -100) is on_gpu


def test_a_repeated_call_reuses_its_plan(monkeypatch):
    """The checks and settings run once per metadata and ignore_index, not per call."""
    built, plan = [], ops._Plan
    monkeypatch.setattr(ops, "_Plan", lambda *args: built.append(args) or plan(*args))
    ops._PLANS.clear()
    logits, targets = _inputs(3, 20, torch.float16, seed=9)
    for _ in range(3):
        kernels.cross_entropy(logits, targets)
    kernels.cross_entropy(logits, targets, ignore_index=1)
    assert len(built) == 2


@pytest.mark.gpu
def test_on_this_gpu_the_steps_loss_matches_float64_within_torchs_error():
    """bf16 logits over gpu-moe-small's 32000-token vocabulary, 512 rows (some ignored), on the
    real backend against torch's own GPU ``F.cross_entropy`` of fp32 logits, by the CPU test's
    rule. bf16, as the step runs it: the gradient's rounding to bf16 dominates both errors, where
    an fp32 gradient would also compare the GPU's approximate exp with torch's."""
    device = kernels.backend.current().device
    logits, targets = (t.to(device) for t in _inputs(512, 32000, torch.bfloat16, seed=5, ignored=(0, 7, 300)))
    dloss = torch.tensor(3.0, device=device)
    exact_loss, exact_grad = _exact(logits, targets)
    loss, grad = _ours(logits, targets, dloss)
    torch_loss, torch_grad = _torch(logits, targets, dloss)
    _assert_close(loss, torch_loss, exact_loss, factor=2)
    _assert_close(grad, torch_grad, exact_grad * 3, factor=3)
    assert (grad[[0, 7, 300]] == 0).all()
