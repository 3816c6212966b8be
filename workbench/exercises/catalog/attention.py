"""Attention ladder exercises."""
from __future__ import annotations

EXERCISES = ()
