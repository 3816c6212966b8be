"""What a wrong output's error pattern says about its cause, in words a terminal can print.

"399 of 399 elements off" names no bug; the pattern of the error usually does. The heat
map shows where the bad elements lie; :func:`finding` says it in text, and then tries the
few shapes a wrong kernel's error takes, each with the bug that makes it:

* NaN where the reference is finite: the output's NaN poison survived, so those elements
  were never written (a tile the grid does not cover, a store mask that drops it);
* the output is the reference in column-major order: the store's strides or indices swapped;
* ``out = diag(p) @ ref @ diag(q)``: one factor for all (a global scale missing or extra:
  the softmax scale, a per-tensor quantization scale), one per column (a GEMM's per-channel
  scale ``s_b``), one per row (``s_a``, or attention's softmax row sum), or both;
* ``out - ref`` is one outer product: a slice of the reduction missing or counted twice;
  with GEMM-shaped inputs it names the slice (``a[:, K-1] * b[K-1, :]``: an off-by-one K mask).

A pattern is named only when it explains nearly all of the error (:data:`EXPLAINED`), so
the rounding noise of a correct kernel, or of one that merely accumulates in too narrow a
type, matches none of them.
"""
from __future__ import annotations

import torch

EXPLAINED = 0.1        # a pattern fits when what it leaves is under 10 % of the error's norm
CONSTANT = 0.01        # factors within 1 % of each other are one factor
DENSE = 0.9            # a rank-1 error must touch most rows and columns (not one bad element)
MIN_SIDE = 3           # rows and columns needed before a per-row, per-column or rank-1 claim
MAX_SVD_ELEMENTS = 1 << 20


def as_matrix(t: torch.Tensor) -> torch.Tensor:
    """2-D view: leading dimensions fold into rows, the last one stays columns."""
    if t.dim() == 0:
        return t.reshape(1, 1)
    return t.reshape(-1, t.shape[-1])


def _span(indices: torch.Tensor, total: int, noun: str) -> str:
    n = len(indices)
    if n == total:
        return f"all {total} {noun}s"
    first, last = int(indices[0]), int(indices[-1])
    if n == 1:
        return f"{noun} {first}"
    if last - first + 1 == n:
        return f"{noun}s {first}-{last}"
    return f"{n} of {total} {noun}s ({first} to {last})"


def where(bad: torch.Tensor) -> str:
    """The heat map's reading: which rows and columns (of the 2-D view) hold bad elements."""
    bad = as_matrix(bad)
    rows, cols = bad.any(1).nonzero().flatten(), bad.any(0).nonzero().flatten()
    if not len(rows):
        return ""
    text = f"{_span(rows, bad.shape[0], 'row')} x {_span(cols, bad.shape[1], 'column')}"
    if int(bad.sum()) == len(rows) * len(cols) and len(rows) * len(cols) < bad.numel():
        text += ", every element there"
    return text


def _norm(t: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(t))


def _fits(residual: torch.Tensor, error: torch.Tensor) -> bool:
    return _norm(residual) <= EXPLAINED * _norm(error)


def _factors(x: torch.Tensor, ref: torch.Tensor, sweeps: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """Least-squares p (per row) and q (per column) with x ~ p_i * ref_ij * q_j."""
    p, q = torch.ones(x.shape[0], dtype=x.dtype), torch.ones(x.shape[1], dtype=x.dtype)
    for _ in range(sweeps):
        scaled = ref * q
        p = (x * scaled).sum(1) / (scaled * scaled).sum(1).clamp_min(1e-300)
        scaled = ref * p[:, None]
        q = (x * scaled).sum(0) / (scaled * scaled).sum(0).clamp_min(1e-300)
    return p, q


def _constant(f: torch.Tensor) -> bool:
    return float(f.max() - f.min()) <= CONSTANT * float(f.abs().max())


def _range(f: torch.Tensor) -> str:
    return f"{float(f.min()):.3g} to {float(f.max()):.3g}"


def _scaled(x: torch.Tensor, ref: torch.Tensor, error: torch.Tensor) -> str:
    big = min(x.shape) >= MIN_SIDE
    if not big:   # too few rows or columns to tell a per-row factor from anything else
        c = float((x * ref).sum() / (ref * ref).sum().clamp_min(1e-300))
        if x.numel() < 4 or not _fits(x - c * ref, error):
            return ""
        p, q = torch.full((x.shape[0],), c, dtype=x.dtype), torch.ones(x.shape[1], dtype=x.dtype)
    else:
        p, q = _factors(x, ref)
        if not _fits(x - p[:, None] * ref * q, error):
            return ""
    row, col = _constant(p), _constant(q)
    if row and col:
        c = float(p.mean() * q.mean())
        if c == 0:
            return ("every element is 0: nothing accumulated or stored, or a factor of 0 (a scale "
                    "read as 0)")
        return (f"every element is {c:.4g} x the reference (1/{1 / c:.4g}): a global factor "
                f"missing or extra (a softmax scale, a per-tensor quantization scale)")
    if row:
        q = q * p.mean()
        return (f"each column is off by its own factor (out/ref from {_range(q)} across columns): "
                f"a per-column scale missing or misapplied (in a GEMM, B's per-channel scale s_b)")
    if col:
        p = p * q.mean()
        return (f"each row is off by its own factor (out/ref from {_range(p)} across rows): "
                f"a per-row scale missing or misapplied (in a GEMM, A's per-row scale s_a; in "
                f"attention, the softmax row sum)")
    return ("each element is off by a row factor times a column factor (out/ref = p_i * q_j): "
            "both per-channel scales misapplied (s_a per row, s_b per column: missing, read "
            "along the wrong axis, or divided instead of multiplied)")


def _dense(v: torch.Tensor) -> bool:
    return float((v.abs() > 0.01 * v.abs().max()).double().mean()) >= DENSE


def _reduction_slice(u: torch.Tensor, v: torch.Tensor, sigma: float, inputs: tuple) -> str:
    """'-a[:, 52] * b[52, :], the last of K = 53 slices, missing' where the GEMM operands
    ``inputs[:2]`` have a slice whose outer product is the error ``sigma * u v^T``."""
    if len(inputs) < 2 or not all(isinstance(t, torch.Tensor) and t.dim() == 2 for t in inputs[:2]):
        return ""
    a, b = (t.detach().cpu().double() for t in inputs[:2])
    if a.shape[0] != len(u) or b.shape[1] != len(v) or a.shape[1] != b.shape[0]:
        return ""
    ua, vb = u @ a, b @ v                              # per k: u . a[:, k] and b[k, :] . v
    norms = torch.linalg.vector_norm(a, dim=0) * torch.linalg.vector_norm(b, dim=1)
    match = (ua * vb).abs() / norms.clamp_min(1e-300)
    k = int(match.argmax())
    if float(match[k]) < 1 - EXPLAINED:
        return ""
    alpha = sigma * float(ua[k] * vb[k]) / float(norms[k]) ** 2
    K = a.shape[1]
    which = {0: "the first", K - 1: "the last"}.get(k, f"slice {k}")
    if abs(alpha + 1) <= EXPLAINED:
        what = "is missing: an off-by-one K mask or loop bound"
    elif abs(alpha - 1) <= EXPLAINED:
        what = "is counted twice: overlapping K steps"
    else:
        what = f"is weighted {1 + alpha:.3g} instead of 1"
    return (f"the error is {alpha:+.3g} x a[:, {k}] * b[{k}, :]: {which} of K = {K} slices "
            f"of the reduction {what}")


def _rank_one(error: torch.Tensor, inputs: tuple) -> str:
    if min(error.shape) < MIN_SIDE or error.numel() > MAX_SVD_ELEMENTS:
        return ""
    u, s, vh = torch.linalg.svd(error, full_matrices=False)
    if float(s[0] ** 2) < (1 - EXPLAINED**2) * float((s**2).sum()):
        return ""
    named = _reduction_slice(u[:, 0], vh[0], float(s[0]), inputs)
    if named:
        return named
    if not (_dense(u[:, 0]) and _dense(vh[0])):
        return ""
    return ("the error is one outer product (rank 1): one slice of the reduction missing or "
            "counted twice, e.g. an off-by-one mask on the last K block")


def likely_cause(x: torch.Tensor, reference: torch.Tensor, inputs: tuple = ()) -> str:
    """The bug the error's pattern points at, or "" when no pattern explains it."""
    x = x.detach().cpu().double()
    poison = torch.isnan(x) & torch.isfinite(reference)
    if poison.any():
        return (f"{int(poison.sum())} elements are NaN where the reference is finite: the "
                f"output's NaN poison, never written (a tile the grid does not cover, or a "
                f"store mask that drops it), or a NaN the kernel computed")
    if not (torch.isfinite(x).all() and torch.isfinite(reference).all()):
        return ""
    error = as_matrix(x) - as_matrix(reference)
    if _norm(error) == 0:
        return ""
    if x.dim() >= 2 and min(x.shape[-2:]) >= 2:   # C^T's bytes read as C: x.T when square
        stored = x.reshape(*x.shape[:-2], x.shape[-1], x.shape[-2]).transpose(-1, -2)
        if _fits(as_matrix(stored - reference), error):
            return ("the output is the reference in column-major order (transposed): the "
                    "store's row and column strides, or its indices, are swapped")
    scaled = _scaled(as_matrix(x), as_matrix(reference), error)
    if scaled:
        return scaled
    return _rank_one(error, inputs) if x.dim() == 2 else ""


def finding(x: torch.Tensor, reference: torch.Tensor, bad: torch.Tensor, inputs: tuple = ()) -> str:
    """``where: ...; likely cause: ...`` for a failed output ("" when nothing is off)."""
    place = where(bad)
    if not place:
        return ""
    cause = likely_cause(x, reference, inputs)
    return f"where: {place}" + (f"; likely cause: {cause}" if cause else "")
