"""Show a rung's kernel source and the diff to the rung below it, read from the package.

Notebooks never paste kernel code: they call these, so what a reader sees is exactly
the code that was checked, and the diff between neighbouring rungs shows the one idea
the higher rung adds.
"""
from __future__ import annotations

import ast
import difflib
import html
import importlib
import inspect
import re

import kernels
from kernels.registry import Rung

# A rung module marks the lines that carry its one idea for its exercise
# (:mod:`workbench.learn.exercises.source` cuts them out); a reader of the rung never sees them.
MARKER_BEGIN = re.compile(r"^(?P<indent>\s*)# exercise begin: (?P<name>[\w-]+)\s*$")
MARKER_END = re.compile(r"^\s*# exercise end\s*$")


def without_markers(source: str) -> str:
    """The module's text with the marker lines dropped: what a reader of the rung sees, so a
    diff between neighbouring rungs shows their ideas, not where their exercises are cut."""
    return "".join(line for line in source.splitlines(keepends=True)
                   if not (MARKER_BEGIN.match(line) or MARKER_END.match(line)))


def rung_source(rung: Rung, docstring: bool = True) -> str:
    """The source of the module that defines the rung, optionally without its docstring;
    never with the exercise markers (:mod:`workbench.learn.exercises.source`)."""
    text = without_markers(inspect.getsource(importlib.import_module(rung.module)))
    if docstring:
        return text
    body = ast.parse(text).body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        return "".join(text.splitlines(keepends=True)[body[0].end_lineno:]).lstrip("\n")
    return text


def previous_rung(rung: Rung) -> Rung | None:
    """The next lower numbered rung of the same op, or None for the first rung and ``ref``."""
    if rung.rung is None:
        return None
    lower = [r for r in kernels.variants(rung.op, include_ref=False) if r.rung < rung.rung]
    return lower[-1] if lower else None


def rung_diff(rung: Rung, base: Rung | None = None, context: int = 3) -> str:
    """Unified diff of the code (docstrings left out: pages show them whole) from ``base``
    (default: the rung below) to ``rung``; "" when there is none."""
    base = base or previous_rung(rung)
    if base is None:
        return ""
    old = rung_source(base, docstring=False).splitlines(keepends=True)
    new = rung_source(rung, docstring=False).splitlines(keepends=True)
    return "".join(difflib.unified_diff(old, new, fromfile=f"{base.module}.py",
                                        tofile=f"{rung.module}.py", n=context))


class Code:
    """Source or diff text that renders with colour in a notebook and as text in a terminal."""

    def __init__(self, text: str, diff: bool = False):
        self.text, self.diff = text, diff

    def __str__(self) -> str:
        return self.text

    def _repr_html_(self) -> str:
        def line(text: str) -> str:
            colour = {"+": "#e6ffec", "-": "#ffebe9", "@": "#ddf4ff"}.get(text[:1]) if self.diff else None
            style = f' style="background:{colour}"' if colour else ""
            return f"<span{style}>{html.escape(text)}</span>"
        body = "\n".join(line(t) for t in self.text.splitlines())
        # A box of bounded height that scrolls: a long kernel or diff would otherwise
        # stretch a ladder notebook over dozens of screens.
        return f'<pre style="font-size:12px;line-height:1.3;max-height:36em;overflow:auto">{body}</pre>'


def show_source(op: str, which: int | str) -> Code:
    return Code(rung_source(kernels.get(op, which)))


def show_diff(op: str, which: int | str) -> Code:
    return Code(rung_diff(kernels.get(op, which)), diff=True)
