"""Collective exercises: the ring and all-to-all algorithms of kernels.comm."""
from __future__ import annotations

EXERCISES = ()
