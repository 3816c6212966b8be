"""The correctness rule's numbers. Changing them is a visible, reviewed change:
``tests/test_harness.py`` pins this table.

A rung passes when ``error <= FACTOR[direction] * baseline_error + FLOOR[dtype]``,
where both errors are max |x - reference| / max |reference| against the float64
reference, and ``baseline_error`` is the library baseline's error in the same dtype
on the same inputs (the largest of several samples: two memory orders and two to eight
rounding neighbours of the inputs, more for small outputs, :func:`workbench.check.judge`). The factor lets a kernel sum in
another order than the library;
the floor (about one unit in the last place of the dtype at the output's largest
magnitude) covers shapes where the baseline happens to be exact.
"""
from __future__ import annotations

import torch

FACTOR = {"forward": 2.0, "backward": 3.0}

FLOOR = {
    torch.float64: 1e-12,
    torch.float32: 1e-6,
    torch.float16: 1e-3,     # 2**-10 = 9.8e-4
    torch.bfloat16: 8e-3,    # 2**-7  = 7.8e-3
    torch.float8_e4m3fn: 0.125,    # 2**-3
    torch.float8_e4m3fnuz: 0.125,
    torch.float8_e5m2: 0.25,       # 2**-2
}


def allowed_error(dtype: torch.dtype, baseline_error: float, direction: str = "forward") -> float:
    if dtype not in FLOOR:
        raise KeyError(f"no tolerance floor for {dtype}; add one to workbench/harness/tolerances.py")
    return FACTOR[direction] * baseline_error + FLOOR[dtype]

# Two evaluations of one computation whose sums associate differently (another BLAS
# kernel, other rows sharing a tile, a per-rank partial sum) differ by a few units in
# the last place of the result's largest magnitude per summand's rounding; 64 ulps
# leaves room for sums over a few dozen terms and still fails a real bug by orders of
# magnitude (a dropped or doubled row moves the result by its own size).
REASSOCIATION_ULPS = 64


def reassociation_bound(dtype: torch.dtype) -> float:
    """The relative error (:func:`workbench.check.relative_error`) allowed between two
    orders of one computation's sums in ``dtype``: 64 ulps, 7.6e-6 in fp32."""
    return REASSOCIATION_ULPS * torch.finfo(dtype).eps
