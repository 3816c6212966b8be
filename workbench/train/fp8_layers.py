"""Which layers of a training run stay in high precision under an FP8 recipe.

:func:`kernels.fp8.convert` keeps :data:`kernels.fp8.KEEP_HIGH_PRECISION` unless told
otherwise; a run takes the same choice as a list of names or patterns (``fp8_keep``), so the
command line (``--fp8-keep``) and the training comparison widget can run, say, the MoE
layers' shared experts in FP8 as DeepSeek-V3 does (the default without ``"*shared_experts"``).
Each row records the list a run asked convert to keep, so two runs' losses are compared knowing
which GEMMs were meant to be quantized; what convert cannot quantize (delayed scaling's shared
experts, the plain PyTorch MoE's experts) it keeps with a warning, and a pattern that names no
layer of the model is a warning too.
"""
from __future__ import annotations

from fnmatch import fnmatchcase

import torch

import kernels


def applied(fp8: str | None, fp8_keep) -> tuple[str, ...] | None:
    """The patterns a run with recipe ``fp8`` asks :func:`kernels.fp8.convert` to keep in high
    precision (``fp8_keep``, default :data:`kernels.fp8.KEEP_HIGH_PRECISION`), None without a
    recipe. Checked before anything is built: a choice of layers without a recipe is refused
    (:func:`checked` says what else). What convert cannot put in FP8 stays in high precision
    whatever the list says, with convert's warning (delayed scaling's shared experts, the
    plain PyTorch MoE's experts)."""
    if fp8_keep is None:
        return None if fp8 is None else tuple(kernels.fp8.KEEP_HIGH_PRECISION)
    patterns = checked(fp8_keep)
    if fp8 is None:
        raise ValueError(f"layers to keep in high precision ({described(patterns)}) were given "
                         f"without an FP8 recipe (fp8, --fp8) to convert the others")
    return patterns


def checked(patterns) -> tuple[str, ...]:
    """``patterns`` as a tuple. Refused: anything but a list or tuple of strings (a bare
    string, whose characters would each be a pattern; a set or generator, in no fixed order or
    read once; convert's other form, a callable, which a run's rows could not record) and a
    pattern with a comma, which :func:`parse` would split."""
    if not isinstance(patterns, (list, tuple)) or not all(isinstance(p, str) and "," not in p for p in patterns):
        raise TypeError(f"the layers kept in high precision are a list or tuple of module names or "
                        f"patterns without commas, got {patterns!r}")
    return tuple(patterns)


def unmatched(model: torch.nn.Module, patterns) -> list[str]:
    """The patterns that name nothing convert could keep in ``model``: no Linear, no MoE layer,
    no MoE layer's shared experts (``"<layer>.shared_experts"``); ``"first"`` and ``"last"``
    name the first and last Linear when there is one. A misspelt pattern would otherwise
    quantize the layer it meant to keep, silently."""
    from kernels.moe.layer_base import MoELayer

    linears = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    names = linears + [f"{n}.shared_experts" if n else "shared_experts" for n, m in model.named_modules()
                       if isinstance(m, MoELayer) and m.shared_experts]
    names += [n for n, m in model.named_modules() if isinstance(m, MoELayer)]
    aliases = {"first", "last"} if linears else set()
    return [p for p in patterns if p not in aliases and not any(fnmatchcase(n, p) for n in names)]


def parse(line: str) -> tuple[str, ...]:
    """``"first, last, *router"`` -> ``("first", "last", "*router")``; blank: every layer in FP8."""
    return tuple(p.strip() for p in line.split(",") if p.strip())


def text(patterns) -> str:
    """What :func:`parse` reads back: the patterns joined by ", "."""
    return ", ".join(patterns)


def described(patterns) -> str:
    """:func:`text`, or "none" for an empty list (every layer in FP8)."""
    return text(patterns) or "none"
