"""Where kernels run: decided once, at import, before any kernel is defined.

Triton reads ``TRITON_INTERPRET`` when a ``@triton.jit`` function is *defined*, and
Numba reads ``NUMBA_ENABLE_CUDASIM`` when ``numba.cuda`` is first imported. Both
must therefore be set before any kernel module is imported. This module is the first
thing ``import kernels`` runs, and it sets them on a machine without a GPU, so a
user never has to export anything by hand.

Choosing the backend:

* automatic: ``hip`` when torch is a ROCm build and sees a GPU, ``cuda`` when it
  sees an NVIDIA GPU, else ``interpreter``;
* forced: ``KERNELS_BACKEND=interpreter`` (or ``hip``/``cuda``) in the environment
  before import, or :func:`force_interpreter` before the first kernel is loaded.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

BACKENDS = ("hip", "cuda", "interpreter")
_ENV_VAR = "KERNELS_BACKEND"


@dataclass(frozen=True)
class Backend:
    """The machine the kernels run on, as the rest of the project sees it."""

    name: str            # "hip" | "cuda" | "interpreter"
    arch: str            # "gfx942", "gfx950", "sm_90", ... or "cpu"
    device_name: str     # torch's name for the GPU, or "CPU (Triton interpreter)"
    compute_units: int   # CUs on AMD, SMs on NVIDIA, 0 on the interpreter
    # Derived once, as plain attributes: every op call reads them (the device check of each
    # tensor, a launch plan's key), where a property or the dataclass hash would be a Python
    # call each time. Kept on the backend, not in a module-level cache, so torch.compile
    # traces and guards them as it does the backend's other fields.
    device: str = field(init=False, compare=False)   # torch's device type (ROCm's is "cuda")
    key: tuple = field(init=False, compare=False)    # the fields above, as a plan key's first item

    def __post_init__(self):
        object.__setattr__(self, "device", "cpu" if self.name == "interpreter" else "cuda")
        object.__setattr__(self, "key", (self.name, self.arch, self.device_name, self.compute_units))

    @property
    def is_interpreter(self) -> bool:
        return self.name == "interpreter"

    @property
    def is_gpu(self) -> bool:
        return not self.is_interpreter


def _interpreter() -> Backend:
    return Backend("interpreter", "cpu", "CPU (Triton interpreter)", 0)


def _detect_gpu() -> Backend | None:
    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(0)
    if torch.version.hip:
        arch = props.gcnArchName.split(":")[0]
        return Backend("hip", arch, props.name, props.multi_processor_count)
    return Backend("cuda", f"sm_{props.major}{props.minor}", props.name, props.multi_processor_count)


def _select(requested: str | None) -> Backend:
    if requested is not None and requested not in BACKENDS:
        raise ValueError(f"{_ENV_VAR}={requested!r}: expected one of {', '.join(BACKENDS)}")
    if requested == "interpreter":
        return _interpreter()
    gpu = _detect_gpu()
    if requested is not None and (gpu is None or gpu.name != requested):
        found = gpu.name if gpu else "no GPU"
        raise RuntimeError(f"{_ENV_VAR}={requested} was asked for, but this machine has {found}")
    return gpu or _interpreter()


def _apply(backend: Backend) -> None:
    """Set the switches the kernel libraries read at definition time."""
    flag = "1" if backend.is_interpreter else "0"
    os.environ["TRITON_INTERPRET"] = flag
    os.environ["NUMBA_ENABLE_CUDASIM"] = flag


_current: Backend = _select(os.environ.get(_ENV_VAR) or None)
_apply(_current)
_kernels_loaded = False


def current() -> Backend:
    """The backend every kernel of this process uses."""
    return _current


def force_interpreter() -> Backend:
    """Run everything on the CPU interpreter, even where a GPU is present.

    Only possible before the first kernel is defined (the first call of
    ``kernels.variants`` or a public op); afterwards the kernels are already compiled
    for the other backend, and this raises instead of silently doing nothing.
    """
    global _current
    if _kernels_loaded and not _current.is_interpreter:
        raise RuntimeError(
            "force_interpreter() was called after kernels were loaded for "
            f"{_current.name}; set {_ENV_VAR}=interpreter before importing kernels instead"
        )
    _current = _interpreter()
    _apply(_current)
    return _current


def mark_kernels_loaded() -> None:
    """Called by the registry when kernel modules are imported: the choice is now final."""
    global _kernels_loaded
    if os.environ.get("TRITON_INTERPRET") != ("1" if _current.is_interpreter else "0"):
        raise RuntimeError(
            "TRITON_INTERPRET was changed after kernels.backend chose "
            f"{_current.name}; use {_ENV_VAR} or kernels.backend.force_interpreter() instead"
        )
    _kernels_loaded = True
