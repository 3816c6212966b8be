"""Example files to grade, as two candidates might hand in a take-home tile GEMM.

``gemm_tile.py`` (:data:`RIGHT`) is correct. ``gemm_tile_candidate_b.py`` (:data:`WRONG`)
is a plausible wrong answer, shipped as a file of its own so it can be graded, read and
diffed like any candidate's; what is wrong with it is said only at its end (it is an
exercise in reading the report). The two differ in one line (a test keeps it so).
"""
from __future__ import annotations

from pathlib import Path

RIGHT = Path(__file__).with_name("gemm_tile.py")
WRONG = Path(__file__).with_name("gemm_tile_candidate_b.py")
