"""Rotary position embedding, fused: ``kernels.rope(x, cos, sin)`` (:mod:`.op`), one Triton
launch forward and one backward (:mod:`.kernel`), in place of the training model's eager
``apply_rope``.

The package is ``rotary``, not ``rope``: importing a submodule binds its package as an
attribute of ``kernels``, which would replace the public function ``kernels.rope``."""
from .op import rope

__all__ = ["rope"]
