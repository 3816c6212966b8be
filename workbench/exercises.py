"""``workbench.exercises``, the public name of :mod:`workbench.learn.exercises`.

``from workbench import exercises``, ``import workbench.exercises`` and
``from workbench.exercises import load`` keep working: this module hands the import system
the real package in its place, so both names are one module object (loaded on first use:
it brings every ladder's kernels, which ``import workbench`` does not need). Its
submodules live under ``workbench.learn.exercises`` only.
"""
import sys

from .learn import exercises

sys.modules[__name__] = exercises
