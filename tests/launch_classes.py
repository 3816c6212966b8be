"""What Triton's JIT specializes a launch into, per argument: for a call recorded under the
interpreter and for the ahead-of-time launch an ISA page compiles (``rung.aot()``).

The JIT compiles one binary per class of arguments: an int equal to 1 becomes a constant,
one divisible by 16 (0 too) and a 16-byte aligned pointer get ``tt.divisibility``, a
tensor under 2 GB on AMD ``tt.pointer_range = 32``, and each constexpr its value. The
classes are Triton's own, asked through its launch path (``JITFunction.warmup`` for a
target set by a stand-in driver, stopped by ``jit_cache_hook`` before it compiles), never
a copy of its rule: an ISA page describes the binary a call runs only where the two agree.
"""
from __future__ import annotations

import contextlib
import inspect

from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.runtime import driver
from triton.runtime.interpreter import InterpretedFunction

from workbench.isa import compile as isa_compile

GFX942 = GPUTarget("hip", "gfx942", 64)


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


def jit_launch(fn, args: list, target: GPUTarget, monkeypatch, options: dict | None = None) -> dict:
    """Signature, constexprs and attributes the JIT derives for launching ``fn`` (a
    ``@triton.jit`` kernel, interpreted or not) with ``args`` in argument order."""
    jit_fn = isa_compile._Rebuilder().jit(fn)
    seen = {}

    def stop_before_compiling(**hook):
        seen.update(hook["compile"])
        return True

    with monkeypatch.context() as patch:
        patch.setattr(driver, "_active", _StandInDriver(target))
        patch.setattr(knobs.runtime, "jit_cache_hook", stop_before_compiling)
        jit_fn.warmup(*args, grid=(1,), **(options or {}))
    names = list(jit_fn.arg_names)
    return {"signature": seen["signature"],
            "constexprs": {names[path[0]]: value for path, value in seen["constants"].items()},
            "attrs": seen["configs"][0]}


def aot_jit_launch(aot, target: GPUTarget, monkeypatch) -> dict:
    """:func:`jit_launch` for a typical call of an AOT launch (:func:`isa_compile.stand_in_args`)."""
    jit_fn = isa_compile._Rebuilder().jit(aot.jit_fn)
    return jit_launch(aot.jit_fn, isa_compile.stand_in_args(jit_fn, aot), target, monkeypatch, aot.options)


def classes(launch: dict) -> dict[str, tuple]:
    """Per argument name: ("constexpr", value), or its type and attributes (("i32", ()),
    ("*bf16", (("tt.divisibility", 16), ("tt.pointer_range", 32))), ...)."""
    out = {}
    for i, (name, kind) in enumerate(launch["signature"].items()):
        if kind == "constexpr":
            out[name] = ("constexpr", launch["constexprs"][name])
        else:
            out[name] = (kind, tuple(tuple(a) for a in launch["attrs"].get((i,), ())))
    return out


@contextlib.contextmanager
def recorded_launches(monkeypatch, stub: bool = False):
    """Every interpreted kernel launch inside the block, as (kernel, its arguments in order,
    defaults filled in), run as usual unless ``stub``."""
    launches = []
    run = InterpretedFunction.run

    def recording_run(self, *args, grid, warmup, **kwargs):
        named = dict(zip(self.arg_names, args))
        named.update({k: v for k, v in kwargs.items() if k in self.arg_names})
        params = inspect.signature(self.fn).parameters.values()
        launches.append((self, [named[p.name] if p.name in named else p.default for p in params]))
        if not stub:
            return run(self, *args, grid=grid, warmup=warmup, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(InterpretedFunction, "run", recording_run)
        yield launches


def differences(recorded: tuple, aot, monkeypatch, chosen=(), target: GPUTarget = GFX942) -> dict[str, tuple]:
    """Arguments whose class differs between a recorded launch (:func:`recorded_launches`)
    and the AOT launch ``aot`` of the same kernel: name -> (call's, AOT's). ``chosen`` names
    arguments chosen per target (tiles, the schedule of a machine's programs,
    interpreter-only flags), skipped."""
    fn, args = recorded
    assert aot.jit_fn is fn, (aot.jit_fn, fn)
    call = classes(jit_launch(fn, args, target, monkeypatch))
    compiled = classes(aot_jit_launch(aot, target, monkeypatch))
    assert call.keys() == compiled.keys()
    return {name: (call[name], compiled[name]) for name in call
            if name not in chosen and call[name] != compiled[name]}
