"""Example files to grade: a take-home tile GEMM (``gemm_tile.py``) and a plausible wrong
answer made from it, the same file with an off-by-one K mask (:func:`off_by_one_k_mask`).

The wrong file is written from the right one rather than shipped as a second copy: the
two differ in one line, which is the whole lesson, and the diff stays one line as the
right file changes.
"""
from __future__ import annotations

from pathlib import Path

RIGHT = Path(__file__).with_name("gemm_tile.py")
# The K elements left counted as if K were 1-based: the last K column of A and row of B
# never join the sum, so every element of C is off by a rank-one term the harness names.
K_MASK_BUG = ("        k_left = K - k0\n", "        k_left = K - k0 - 1   # off by one: the last K slice is dropped\n")


def off_by_one_k_mask(folder: str | Path) -> Path:
    """Write ``gemm_k_mask_off_by_one.py`` (``gemm_tile.py`` with the K mask one short) into
    ``folder`` and return its path."""
    text = RIGHT.read_text(encoding="utf-8")
    old, new = K_MASK_BUG
    if text.count(old) != 1:
        raise RuntimeError(f"{RIGHT.name} no longer has the line {old.strip()!r} once")
    path = Path(folder) / "gemm_k_mask_off_by_one.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text.replace(old, new), encoding="utf-8")
    return path
