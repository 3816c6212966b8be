"""Grouped GEMM ladder: one GEMM per expert, from a Python loop to one launch for all.

Importing this package registers the problem (:mod:`.spec`) and every rung; the
order of the imports below is the order a reader climbs the ladder.
"""
from . import spec  # noqa: F401  (registers the op)
from . import ref, v0_loop, v1_per_expert, v2_one_launch, v4_persistent  # noqa: F401
