"""RMSNorm's tolerances (stated in tests/test_rms_norm.py's docstring): add_rms_norm's tests hold it to the same."""
from __future__ import annotations

import torch


def _tolerance(dtype: torch.dtype) -> float:
    return 1e-5 if dtype == torch.float32 else torch.finfo(dtype).eps


def half_ulp(want: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Half the spacing of ``dtype``'s values at ``want``: eps·2^(e-1)/2 for |want| = m·2^e,
    m in [0.5, 1), and below the smallest normal number the subnormals' fixed spacing."""
    finfo = torch.finfo(dtype)
    binade = torch.ldexp(torch.ones_like(want), torch.frexp(want).exponent - 1).clamp(min=finfo.smallest_normal)
    return 0.5 * finfo.eps * binade


def assert_close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, terms=None):
    """``got`` within tests/test_rms_norm.py's docstring's bound of ``want``: a rounded-once y where ``terms``
    is None, else a sum of terms of those magnitudes."""
    assert got.dtype == dtype and got.shape == want.shape
    tol = _tolerance(dtype)
    if terms is not None:
        bound = tol * (want.abs() + terms)
    elif dtype == torch.float32:
        bound = tol * want.abs()
    else:
        bound = half_ulp(want, dtype) + 1e-5 * want.abs()
    err = (got.double() - want).abs()
    bad = ~(err <= bound)   # NaN fails
    assert not bad.any(), (f"{int(bad.sum())} of {got.numel()} off, worst {err.max().item():.3g} at "
                           f"{tuple(int(i) for i in torch.nonzero(bad)[0])}, bound {tol:g}")
