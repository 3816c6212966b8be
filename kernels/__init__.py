"""Training operators as ladders of Triton/SIMT kernels, for AMD Instinct (and NVIDIA) GPUs.

``import kernels`` chooses the backend first (:mod:`kernels.backend`): on a machine
without a GPU that is the Triton interpreter and Numba's CUDA simulator, with no
environment variable to set. Then it checks the installed Triton against the releases the
rungs compile under (:mod:`kernels.triton_version`), without importing Triton yet, and torch
against the releases the package was run under (:mod:`kernels.torch_version`). Kernel
modules load on first use: the public ops
(``kernels.matmul``, ``kernels.matmul_fp8``, ``kernels.matmul_mxfp4``,
``kernels.flash_attention``, ``kernels.flash_attention_varlen``,
``kernels.grouped_gemm``, ``kernels.grouped_gemm_fp8``, ``kernels.grouped_gemm_mxfp8``,
and the training step's fused memory-bound ops ``kernels.rope`` (rotary embedding),
``kernels.rms_norm``, ``kernels.add_rms_norm`` (the residual add fused into it) and
``kernels.cross_entropy`` (the loss)), the tuning
pass ``kernels.tune``, ``kernels.nn``, ``kernels.fp8`` (FP8 training: ``kernels.fp8.convert``), ``kernels.moe``
(routing, permute and the layer, ``kernels.MoE``) and the op packages (``kernels.gemm_fp8``,
``kernels.gemm_mxfp4``) are resolved lazily by :func:`__getattr__`.

    >>> import kernels
    >>> [r.title for r in kernels.variants("gemm")]        # doctest: +SKIP
    ['v0 simt_naive', 'v1 simt_lds_tiled', 'v2 triton_tile', 'ref']
    >>> c = kernels.matmul(a, b)                           # doctest: +SKIP
"""
import importlib

from . import backend, compile_cache, torch_version, triton_version
from .registry import OPS, PACKAGES, get, ops, spec, variants

triton_version.check(backend.current().name, triton_version.installed_version(), backend.current().arch)
torch_version.check(backend.current().name)
compile_cache.tag()   # compiled graphs hold our ops' fakes: a source change must not reuse them

# public name -> (module, attribute or None for the module itself)
_LAZY = {
    "matmul": ("kernels.gemm.ops", "matmul"),
    "matmul_fp8": ("kernels.gemm_fp8.ops", "matmul_fp8"),
    "matmul_mxfp4": ("kernels.gemm_mxfp4.ops", "matmul_mxfp4"),
    "flash_attention": ("kernels.attention.ops", "flash_attention"),
    "flash_attention_varlen": ("kernels.attention.ops", "flash_attention_varlen"),
    "rope": ("kernels.rotary.op", "rope"),
    "grouped_gemm": ("kernels.moe.grouped_gemm.ops", "grouped_gemm"),
    "grouped_gemm_fp8": ("kernels.moe.grouped_gemm_fp8.ops", "grouped_gemm_fp8"),
    "grouped_gemm_mxfp8": ("kernels.moe.grouped_gemm_mxfp8.ops", "grouped_gemm_mxfp8"),
    "rms_norm": ("kernels.norm.ops", "rms_norm"),
    "add_rms_norm": ("kernels.norm.ops", "add_rms_norm"),
    "nn": ("kernels.nn", None),
    "fp8": ("kernels.fp8", None),
    "moe": ("kernels.moe", None),
    "MoE": ("kernels.moe.layer", "MoE"),
    "cross_entropy": ("kernels.loss.ops", "cross_entropy"),
    "tune": ("kernels.tuning_pass", "tune"),
}

__all__ = ["backend", "get", "ops", "spec", "variants", *_LAZY]


def __getattr__(name: str):
    """Import kernel modules on first touch, after the backend choice above."""
    if name in _LAZY:
        module, attr = _LAZY[name]
    elif name in OPS:
        spec(name)  # registers the op's rungs through the registry
        module, attr = PACKAGES[name], None
    else:
        raise AttributeError(f"module 'kernels' has no attribute {name!r}")
    loaded = importlib.import_module(module)
    value = loaded if attr is None else getattr(loaded, attr)
    globals()[name] = value   # later touches are a plain attribute read, not this call
    return value
