"""Attention ladder: from scores materialized in HBM to flash forward and backward.

Importing this package registers the problem (:mod:`.spec`) and every rung; the
order of the imports below is the order a reader climbs the ladder.
"""
from . import spec  # noqa: F401  (registers the op)
from . import ref, v0_composed, v1_fused_rows, v2_flash_forward, v3_causal_lse  # noqa: F401
from . import v4_amd_tuned, v5_backward  # noqa: F401
