"""The Triton kernels a callable launches, as the ISA inspector needs them.

A package rung declares its launches (``Rung.aot``); a graded file declares nothing, so
its launches are recorded: while the callable runs, each ``run`` of a Triton kernel
(interpreted or JIT-compiled) is noted with its arguments split as Triton splits them
(pointers and scalars typed by Triton's own rule, ``tl.constexpr`` parameters by value,
launch options such as ``num_warps`` and the AMD knobs apart, the grid as ints). With ``stub`` the launch
is skipped, so a GPU-sized shape is recorded in the time of its host code alone.
The record shows the config the host code picks on this backend: a file that picks tiles
by backend (as the package's rungs do for the interpreter) is compiled with those. The
constexpr ``INTERP_BF16`` (:mod:`kernels.triton_support`'s interpreter-only bf16
workaround) is compiled False, as a GPU launch has it.

The record is plain data; :func:`aot_kernels` turns it back into
:class:`~kernels.registry.AotKernel` objects in a process where the file is imported
afresh, for :func:`workbench.isa.compile.compile_aot`.
"""
from __future__ import annotations

import importlib
import inspect
from contextlib import contextmanager

INTERPRETER_ONLY = "INTERP_BF16"


def _grid(grid, values: dict) -> tuple[int, ...] | None:
    """The launch's grid as ints (a callable grid is called as Triton calls it: with the
    arguments by name); None when it cannot be read."""
    try:
        found = grid(values) if callable(grid) else grid
        found = tuple(int(g) for g in (found if isinstance(found, (tuple, list)) else (found,)))
    except Exception:   # a grid the host code computes in a way we cannot replay: not recorded
        return None
    return found + (1,) * (3 - len(found))


def _describe(kernel, args: tuple, kwargs: dict, grid=None) -> dict:
    from triton.runtime.jit import _normalize_ty, mangle_type

    fn = kernel.fn
    params = inspect.signature(fn).parameters
    values = {name: p.default for name, p in params.items() if p.default is not inspect.Parameter.empty}
    values.update(zip(params, args))
    values.update({k: v for k, v in kwargs.items() if k in params})
    annotations = {name: _normalize_ty(ty) for name, ty in inspect.get_annotations(fn).items()}
    signature, constexprs, scalars = {}, {}, {}
    for name in params:
        value = values.get(name)
        kind = "constexpr" if annotations.get(name) == "constexpr" else mangle_type(value)
        signature[name] = kind
        if kind == "constexpr":
            # kernels.triton_support's interpreter-only bf16 workaround: a GPU compiles it off
            constexprs[name] = False if name == INTERPRETER_ONLY else value
        elif not kind.startswith("*"):
            scalars[name] = value
    return {"module": fn.__module__, "qualname": fn.__qualname__, "signature": signature,
            "constexprs": constexprs, "scalars": scalars, "grid": _grid(grid, values),
            "options": {k: v for k, v in kwargs.items() if k not in params}}


@contextmanager
def recorded(stub: bool = False):
    """Yields the list of launch records (the last launch of each kernel, in first-launch
    order: an autotuner's trial launches give way to the config it keeps)."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    launches: dict[tuple, dict] = {}
    originals = {cls: cls.run for cls in (InterpretedFunction, JITFunction)}

    def recording(original):
        def run(self, *args, grid, warmup, **kwargs):
            if not warmup:
                record = _describe(self, args, kwargs, grid)
                launches[(record["module"], record["qualname"])] = record
            if stub and not warmup:
                return None
            return original(self, *args, grid=grid, warmup=warmup, **kwargs)
        return run

    out: list[dict] = []
    try:
        for cls, original in originals.items():
            cls.run = recording(original)
        yield out
    finally:
        for cls, original in originals.items():
            cls.run = original
        out.extend(launches.values())


def aot_kernels(records: list[dict], modules: dict):
    """``AotKernel`` objects for the records; ``modules`` maps a recorded module name to the
    module to find the kernel in (the file imported afresh under another name). A kernel
    defined inside a function has no name to import it by: its entry is the reason."""
    from kernels.registry import AotKernel

    kernels = []
    for record in records:
        where = f"{record['module']}.{record['qualname']}"
        if "<locals>" in record["qualname"]:
            kernels.append(f"{where}: defined inside a function, so it cannot be imported to "
                           f"compile; define the @triton.jit kernel at module level")
            continue
        owner = modules.get(record["module"]) or importlib.import_module(record["module"])
        jit_fn = owner
        for part in record["qualname"].split("."):
            jit_fn = getattr(jit_fn, part)
        kernels.append(AotKernel(jit_fn, record["signature"], record["constexprs"],
                                 record["options"], record["scalars"]))
    return kernels
