"""MoE exercises: grouped GEMM, FP8 grouped GEMM, the MoE layer."""
from __future__ import annotations

EXERCISES = ()
