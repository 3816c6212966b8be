"""What every fuzz test shares: tiny sizes, tensors in every layout a public op must take,
the harness's rule as an assertion, and a child process for inputs that crash.

Sizes stay tiny because each interpreted Triton program costs about a millisecond; the
layouts are those a PyTorch op takes (row- and column-major, sliced, stride-0 broadcast,
an offset into a larger storage), so a kernel that reads through the wrong stride or from
the start of the storage fails here rather than in a user's model.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import torch
from hypothesis import strategies as st

from workbench.check import (broken_rules, compare, neighbours, other_memory_order, relative_error,
                             rounding_neighbour)
from workbench.harness.tolerances import reassociation_bound

# Where a layout lives: "transposed" reverses the storage order of every dim (column-major
# for a matrix), "sliced" takes every other element of the last dim, "offset" starts the
# tensor three elements into its storage, "expanded" broadcasts one dim with stride 0.
LAYOUTS = ("contiguous", "transposed", "sliced", "offset", "expanded")
INDEX_LAYOUTS = ("contiguous", "sliced", "offset")   # integer tensors keep their values


def sizes(low: int = 0, high: int = 9):
    """A dimension: half the draws are ``low`` or ``low + 1`` (0 and 1: the cases kernels
    forget), the rest anywhere up to ``high``."""
    return st.one_of(st.sampled_from([low, min(low + 1, high)]), st.integers(low, high))


def laid_out(values: torch.Tensor, layout: str, dim: int = 0) -> torch.Tensor:
    """``values`` (at least 1-D) stored in ``layout``. Every layout keeps the elements but
    "expanded", which repeats the first slice along ``dim`` with stride 0 (a broadcast view
    cannot hold distinct values); a test computes its reference from what it got."""
    if layout == "contiguous":
        return values.contiguous()
    if layout == "expanded":
        return values.narrow(dim, 0, min(1, values.shape[dim])).expand(values.shape)
    if layout == "transposed":
        order = list(reversed(range(values.dim())))
        return values.permute(order).contiguous().permute(order)
    if layout == "sliced":
        wide = values.new_zeros((*values.shape[:-1], 2 * values.shape[-1]))
        wide[..., ::2] = values
        return wide[..., ::2]
    if layout == "offset":
        storage = values.new_zeros(values.numel() + 3)
        storage[3:] = values.reshape(-1)
        return storage[3:].view(values.shape)
    raise ValueError(f"unknown layout {layout!r}")


@st.composite
def tensors(draw, shape, dtype=torch.float32, layouts=LAYOUTS):
    """A fresh random tensor of ``shape`` and ``dtype`` in a drawn layout (and broadcast dim),
    its values from a drawn seed, so a failure's example reproduces it."""
    layout, dim = draw(st.sampled_from(layouts)), draw(st.integers(0, len(shape) - 1))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2 ** 16)))
    return laid_out(torch.randn(shape, generator=gen).to(dtype), layout, dim)


@st.composite
def operands(draw, shapes, dtypes, layouts=LAYOUTS):
    """Tensors of one drawn dtype, one per shape that the strategy ``shapes`` draws (dims
    shared between operands, e.g. K, are drawn once by it), each in its own layout."""
    dtype = draw(st.sampled_from(dtypes))
    return tuple(draw(tensors(s, dtype, layouts)) for s in draw(shapes))


def index_tensor(values, dtype, layout: str) -> torch.Tensor:
    """An integer tensor holding ``values`` in ``layout`` (of :data:`INDEX_LAYOUTS`)."""
    return laid_out(torch.as_tensor(values, dtype=dtype), layout)


def output_grad(shape, dtype, seed: int) -> torch.Tensor:
    """An output gradient: random, seeded, in the dtype the op and its baseline see."""
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def with_grads(fn, tensors_, grad):
    """``fn(*tensors_)`` and the gradients of every tensor for the output gradient ``grad``;
    leaves keep their layout, so the backward meets the strides the forward met."""
    leaves = [t.detach().requires_grad_() for t in tensors_]
    out = fn(*leaves)
    if not out.requires_grad:   # an empty output that depends on no input: zero gradients
        return out.detach(), [torch.zeros_like(t) for t in leaves]
    grads = torch.autograd.grad(out, leaves, grad.to(out.dtype), allow_unused=True)
    return out.detach(), [torch.zeros_like(t) if g is None else g for t, g in zip(leaves, grads)]


def baseline_with_grads(fn, tensors_, grad):
    """torch's op as the harness runs the library baseline (:func:`workbench.check.judge`): on
    the tensors, on copies in the other memory order and on contiguous copies (the layout a
    caller usually passes; torch may take another kernel for a drawn layout: SDPA's CPU math
    path for a strided one, more precise in fp16 than its flash kernel for contiguous ones).
    Returns the outputs and, per tensor, its gradients, for :func:`assert_rule`."""
    layouts = (tensors_, [other_memory_order(t) for t in tensors_], [t.contiguous() for t in tensors_])
    runs = [with_grads(fn, ts, grad) for ts in layouts]
    return tuple(out for out, _ in runs), list(zip(*(grads for _, grads in runs)))


def rounding_spread(run, tensors_, numel: int, seed: int = 0) -> dict:
    """torch's errors on rounding neighbours of ``tensors_`` (:func:`workbench.check.rounding_neighbour`,
    as many as :func:`workbench.check.judge` samples for an output of ``numel`` elements):
    ``run(near)`` gives torch's and the float64 reference's named results on the inputs
    ``near`` (two dicts); returns each name's errors, for :func:`assert_rule`'s ``spread``.
    One sample of torch's error can be luckily small where a result cancels (a router
    gradient that is zero in exact arithmetic): the harness samples more, and so does the fuzz."""
    gen, spread = torch.Generator().manual_seed(seed), {}
    for _ in range(neighbours(numel)):
        base, ref = run(rounding_neighbour(tuple(tensors_), gen))
        for name in base:
            spread.setdefault(name, []).append(relative_error(base[name], ref[name])[0])
    return spread


def judged_baseline(fn, reference, tensors_, grad, also=()):
    """torch's op as :func:`workbench.check.judge` takes the library baseline: the memory
    orders of :func:`baseline_with_grads`, and the errors on rounding neighbours of the tensors
    against ``reference`` (float64) on each neighbour (:func:`rounding_spread`). ``also``:
    other ways torch computes the op, each run on the tensors as one more sample (a sample
    that is NaN where the reference is finite counts as no error, so a torch kernel's NaN
    alone would leave the bound at the dtype's floor). Returns (outputs, per tensor its
    gradients, spread), spread["out"] and spread[i] (tensor i's gradient) the errors for
    :func:`assert_rule`."""
    outs, grads = baseline_with_grads(fn, tensors_, grad)
    for other in also:
        out, other_grads = with_grads(other, tensors_, grad)
        outs, grads = (*outs, out), [(*g, extra) for g, extra in zip(grads, other_grads)]

    def run(near):
        (out, near_grads), (ref, ref_grads) = (with_grads(fn, near, grad), with_grads(
            reference, [t.double() for t in near], grad.double()))
        return {"out": out, **dict(enumerate(near_grads))}, {"out": ref, **dict(enumerate(ref_grads))}
    return outs, grads, rounding_spread(run, tensors_, outs[0].numel())


def assert_rule(name: str, got, reference, baseline, dtype, direction: str = "forward", spread=(),
                floor: float = 0.0) -> None:
    """The harness's rule (``workbench.check.compare``): shape, dtype, error bound, NaN/inf.
    ``baseline`` is torch's result, or several (:func:`baseline_with_grads`); ``spread`` its
    errors on other inputs (:func:`rounding_spread`). ``floor``: an absolute error any finite
    element may have, whatever its error relative to the result's largest: the caller's bound
    on what the op's float32 accumulation leaves in this result (the attention fuzz's
    ``_delta_floor``). A result small against that (zero in exact arithmetic, or cancelling)
    carries the noise whatever its own size, and the rule, relative to the result's own
    largest element, would take it for an error."""
    first = baseline if isinstance(baseline, torch.Tensor) else baseline[0]
    assert tuple(got.shape) == tuple(first.shape), (f"{name}: shape {tuple(got.shape)}, "
                                                    f"torch gives {tuple(first.shape)}")
    assert got.dtype == first.dtype, f"{name}: dtype {got.dtype}, torch gives {first.dtype}"
    if floor:
        got = got.detach()
        within = (got.double() - reference).abs() <= floor   # False wherever either is NaN or inf
        got = torch.where(within, reference.to(got.dtype), got)
    fields = compare(got, reference, baseline, dtype, direction, other_errors=spread)
    assert fields["passed"], f"{name} ({direction}, {dtype}): {broken_rules(fields)}"


def assert_runs_in_child(code: str, timeout: float = 240.0) -> None:
    """Run ``code`` in a fresh interpreter-backend Python and require exit 0: an input that
    makes a kernel touch memory out of bounds kills that child (abort, SIGBUS), not the run."""
    env = {**os.environ, "KERNELS_BACKEND": "interpreter"}
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, timeout=timeout,
                            capture_output=True, text=True)
    assert result.returncode == 0, (f"child exited with {result.returncode} (a signal if negative)"
                                    f"\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}")
