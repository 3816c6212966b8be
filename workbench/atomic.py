"""The workbench's name for :func:`kernels.atomic.write_atomic`.

The one implementation lives in ``kernels`` because the tuner's on-disk cache needs
it too, and ``kernels`` never imports ``workbench``.
"""
from kernels.atomic import write_atomic

__all__ = ["write_atomic"]
