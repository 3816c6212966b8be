"""Training operators as ladders of Triton/SIMT kernels, for AMD Instinct (and NVIDIA) GPUs.

``import kernels`` chooses the backend first (:mod:`kernels.backend`): on a machine
without a GPU that is the Triton interpreter and Numba's CUDA simulator, with no
environment variable to set. Kernel modules load on first use.

    >>> import kernels
    >>> [r.title for r in kernels.variants("gemm")]        # doctest: +SKIP
    ['v0 simt_naive', 'v1 simt_lds_tiled', 'v2 triton_tile', 'ref']
"""
from . import backend
from .registry import get, ops, spec, variants

__all__ = ["backend", "get", "ops", "spec", "variants"]
