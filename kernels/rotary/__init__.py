"""Rotary position embedding, fused: ``kernels.rope(x, cos, sin)`` (:mod:`.op`), one Triton
launch forward and one backward (:mod:`.kernel`), in place of the training model's eager
``apply_rope`` (:mod:`.reference`, with the tables it rotates by).

The package is ``rotary``, not ``rope``: importing a submodule binds its package as an
attribute of ``kernels``, which would replace the public function ``kernels.rope``. It imports
nothing itself, so :mod:`.reference` loads without Triton (``kernels.rope`` is resolved lazily,
:func:`kernels.__getattr__`)."""
