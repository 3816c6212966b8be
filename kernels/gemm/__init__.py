"""GEMM ladder: C = A @ B, from one thread per output to the matrix cores.

Importing this package registers the problem (:mod:`.spec`) and every rung; the
order of the imports below is the order a reader climbs the ladder.
"""
from . import spec  # noqa: F401  (registers the op)
from . import ref, v0_simt_naive, v1_simt_lds_tiled, v2_triton_tile  # noqa: F401
