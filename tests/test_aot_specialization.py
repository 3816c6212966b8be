"""The ahead-of-time compile specializes arguments as Triton's JIT does at launch.

On ROCm the JIT marks tensors under 2 GB with ``tt.pointer_range = 32`` (buffer loads),
besides the divisibility hints every backend gets; an AOT compile without them shows
another binary. Here the JIT's own launch path (:mod:`launch_classes`) says what it
would compile, and the inspector's compile must have used exactly that. That each
launch's classes are a real call's: tests/test_aot_matches_calls.py.
"""
from __future__ import annotations

import pytest
import torch
from triton.backends.compiler import GPUTarget

import kernels
from launch_classes import aot_jit_launch
from workbench import isa
from workbench.isa import compile as isa_compile

CASES = [("gemm", "v2"), ("attention", "v4")]


@pytest.mark.parametrize("target", ["gfx942", "sm90"])
@pytest.mark.parametrize("op,label", CASES)
def test_the_aot_compile_specializes_as_the_jit_launch(op, label, target, monkeypatch):
    backend, arch, warp = isa.TARGETS[target]
    rung = kernels.get(op, label)
    dtype = isa.default_dtype(rung, target)
    launches = rung.aot(dtype, backend, arch if backend == "hip" else f"sm_{arch}")
    compiled = isa_compile.compile_rung(op, label, isa.TARGETS[target], str(dtype).removeprefix("torch."))
    assert len(compiled) == len(launches)
    for aot, kernel in zip(launches, compiled):
        jit = aot_jit_launch(aot, GPUTarget(backend, arch, warp), monkeypatch)
        assert jit["signature"] == aot.signature
        assert jit["constexprs"] == aot.constexprs
        assert kernel["attrs"] == jit["attrs"]
        pointers = [(i,) for i, kind in enumerate(aot.signature.values()) if kind.startswith("*")]
        ranged = [path for path, attrs in kernel["attrs"].items() if ["tt.pointer_range", 32] in attrs]
        assert ranged == (pointers if backend == "hip" else [])


@pytest.mark.parametrize("op,label", CASES)
def test_gfx942_loads_global_memory_with_buffer_loads(op, label):
    """The proof that ``tt.pointer_range`` took: no ``global_load`` is left, only ``buffer_load``."""
    for report in isa.inspect_all(op, label, "gfx942"):
        assert report.global_loads and all(name.startswith("buffer_load") for name in report.global_loads), \
            report.global_loads
