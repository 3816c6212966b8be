"""The ahead-of-time compile specializes arguments as Triton's JIT does at launch.

On ROCm the JIT marks tensors under 2 GB with ``tt.pointer_range = 32`` (buffer loads),
besides the divisibility hints every backend gets; an AOT compile without them shows
another binary. Here the JIT's own launch path (``JITFunction.warmup`` for a target
set by a stand-in driver, stopped by ``jit_cache_hook`` before it compiles) says what
it would compile, and the inspector's compile must have used exactly that.
"""
from __future__ import annotations

import pytest
import torch
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.runtime import driver

import kernels
from workbench import isa
from workbench.isa import compile as isa_compile

CASES = [("gemm", "v2"), ("attention", "v4")]


class _StandInDriver:
    """What ``JITFunction.run`` asks the active driver before it compiles, for one target."""

    def __init__(self, target: GPUTarget):
        self.target = target

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        return 0

    def get_current_stream(self, device):
        return 0


def _jit_launch(aot, target: GPUTarget, monkeypatch) -> dict:
    """Signature, constexprs and attributes the JIT derives for a typical call of ``aot``."""
    jit_fn = isa_compile._Rebuilder().jit(aot.jit_fn)
    seen = {}

    def stop_before_compiling(**hook):
        seen.update(hook["compile"])
        return True

    monkeypatch.setattr(driver, "_active", _StandInDriver(target))
    monkeypatch.setattr(knobs.runtime, "jit_cache_hook", stop_before_compiling)
    jit_fn.warmup(*isa_compile.stand_in_args(jit_fn, aot), grid=(1,), **aot.options)
    names = list(jit_fn.arg_names)
    return {"signature": seen["signature"],
            "constexprs": {names[path[0]]: value for path, value in seen["constants"].items()},
            "attrs": seen["configs"][0]}


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
        jit = _jit_launch(aot, GPUTarget(backend, arch, warp), monkeypatch)
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
