"""Ahead-of-time compilation of a rung's Triton kernels, in a helper process.

Why a helper process: on a CPU-only machine the kernels are Triton interpreter
functions, and once any of them has *run*, Triton's interpreter leaves
``triton.language`` patched with its own builtins (a device-function call patches
the language and never restores it; triton 3.9). ``triton.compile`` in that process
then fails. A helper process that only imports the kernels and compiles them is
always clean, whatever the notebook did before. It is started once and reused.

Why a rebuild: ``triton.compile`` needs ``JITFunction`` objects, but under the
interpreter ``@triton.jit`` produces ``InterpretedFunction`` objects, including
``tl.max``/``tl.cdiv`` and the other jit helpers of ``triton.language``. We rebuild
the kernel as a ``JITFunction`` over a copy of its globals in which every interpreted
function, and every module holding some, is replaced by its rebuilt twin. The source
text and line numbers stay those of the original file. On a GPU backend the kernels
already are ``JITFunction`` objects and are compiled as they are.
"""
from __future__ import annotations

import dataclasses
import os
import pickle
import re
import signal
import subprocess
import sys
import threading
import traceback
import types
import warnings
from pathlib import Path

_worker: subprocess.Popen | None = None
_lock = threading.Lock()


def compile_rung(op: str, label: str, target: tuple, dtype_name: str,
                 overrides: dict | None = None, source: str | None = None, launch: int | None = None) -> list[dict]:
    """Compile every kernel a rung launches, in the helper process (started on first use);
    ``overrides`` goes to the rung's ``aot`` (settings replaced, e.g. ``{"num_warps": 4}``).
    ``source``, a file's path, compiles the rung that file declares (a learner's edited copy)
    instead of the package's. ``launch``: only that one of the ``aot``'s launches (a list of one)."""
    global _worker
    with _lock:
        if _worker is None or _worker.poll() is not None:
            _worker = _start_worker()
        pickle.dump((op, label, target, dtype_name, overrides, source, launch), _worker.stdin)
        _worker.stdin.flush()
        try:
            status, value = pickle.load(_worker.stdout)
        except EOFError:
            _worker = None
            raise RuntimeError("the ISA compile helper process died; its error is on stderr") from None
    if status == "error":
        raise RuntimeError(f"compiling {op} {label} for {target[1]} failed:\n{value}")
    return value


def stop() -> None:
    """End the helper; the next compile starts a fresh one that re-imports the kernels."""
    global _worker
    with _lock:
        if _worker is not None:
            _worker.stdin.close()  # the helper returns on end of input
            _worker.wait()
            _worker = None


def _start_worker() -> subprocess.Popen:
    """A plain subprocess, not multiprocessing: spawn would re-run an unguarded __main__ script."""
    root = str(Path(__file__).resolve().parents[2])
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    return subprocess.Popen([sys.executable, "-c", "from workbench.isa.compile import serve; serve()"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": path})


def serve() -> None:
    """Helper loop: a pickled request on stdin -> a pickled ("ok"|"error", value) reply."""
    # The parent's Ctrl-C (or a notebook kernel's shutdown) reaches the whole process group;
    # the helper ends when its input closes, so it leaves the interrupt to the parent.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # stray prints from compilers go to stderr, never into the reply stream
    while True:
        try:
            request = pickle.load(sys.stdin.buffer)
        except EOFError:
            return
        try:
            reply = ("ok", _compile_here(*request))
        except Exception:  # noqa: BLE001 - any failure is reported to the caller, with its traceback
            reply = ("error", traceback.format_exc(limit=-3))
        pickle.dump(reply, replies)
        replies.flush()


def _compile_here(op: str, label: str, target: tuple, dtype_name: str,
                  overrides: dict | None = None, source: str | None = None, launch: int | None = None) -> list[dict]:
    """Runs in the helper: returns plain data (text, bytes, numbers) for each kernel compiled."""
    import torch

    rung = _rung(op, label, source)
    backend = target[0]
    arch = target[1] if backend == "hip" else f"sm_{target[1]}"
    extra = {"overrides": overrides} if overrides else {}  # rungs without settings take none
    launches = rung.aot(getattr(torch, dtype_name), backend, arch, **extra)
    return [compile_aot(aot, target) for aot in (launches if launch is None else [launches[launch]])]


def compile_aot(aot, target: tuple) -> dict:
    """One :class:`~kernels.registry.AotKernel` compiled for ``target`` (GPUTarget's
    arguments), as plain data. Call it only in a process where no interpreted kernel has
    run (see the module docstring): the helper, or a fresh process of its own (a graded
    file's kernels, the FP8 quantize kernel, which is not a rung)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    gpu_target = GPUTarget(*target)
    accepted = _option_fields(gpu_target.backend)
    options = {k: v for k, v in aot.options.items() if k in accepted}
    jit_fn = _Rebuilder().jit(aot.jit_fn)
    attrs = launch_attrs(jit_fn, aot, gpu_target)
    source = ASTSource(jit_fn, aot.signature, aot.constexprs, attrs)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="TRITON_DEFAULT_FP_FUSION")
        kernel = triton.compile(source, target=gpu_target, options=options)
    text_key, binary_key = ("amdgcn", "hsaco") if gpu_target.backend == "hip" else ("ptx", "cubin")
    return {
        "name": kernel.metadata.name,
        "asm": kernel.asm[text_key],
        "binary": kernel.asm[binary_key],
        "shared": kernel.metadata.shared,
        "num_warps": kernel.metadata.num_warps,
        "options": options,
        "attrs": attrs,
        "dropped_options": sorted(set(aot.options) - accepted),
        "llvm_attributes": amdgpu_attributes(kernel.asm.get("llir", "")),
    }


def amdgpu_attributes(llir: str) -> dict[str, str]:
    """The ``"amdgpu-*"`` function attributes of the LLVM IR: the AMD knobs as LLVM receives
    them (``waves_per_eu=2`` arrives as ``"amdgpu-waves-per-eu"="2,2"``), which the
    assembly no longer shows."""
    return dict(re.findall(r'"(amdgpu-[\w-]+)"="([^"]*)"', llir))


def _rung(op: str, label: str, source: str | None):
    """The package's rung, or the one the file ``source`` declares (imported afresh, so an
    edit is seen; its rungs are captured, never added to the package's ladder)."""
    import kernels

    if source is None:
        return kernels.get(op, label)
    from ..harness.kernel_file import import_file

    _, captured = import_file(Path(source), op)
    found = [r for r in captured if r.op == op and r.label == label]
    if not found:
        raise ValueError(f"{source} declares no {op} {label} rung")
    return found[0]


def launch_attrs(jit_fn, aot, target) -> dict:
    """The per-argument attributes Triton's JIT gives a typical launch of ``aot`` on ``target``.

    The JIT specializes each argument at launch: a pointer 16-byte aligned (torch
    allocations always are) or an int divisible by 16 gets ``tt.divisibility``, and on
    AMD a tensor under 2 GB gets ``tt.pointer_range = 32``, which turns its global
    loads into ``buffer_load`` and changes the register count. Without the same
    attributes an ahead-of-time compile describes another binary. So the rule is
    Triton's own, asked here: its launch binder runs on stand-in arguments
    (:func:`stand_in_args`) for the target's backend, and the specialization becomes
    attributes as ``JITFunction.run`` makes them.
    """
    from triton._utils import find_paths_if, get_iterable_path
    from triton.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    backend = make_backend(target)
    binder = create_function_from_signature(jit_fn.signature, jit_fn.params, backend)
    _, specialization, _ = binder(*stand_in_args(jit_fn, aot))
    values = ["" if kind == "constexpr" else value for kind, value in specialization]
    return {path: backend.parse_attr(get_iterable_path(values, path))
            for path in find_paths_if(values, lambda _, value: isinstance(value, str))}


def stand_in_args(jit_fn, aot) -> list:
    """A typical call of ``aot``'s launch, in argument order: Triton's own stand-in tensor
    (``MockTensor``: aligned, under 2 GB) for each pointer, the launch's values for the rest.
    ``MockTensor`` takes the signature's type name as its dtype: Triton reads a dtype by name."""
    from triton.runtime.jit import MockTensor

    def value(name: str):
        kind = aot.signature[name]
        if kind == "constexpr":
            return aot.constexprs[name]
        return MockTensor(kind[1:]) if kind.startswith("*") else aot.scalars[name]

    return [value(name) for name in jit_fn.arg_names]


def _option_fields(backend: str) -> set[str]:
    """Option names the backend's compiler accepts (AMD knobs are not CUDA options)."""
    if backend == "hip":
        from triton.backends.amd.compiler import HIPOptions as options_class
    else:
        from triton.backends.nvidia.compiler import CUDAOptions as options_class
    return {f.name for f in dataclasses.fields(options_class)}


class _Rebuilder:
    """Turns interpreter functions back into compilable ``JITFunction`` objects.

    One instance per compile: the copies of module globals it makes are snapshots,
    so a reloaded module is never served from a stale copy.
    """

    def __init__(self):
        self._done: dict[int, tuple[object, object]] = {}  # id(original) -> (original, copy)

    def jit(self, fn):
        from triton.runtime.autotuner import Autotuner, Heuristics
        from triton.runtime.interpreter import InterpretedFunction
        from triton.runtime.jit import JITFunction

        while isinstance(fn, (Autotuner, Heuristics)):  # the aot options already fix the config
            fn = fn.fn
        if isinstance(fn, JITFunction):
            return fn
        if not isinstance(fn, InterpretedFunction):
            raise TypeError(f"aot() must return a @triton.jit function, got {type(fn).__name__}")
        if id(fn) in self._done:
            return self._done[id(fn)][1]
        python_fn = fn.fn
        scope = self._module(python_fn.__globals__).__dict__
        copy = types.FunctionType(python_fn.__code__, scope, python_fn.__name__,
                                  python_fn.__defaults__, python_fn.__closure__)
        copy.__qualname__ = python_fn.__qualname__
        copy.__kwdefaults__ = python_fn.__kwdefaults__
        copy.__doc__ = python_fn.__doc__
        copy.__annotations__ = python_fn.__annotations__  # tl.constexpr parameters stay constexpr
        # The jit arguments (do_not_specialize, ...): Triton 3.5+ also keeps them as fn.kwargs,
        # 3.4 only on the rewriter.
        rebuilt = JITFunction(copy, **fn.rewriter.kwargs)
        self._done[id(fn)] = (fn, rebuilt)
        return rebuilt

    def _module(self, names: dict) -> types.ModuleType:
        """A stand-in module whose dict is ``names`` with interpreted functions rebuilt."""
        if id(names) not in self._done:
            module = types.ModuleType(names.get("__name__", "rebuilt"))
            self._done[id(names)] = (names, module)  # before filling: modules refer to each other
            module.__dict__.update({k: self._value(v) for k, v in names.items()})
        return self._done[id(names)][1]

    def _value(self, value):
        from triton.runtime.interpreter import InterpretedFunction

        if isinstance(value, InterpretedFunction):
            return self.jit(value)
        if isinstance(value, types.ModuleType) and any(
                isinstance(v, InterpretedFunction) for v in vars(value).values()):
            return self._module(vars(value))
        return value
