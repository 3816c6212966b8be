"""The interpreter patched once per launch (:mod:`kernels.interpreter_patch_once`): the same
bits as Triton's own interpreter, a number of language swaps per launch that does not grow
with the grid, and Triton's behaviour wherever no launch is running."""
from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
import triton.runtime.interpreter as interpreter

import kernels
from kernels import interpreter_patch_once
from kernels.moe.grouped_gemm import spec as grouped_spec


@triton.jit
def _scaled(x, factor):
    return x * factor + tl.cdiv(factor, 2)


@triton.jit
def _helper_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, _scaled(_scaled(x, 3), 5) + tl.cumsum(x, 0), mask=mask)


def _run(programs: int) -> torch.Tensor:
    x = torch.arange(programs * 8, dtype=torch.float32) / 7
    out = torch.full_like(x, float("nan"))
    _helper_kernel[(programs,)](x, out, x.numel(), BLOCK=8)
    return out


@pytest.fixture
def both_ways():
    """Yields a function running ``fn`` with the patch installed and with Triton's own path."""
    assert kernels.backend.current().is_interpreter
    kernels.get("gemm", "v0")   # loading a ladder installs it on the interpreter
    assert interpreter_patch_once.installed()

    def run(fn):
        interpreter_patch_once.uninstall()
        try:
            own = fn()
        finally:
            assert interpreter_patch_once.install()
        return fn(), own
    yield run
    assert interpreter_patch_once.installed()


@pytest.fixture
def swaps(monkeypatch):
    """Counts the language swaps Triton's ``_patch_lang`` makes (one per module it swaps)."""
    count = [0]
    core = interpreter._patch_lang_core

    def counting(*args, **kwargs):
        count[0] += 1
        return core(*args, **kwargs)
    monkeypatch.setattr(interpreter, "_patch_lang_core", counting)
    return count


def test_a_launch_swaps_the_language_a_fixed_number_of_times(both_ways, swaps):
    """Triton swaps at every helper call of every program; patched, a launch swaps for the
    kernel, and again only for a helper whose module holds a language module the kernel's does
    not (``tl.cdiv``'s holds ``tl.core``)."""
    counts = {}
    for programs in (1, 4):
        def counted():
            swaps[0] = 0
            _run(programs)
            return swaps[0]
        counts[programs] = both_ways(counted)
    (once_1, own_1), (once_4, own_4) = counts[1], counts[4]
    assert once_1 == once_4 < own_1 < own_4


def test_outputs_are_bitwise_tritons_own(both_ways):
    """A kernel calling helpers, then two rungs whose kernels call helpers in every program
    (the grouped GEMM's device-side schedule, the MoE layer's fused kernels)."""
    patched, own = both_ways(lambda: _run(5))
    assert not patched.isnan().any() and torch.equal(patched, own)

    grouped = kernels.get("grouped_gemm", "v4")
    inputs = grouped_spec.make_inputs((45, 24, 19, 5, 1), dtype=torch.float32, seed=3)
    patched, own = both_ways(lambda: grouped(*inputs))
    assert torch.equal(patched, own)

    moe = kernels.get("moe", "v3")
    from kernels.moe.layer_ladder import spec as moe_spec
    inputs = moe_spec.make_inputs((21, 24, 17, 5, 2, 1), dtype=torch.float32, seed=4)
    patched, own = both_ways(lambda: moe(*inputs))
    assert torch.equal(patched, own)


def test_a_failing_launch_leaves_the_next_one_patched_as_usual(both_ways):
    with pytest.raises(Exception):
        _helper_kernel[(1,)](torch.zeros(8), torch.zeros(8), 8, BLOCK=6)   # not a power of 2
    patched, own = both_ways(lambda: _run(3))
    assert torch.equal(patched, own)


def test_a_helper_called_outside_a_launch_runs_as_triton_runs_it(both_ways, swaps):
    """No launch running: the helper's call swaps the language as Triton's own does."""
    def outside():
        swaps[0] = 0
        return _scaled(torch.arange(3.0), 3), swaps[0]
    (patched, patched_swaps), (own, own_swaps) = both_ways(outside)
    assert torch.equal(patched, own) and patched_swaps == own_swaps > 0
