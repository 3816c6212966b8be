"""What a Triton rung becomes on gfx942, gfx950 or sm90, without the GPU.

``inspector`` is the public face (``from workbench import isa; isa.inspect(...)``, re-exported
here); ``compile`` runs Triton's ahead-of-time compiler in a helper process, ``parse`` reads
AMDGCN/PTX/cubins, ``occupancy`` turns resources into waves per SIMD, ``waits`` reads a hot
loop's ``s_waitcnt``s, ``lds_banks`` models LDS bank conflicts, ``tune_space`` prunes tuning
spaces with the compiler, ``compat`` checks which Triton releases compile every rung.

May import: kernels, roofline, workbench.harness. Never model, comm, views, train, learn, widgets.
"""
from .inspector import (SCROLL, TARGETS, IsaReport, clear_cache, compare, compiled_from, default_dtype, inspect,
                        inspect_all, inspect_launch, normalize_target, read_kernel, why_no_isa)

__all__ = ["SCROLL", "TARGETS", "IsaReport", "clear_cache", "compare", "compiled_from", "default_dtype", "inspect",
           "inspect_all", "inspect_launch", "normalize_target", "read_kernel", "why_no_isa"]
