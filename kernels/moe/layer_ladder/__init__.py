"""MoE layer ladder (op ``moe``): from a per-expert loop to permute + grouped GEMMs.

Importing this package registers the problem (:mod:`.spec`) and every rung; the
order of the imports below is the order a reader climbs the ladder. There is no v1 yet:
the plan numbers the grouped rung 2 and leaves 1 for a step between the two that is
not built. v2's speed comes from the grouped GEMM, climbed in its own ladder
(:mod:`kernels.moe.grouped_gemm`); v3 fuses the gather, SwiGLU and the weighted
scatter into two grouped GEMM kernels, so no permuted copy of x goes to HBM.
"""
from . import spec  # noqa: F401  (registers the op)
from . import ref, v0_loop, v2_grouped, v3_fused  # noqa: F401
