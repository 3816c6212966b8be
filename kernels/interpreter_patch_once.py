"""The Triton interpreter, made to patch ``triton.language`` once per launch instead of once
per device-function call.

Under ``TRITON_INTERPRET=1`` a launch swaps every builtin of ``triton.language`` (and of
``tl.core``, ``tl.math``, the tensor class) for a NumPy-backed version, runs the grid, and
swaps them back. Triton 3.9 also redoes the whole swap at *every call of a*
``@triton.jit`` *helper* inside the kernel (``InterpretedFunction.__call__`` calls
``_patch_lang``, and drops what it returns), though the launch has already swapped the same
modules: ``inspect.getmembers`` over the language modules and hundreds of ``setattr`` per
call, for every program of the grid. In the MoE and grouped GEMM rungs, whose kernels call
helpers (the tile schedule, ``tl.cdiv``, ``tl.cumsum``, ...) in every program, that was 43 %
of a CPU check's time under cProfile, and measured here without it, one thread, on and off
alternated in one process: ``check_rung`` of moe v2 in its three dtypes, 3.3-3.6 s -> 2.1-2.3 s.

:func:`install` keeps the launch's swap and skips a helper's when the modules it would
swap (``tl`` and/or ``tl.core``, found in the helper's globals as Triton finds them) are
already swapped by the running launch; any other call (a module the launch did not swap,
a helper called outside any launch) goes to Triton's own ``_patch_lang`` unchanged. What
runs is the same: every swap sets a module attribute to a wrapper of the same builtin,
built from nothing but the module (``_patch_lang`` reads nothing else of the helper).
``tests/test_interpreter_patch_once.py`` checks the outputs are bitwise those of Triton's own
path on kernels that call helpers, and how many swaps a launch does.

Installed by :mod:`kernels.registry` when the interpreter runs the kernels, and only where
Triton's interpreter has the shape this was written against (the two functions below, and a
device call that goes through ``_patch_lang``); otherwise Triton runs as it is.
"""
from __future__ import annotations

import functools

_state = {"launching": False, "swapped": None}   # swapped: ids of the modules the launch swapped
_original: dict = {}


class _AlreadySwapped:
    """What a helper's call gets when the launch has swapped its modules: nothing to undo."""

    def restore(self) -> None:
        pass


def _languages(fn, tl) -> set[int]:
    return {id(value) for value in fn.__globals__.values() if value is tl or value is tl.core}


def _applies(interpreter) -> bool:
    device_call = getattr(getattr(interpreter, "InterpretedFunction", None), "__call__", None)
    return (callable(getattr(interpreter, "_patch_lang", None))
            and callable(getattr(getattr(interpreter, "GridExecutor", None), "__call__", None))
            and "_patch_lang" in getattr(getattr(device_call, "__code__", None), "co_names", ()))


def install() -> bool:
    """Patch the interpreter (idempotent); False where its shape is not the expected one."""
    import triton.language as tl
    import triton.runtime.interpreter as interpreter

    if _original:
        return True
    if not _applies(interpreter):
        return False
    patch_lang, launch = interpreter._patch_lang, interpreter.GridExecutor.__call__

    def patch_once(fn):
        if _state["launching"]:           # the launch's own swap: Triton's, remembered
            _state["launching"] = False
            _state["swapped"] = _languages(fn, tl)
            return patch_lang(fn)
        swapped = _state["swapped"]
        if swapped is not None:
            languages = _languages(fn, tl)
            if languages <= swapped:
                return _AlreadySwapped()
            swapped |= languages
        return patch_lang(fn)

    @functools.wraps(launch)
    def launch_patching_once(self, *args, **kwargs):
        _state["launching"], _state["swapped"] = True, None
        try:
            return launch(self, *args, **kwargs)
        finally:
            _state["launching"], _state["swapped"] = False, None

    _original.update(patch_lang=patch_lang, launch=launch)
    interpreter._patch_lang = patch_once
    interpreter.GridExecutor.__call__ = launch_patching_once
    return True


def uninstall() -> None:
    """Triton's own interpreter again (the tests compare the two)."""
    import triton.runtime.interpreter as interpreter

    if _original:
        interpreter._patch_lang = _original.pop("patch_lang")
        interpreter.GridExecutor.__call__ = _original.pop("launch")


def installed() -> bool:
    return bool(_original)
