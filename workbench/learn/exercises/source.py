"""An exercise's text, made from its rung's own source: the solution is never copied.

A rung module marks the lines that carry its one idea::

    # exercise begin: order
    ...the lines a learner writes...
    # exercise end

An exercise names, per marked block, what stands there instead in the learner's copy (a
TODO stub that runs but is wrong, so the shipped exercise fails its check) and, for its
tests, plausible wrong answers. :func:`render` swaps the blocks and rewrites the module's
relative imports to absolute ones, so the learner's file imports the package's shared
helpers but never the rung it reproduces. Rendering a module with no replacement gives
the solution back with its markers removed.
"""
from __future__ import annotations

import importlib.util
import re
import textwrap
from dataclasses import dataclass

from ...views.source import MARKER_BEGIN, MARKER_END

_RELATIVE = re.compile(r"^(?P<indent>\s*)from (?P<dots>\.+)(?P<rest>[\w.]*) import ")


@dataclass(frozen=True)
class Block:
    """One marked region of a rung module: its lines (without the markers) and indent."""

    name: str
    indent: str
    start: int      # index of the begin marker in the module's lines
    end: int        # index of the end marker
    text: str       # the solution's lines, dedented


def module_source(module: str) -> str:
    """A module's source text without importing it (importing would register its rungs)."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(f"no module {module!r}")
    with open(spec.origin, encoding="utf-8") as f:
        return f.read()


def blocks(source: str) -> dict[str, Block]:
    """The marked blocks of a module, by name; malformed markers are an error, not a guess."""
    lines = source.splitlines()
    found: dict[str, Block] = {}
    open_at = None
    for i, line in enumerate(lines):
        begin, end = MARKER_BEGIN.match(line), MARKER_END.match(line)
        if begin:
            if open_at is not None:
                raise ValueError(f"line {i + 1}: exercise block opened inside another")
            open_at = (i, begin["name"], begin["indent"])
        elif end:
            if open_at is None:
                raise ValueError(f"line {i + 1}: '# exercise end' without a begin")
            start, name, indent = open_at
            if name in found:
                raise ValueError(f"exercise block {name!r} is marked twice")
            body = textwrap.dedent("\n".join(lines[start + 1:i]))
            found[name] = Block(name, indent, start, i, body)
            open_at = None
    if open_at is not None:
        raise ValueError(f"exercise block {open_at[1]!r} is never closed")
    return found


def variant(module: str, block: str, *edits: tuple[str, str]) -> dict[str, str]:
    """A wrong answer (or a stub) made from a marked block: the block's text with each
    ``(old, new)`` edit applied, as ``{block: text}`` for an exercise's ``wrong``/``todo``.

    Made from the rung's own text, a mistake stays one mistake when the rung changes; an
    ``old`` that is no longer there is an error, never a silent copy of the solution."""
    text = blocks(module_source(module))[block].text
    for old, new in edits:
        if old not in text:
            raise ValueError(f"{module} block {block!r} has no {old!r} to edit")
        text = text.replace(old, new)
    return {block: text}


def absolute_imports(source: str, package: str) -> str:
    """``from ..x import y`` as ``from kernels.x import y``, resolved against ``package``."""
    def resolve(match: re.Match) -> str:
        parts = package.split(".")
        up = len(match["dots"]) - 1
        if up >= len(parts):
            raise ValueError(f"relative import beyond the top of {package!r}")
        base = ".".join(parts[:len(parts) - up])
        target = f"{base}.{match['rest']}" if match["rest"] else base
        return f"{match['indent']}from {target} import "
    return "\n".join(_RELATIVE.sub(resolve, line) for line in source.splitlines()) + "\n"


def render(module: str, replacements: dict[str, str] | None = None) -> str:
    """The rung module's text with each named block replaced (the rest kept), markers gone.

    Every block named in ``replacements`` must exist: a stub for a block that is not
    there would leave the solution in the learner's copy."""
    replacements = replacements or {}
    source = module_source(module)
    marked = blocks(source)
    unknown = set(replacements) - set(marked)
    if unknown:
        raise KeyError(f"{module} has no exercise block {sorted(unknown)}; it has {sorted(marked)}")
    lines = source.splitlines()
    out: list[str] = []
    cursor = 0
    for block in sorted(marked.values(), key=lambda b: b.start):
        out += lines[cursor:block.start]
        body = replacements.get(block.name, block.text)
        out += textwrap.indent(textwrap.dedent(body).strip("\n"), block.indent).splitlines()
        cursor = block.end + 1
    out += lines[cursor:]
    package = module.rpartition(".")[0]
    return absolute_imports("\n".join(out), package)
