"""Delayed scaling under activation checkpointing: a recompute casts with its forward's scales
and records nothing (kernels/fp8/recipes/delayed.py), so a checkpointed model's gradients,
amax histories and saturation counts are, bit for bit, those of the same steps without
checkpointing, for a Float8Linear block and a Float8MoE layer, with torch's reentrant and
non-reentrant checkpoint. Before, the recompute cast with the history its forward had just
updated and recorded its amaxes a second time. Under ``kernels.fp8.checkpoint`` each
checkpointed call replays its own forward's scales (kernels/fp8/recompute.py), so the schedules
a plain checkpoint gets wrong (a layer run twice, 1F1B, the expert-parallel layer's chunks in
step 1, eval mode before the backward) train bit for bit as without checkpointing too."""
from __future__ import annotations

import copy
import functools

import pytest
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import kernels
import kernels.fp8
from kernels.fp8.recipes.delayed import recomputing
from kernels.moe.fp8_layer import Float8MoE

FP8, GRAD = torch.float8_e4m3fn, torch.float8_e5m2


class Block(torch.nn.Module):
    """Two delayed-scaling FP8 Linears around a GELU, optionally checkpointed as one."""

    def __init__(self, dim: int = 24, hidden: int = 40):
        super().__init__()
        self.up = kernels.fp8.Float8Linear(dim, hidden, recipe="delayed", fp8_dtype=FP8)
        self.down = kernels.fp8.Float8Linear(hidden, dim, recipe="delayed", fp8_dtype=FP8)
        self.reentrant: bool | None = None   # None: no checkpoint

    def body(self, x):
        return self.down(F.gelu(self.up(x)))

    def forward(self, x):
        if self.reentrant is None:
            return self.body(x)
        return checkpoint(self.body, x, use_reentrant=self.reentrant)


class MoEBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.moe = Float8MoE.from_moe(kernels.MoE(16, 32, 4, 2), "delayed", FP8, GRAD)
        self.reentrant: bool | None = None

    def forward(self, x):
        if self.reentrant is None:
            return self.moe(x)
        return checkpoint(self.moe, x, use_reentrant=self.reentrant)


def _steps(model, inputs):
    """Per step: x's gradient, every parameter's gradient and every buffer, after forward and backward."""
    seen = []
    for i, x in enumerate(inputs):
        model.zero_grad(set_to_none=True)
        x = x.clone().requires_grad_()   # reentrant checkpoint differentiates only through inputs that need it
        out = model(x)
        out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(100 + i)))
        seen.append({"x.grad": x.grad, **{n: p.grad.clone() for n, p in model.named_parameters()},
                     **{n: b.clone() for n, b in model.named_buffers()}})
    return seen


def _inputs(shape, scales):
    """One input a step, each at its own scale, so a history that takes the step's amax early
    gives another scale than the one before it."""
    return [s * torch.randn(shape, generator=torch.Generator().manual_seed(i)) for i, s in enumerate(scales)]


@functools.cache
def _unchecked(build, shape):
    """A fresh layer (seed 0, never run: each test trains its own copy), four inputs and the
    layer's four steps on them without checkpointing, computed once for both checkpoints."""
    torch.manual_seed(0)
    fresh = build()
    inputs = _inputs(shape, (1.0, 3.0, 0.5, 8.0))
    return fresh, inputs, _steps(copy.deepcopy(fresh), inputs)


@pytest.mark.parametrize("reentrant", [False, True])
@pytest.mark.parametrize("build, shape", [(Block, (2, 5, 24)), (MoEBlock, (2, 7, 16))], ids=["linear", "moe"])
def test_a_checkpointed_delayed_layer_trains_as_one_without_checkpointing(build, shape, reentrant):
    fresh, inputs, want = _unchecked(build, shape)
    checkpointed = copy.deepcopy(fresh)
    checkpointed.reentrant = reentrant
    got = _steps(checkpointed, inputs)
    for step, (w, g) in enumerate(zip(want, got)):
        assert w.keys() == g.keys()
        for name in w:
            assert torch.equal(w[name], g[name]), f"step {step}: {name} differs under checkpointing"


def test_recomputing_is_a_training_forward_inside_a_backward():
    """What the recipe takes for a recompute: only a training-mode forward that autograd's engine
    runs during a backward, as checkpoint's recompute is."""
    layer = kernels.fp8.Float8Linear(4, 4, recipe="delayed", fp8_dtype=FP8)
    seen = []

    def spy(module, args):
        seen.append(recomputing(module))

    layer.register_forward_pre_hook(spy)
    x = torch.randn(3, 4, requires_grad=True)
    checkpoint(layer, x, use_reentrant=False).sum().backward()
    assert seen == [False, True]
    layer.eval()
    seen.clear()
    checkpoint(layer, x, use_reentrant=False).sum().backward()
    assert seen == [False, False]   # eval mode records nothing, so it needs no kept scale


def test_a_forward_a_backward_hook_runs_casts_and_records_as_any_forward():
    """A hook that runs the layer during a backward (gradients off) is no recompute: its input,
    100x the forward's, is cast with its own scale and its amax enters the history."""
    layer = kernels.fp8.Float8Linear(8, 8, recipe="delayed", fp8_dtype=FP8)
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(0), requires_grad=True)
    hooked = []
    x.register_hook(lambda g: hooked.append(layer(100 * x.detach())))
    layer(x).sum().backward()
    history = layer.fp8_amax_history_x
    assert hooked and history[0] == (100 * x.detach()).abs().amax() and history[1] == x.detach().abs().amax()


# kernels.fp8.checkpoint: each checkpointed call replays its own forward's scales (kernels/fp8/recompute.py)

def test_open_tapes_count_the_checkpointed_calls_running():
    """``kernels.fp8.recompute.open_tapes``, which lets a forward outside any checkpointed call skip
    the tape stack: 1 while a kernels.fp8.checkpoint call records or replays, and 0 again after
    each, also after a checkpointed call that raises."""
    from kernels.fp8 import recompute
    layer = kernels.fp8.Float8Linear(4, 4, recipe="delayed", fp8_dtype=FP8)
    seen = []
    layer.register_forward_pre_hook(lambda module, args: seen.append(recompute.open_tapes))
    x = torch.randn(3, 4, requires_grad=True)
    layer(x)
    kernels.fp8.checkpoint(layer, x).sum().backward()
    assert seen == [0, 1, 1] and recompute.open_tapes == 0   # forward, checkpointed forward, its recompute

    def fails(t):
        raise RuntimeError("inside")

    with pytest.raises(RuntimeError, match="inside"):
        kernels.fp8.checkpoint(fails, x)
    assert recompute.open_tapes == 0


class Twice(torch.nn.Module):
    """One delayed FP8 Linear applied twice in a row (a shared layer), checkpointed as one call
    by ``wrap`` (None: not checkpointed)."""

    def __init__(self, dim: int = 24):
        super().__init__()
        self.lin = kernels.fp8.Float8Linear(dim, dim, recipe="delayed", fp8_dtype=FP8)
        self.wrap = None

    def body(self, x):
        return self.lin(F.gelu(self.lin(x)))

    def forward(self, x):
        return self.body(x) if self.wrap is None else self.wrap(self.body, x)


def _torch_checkpoint(fn, x):
    return checkpoint(fn, x, use_reentrant=False)


def _same_steps(want, got) -> bool:
    return all(w.keys() == g.keys() and all(torch.equal(w[n], g[n]) for n in w) for w, g in zip(want, got))


def test_a_layer_run_twice_recomputes_each_run_with_its_own_scales():
    """The second run casts with a history the first run updated, so the two runs' scales differ:
    a plain checkpoint recomputes both with the second's (the layer keeps one), kernels.fp8.checkpoint
    with each one's own, bit for bit the unchecked steps."""
    torch.manual_seed(0)
    plain = Twice()
    inputs = _inputs((2, 5, 24), (1.0, 3.0, 0.5, 8.0))
    want = _steps(plain, inputs)
    for wrap, exact in ((kernels.fp8.checkpoint, True), (_torch_checkpoint, False)):
        torch.manual_seed(0)
        model = Twice()
        model.wrap = wrap
        assert _same_steps(want, _steps(model, inputs)) is exact, wrap


def _one_f_one_b(model, micro_batches):
    """Every micro-batch's forward, then their backwards in order (1F1B's steady state), one step:
    x's gradients, every accumulated parameter gradient and every buffer."""
    model.zero_grad(set_to_none=True)
    xs = [x.clone().requires_grad_() for x in micro_batches]
    outs = [model(x) for x in xs]
    for i, out in enumerate(outs):
        out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(200 + i)))
    return {**{f"x{i}.grad": x.grad for i, x in enumerate(xs)},
            **{n: p.grad.clone() for n, p in model.named_parameters()},
            **{n: b.clone() for n, b in model.named_buffers()}}


@pytest.mark.parametrize("build, shape", [(Block, (2, 5, 24)), (MoEBlock, (2, 7, 16))], ids=["linear", "moe"])
def test_one_f_one_b_recomputes_each_micro_batch_with_its_forward_scales(build, shape):
    torch.manual_seed(0)
    plain = build()
    checkpointed = copy.deepcopy(plain)
    inner = checkpointed.body if build is Block else checkpointed.moe
    checkpointed.forward = lambda x: kernels.fp8.checkpoint(inner, x)
    micro = _inputs(shape, (1.0, 6.0, 0.25))
    want, got = _one_f_one_b(plain, micro), _one_f_one_b(checkpointed, micro)
    assert want.keys() == got.keys()
    for name in want:
        assert torch.equal(want[name], got[name]), f"{name} differs under kernels.fp8.checkpoint"


def test_eval_mode_between_forward_and_backward_recomputes_the_training_forward():
    """After a first step at x's scale 1, the second step's forward (x 4x larger) casts with the
    history's scale and records its amax; switched to eval mode before its backward, the
    recompute replays that scale, not the history's new one, and records nothing."""
    torch.manual_seed(0)
    plain = Block()
    checkpointed = copy.deepcopy(plain)
    x = torch.randn(2, 5, 24, generator=torch.Generator().manual_seed(1))
    dy = torch.randn(2, 5, 24, generator=torch.Generator().manual_seed(2))
    grads = []
    for model, run in ((plain, lambda f, x: f(x)), (checkpointed, kernels.fp8.checkpoint)):
        run(model.body, x.clone().requires_grad_()).backward(dy)   # step 1: the history holds x's amax
        model.zero_grad(set_to_none=True)
        xi = (4 * x).requires_grad_()
        out = run(model.body, xi)
        model.eval()
        out.backward(dy)
        grads.append([xi.grad, *(p.grad for p in model.parameters()), *model.buffers()])
    assert all(torch.equal(a, b) for a, b in zip(*grads))


def test_a_second_backward_replays_the_tape_from_its_start():
    torch.manual_seed(0)
    block = Block()
    x = torch.randn(3, 24, generator=torch.Generator().manual_seed(3), requires_grad=True)
    out = kernels.fp8.checkpoint(block.body, x)
    out.sum().backward(retain_graph=True)
    first = x.grad.clone()
    x.grad = None
    out.sum().backward()
    assert torch.equal(first, x.grad)


def test_a_recompute_that_casts_what_its_forward_did_not_is_an_error():
    first, other = (kernels.fp8.Float8Linear(8, 8, recipe="delayed", fp8_dtype=FP8) for _ in range(2))
    calls = []

    def changes(x):   # the forward runs one layer, the recompute another
        calls.append(None)
        return (first if len(calls) == 1 else other)(x)

    x = torch.randn(4, 8, requires_grad=True)
    with pytest.raises(RuntimeError, match="more often than its forward did"):
        kernels.fp8.checkpoint(changes, x).sum().backward()


def test_kernels_fp8_checkpoint_is_the_non_reentrant_one():
    with pytest.raises(ValueError, match="non-reentrant"):
        kernels.fp8.checkpoint(torch.sin, torch.ones(2, requires_grad=True), use_reentrant=True)


def _ep_checkpointed_steps(rank, world, recipes):
    """Per recipe, a one-rank expert-parallel FP8 layer in 2 chunks, two steps (delayed's first:
    an empty history, each chunk cast with its own amax), unchecked, under kernels.fp8.checkpoint
    and under torch's checkpoint: whether each checkpointed run's results equal the unchecked one's."""
    import torch.distributed as dist

    from kernels.moe.ep_fp8_layer import Float8ExpertParallelMoE

    def layer(recipe):
        torch.manual_seed(0)
        full = kernels.MoE(16, 32, 4, 2)
        return Float8ExpertParallelMoE.from_ep(kernels.MoE.from_full(full, dist.group.WORLD, ep_chunks=2),
                                               recipe, FP8)

    inputs = _inputs((13, 16), (1.0, 5.0))
    same = {}
    for recipe in recipes:
        want = _steps(layer(recipe), inputs)
        for name, wrap in (("kernels.fp8.checkpoint", kernels.fp8.checkpoint), ("torch", _torch_checkpoint)):
            model = layer(recipe)
            inner = model.forward
            model.forward = lambda x, inner=inner, wrap=wrap: wrap(inner, x)
            same[recipe, name] = _same_steps(want, _steps(model, inputs))
    return same


def test_the_expert_parallel_layer_s_chunks_recompute_with_their_own_scales():
    """Delayed: only the tapes give each chunk's recompute its forward's scales. Tensorwise: the
    owner's one weight cast a forward (kept for the later chunks and the backward's dgrad) is made
    again by the recompute from the same weights, so either checkpoint recomputes the same bits."""
    from kernels.comm.launch import run_local

    same = run_local(_ep_checkpointed_steps, 1, ("delayed", "tensorwise"), timeout=300, group_timeout=200)[0]
    assert same == {("delayed", "kernels.fp8.checkpoint"): True, ("delayed", "torch"): False,
                    ("tensorwise", "kernels.fp8.checkpoint"): True, ("tensorwise", "torch"): True}


@pytest.mark.parametrize("plans", ["kept", "cleared"])
@pytest.mark.parametrize("build, shape", [(Block, (2, 5, 24)), (MoEBlock, (2, 7, 16))], ids=["linear", "moe"])
def test_under_torch_compile_kernels_fp8_checkpoint_keeps_the_forward_scales(build, shape, plans):
    """Under torch.compile (aot_eager) the compiler recomputes a checkpointed region from its
    traced graph, so a delayed scale (the history's max, which the forward then updates in place)
    would be recomputed from the updated history: it is for the Linear block with torch's
    checkpoint (the MoE layer's compiled graph keeps its scales either way). kernels.fp8.checkpoint
    saves amax reductions there and runs the history's record once (selective checkpointing),
    and two steps give the eager unchecked steps' results bit for bit, both layers, the
    saturation counts included (a recomputed record counted step 1's twice).

    The path the compiler takes is pinned, whether the kernels' launch plans are kept from the
    eager steps or cleared: the Linear block's region is traced whole (no graph break; a plan
    built while dynamo traces is not kept, since keeping it was a side effect that broke the
    region out to run eagerly, so this test once passed or failed by which tests ran before
    it); the MoE layer's forward sets its aux_loss and expert_counts attributes, a side effect
    dynamo does not trace inside a checkpoint, so its region runs eagerly, where
    kernels.fp8.checkpoint's tapes keep the scales."""
    from torch._dynamo.utils import counters

    import kernels.plans

    plain, inputs, want = _unchecked(build, shape)
    inputs, want = inputs[:2], want[:2]   # the eager unchecked steps' first two
    same = {}
    for name, wrap in (("kernels.fp8.checkpoint", kernels.fp8.checkpoint), ("torch", _torch_checkpoint)):
        torch._dynamo.reset()
        counters.clear()
        if plans == "cleared":
            kernels.plans.invalidate()
        model = copy.deepcopy(plain)
        inner = model.body if build is Block else model.moe
        model.forward = torch.compile(lambda x, inner=inner, wrap=wrap: wrap(inner, x), backend="aot_eager")
        same[name] = _same_steps(want, _steps(model, inputs))
        assert bool(counters["graph_break"]) is (build is MoEBlock), dict(counters["graph_break"])
    assert same["kernels.fp8.checkpoint"]
    assert same["torch"] is (build is MoEBlock)   # the Linear block's scales are recomputed from the new history
