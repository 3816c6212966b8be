"""The format of measured ceilings, shared by the chart and the code that measures them.

Measured ceilings come from a copy kernel and a large matmul on the GPU at hand (see
``workbench.harness.ceilings``); roofline only draws them. They are checked here so that a stale or
hand-edited cache file fails with a message naming it instead of drawing a wrong line.
Format: ``{"gpu": str, "date": str, "hbm_tbps": float, "peak_tflops": {dtype: float}}``,
other keys (torch version, method) are kept as they are.
"""

from collections.abc import Mapping
from numbers import Real

from .dtypes import dtype_name


def check_ceilings(ceilings, where="ceilings") -> dict:
    """Validated copy of ``ceilings`` with dtype names folded; ValueError names ``where``."""
    def fail(problem):
        raise ValueError(f"{where}: {problem}")

    def positive(field, value):
        if isinstance(value, bool) or not isinstance(value, Real) or not value > 0:
            fail(f"{field} must be a positive number, got {value!r}")
        return float(value)

    if not isinstance(ceilings, Mapping):
        fail(f"expected a mapping, got {type(ceilings).__name__}")
    out = dict(ceilings)
    for field in ("gpu", "date"):
        if not isinstance(out.get(field), str) or not out[field]:
            fail(f"{field!r} must be a non-empty string")
    if "hbm_tbps" not in out and "peak_tflops" not in out:
        fail("needs 'hbm_tbps' and/or 'peak_tflops'")
    if "hbm_tbps" in out:
        out["hbm_tbps"] = positive("hbm_tbps", out["hbm_tbps"])
    peaks = out.get("peak_tflops", {})
    if not isinstance(peaks, Mapping):
        fail("'peak_tflops' must be a mapping dtype -> TFLOP/s")
    folded = {}
    for dtype, value in peaks.items():
        try:
            name = dtype_name(dtype)
        except ValueError as err:
            fail(f"peak_tflops: {err}")
        folded[name] = positive(f"peak_tflops.{dtype}", value)
    out["peak_tflops"] = folded
    return out
