"""MXFP4 GEMM exercises."""
from __future__ import annotations

EXERCISES = ()
