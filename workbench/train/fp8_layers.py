"""Which layers of a training run stay in high precision under an FP8 recipe.

:func:`kernels.fp8.convert` keeps :data:`kernels.fp8.KEEP_HIGH_PRECISION` unless told
otherwise; a run takes the same choice as a list of names or patterns (``fp8_keep``), so the
command line (``--fp8-keep``) and the training comparison widget can run, say, the MoE
layers' shared experts in FP8 as DeepSeek-V3 does (the default without ``"*shared_experts"``).
Each row records the list a run applied, so two runs' losses are compared knowing which
GEMMs were quantized.
"""
from __future__ import annotations

from collections.abc import Iterable

import kernels


def applied(fp8: str | None, fp8_keep) -> tuple[str, ...] | None:
    """The patterns a run with recipe ``fp8`` keeps in high precision (``fp8_keep``, default
    :data:`kernels.fp8.KEEP_HIGH_PRECISION`), None without a recipe. Checked before anything
    is built: a choice of layers without a recipe is refused, as is a bare string (one
    pattern is ``("*router",)``, not ``"*router"``, whose characters would each be a pattern)."""
    if fp8_keep is None:
        return None if fp8 is None else tuple(kernels.fp8.KEEP_HIGH_PRECISION)
    patterns = checked(fp8_keep)
    if fp8 is None:
        raise ValueError(f"layers to keep in high precision ({text(patterns) or 'none'}) were given "
                         f"without an FP8 recipe (fp8, --fp8) to convert the others")
    return patterns


def checked(patterns) -> tuple[str, ...]:
    """``patterns`` as a tuple of names or patterns. Refused: a bare string, a non-string
    entry, and convert's other form, a callable, which a run's rows could not record."""
    if isinstance(patterns, str) or not isinstance(patterns, Iterable) or \
            not all(isinstance(p, str) for p in patterns):
        raise TypeError(f"the layers kept in high precision are a sequence of module names or "
                        f"patterns, got {patterns!r}")
    return tuple(patterns)


def parse(line: str) -> tuple[str, ...]:
    """``"first, last, *router"`` -> ``("first", "last", "*router")``; blank: every layer in FP8."""
    return tuple(p.strip() for p in line.split(",") if p.strip())


def text(patterns) -> str:
    """What :func:`parse` reads back: the patterns joined by ", "."""
    return ", ".join(patterns)
