"""GEMM ladder: C = A @ B, from one thread per output to the matrix cores.

Importing this package registers the problem (:mod:`.spec`) and every rung; the
order of the imports below is the order a reader climbs the ladder.
"""
from . import spec  # noqa: F401  (registers the op)
from . import ref, v0_simt_naive, v1_simt_lds_tiled, v2_triton_tile  # noqa: F401
from . import v3_grouped_order, v4_lds_pipeline, v5_autotuned, v6_persistent  # noqa: F401  (GEMM ladder v3+: grouped order, pipeline, autotune, persistent)
from . import split_k  # noqa: F401  (beside v6, off the ladder: the classic split-K)
