"""The import graph of our own packages, read from the source with ``ast`` (nothing is imported).

One arrow per (importer, imported) module pair. ``from . import x`` and ``from pkg import x``
count as an arrow to ``pkg.x`` when ``pkg.x`` is a module of ours, else to ``pkg``. Imports
anywhere in a file count, inside functions too: a lazy import is still a dependency. Only
imports under ``if TYPE_CHECKING:`` do not: they never run.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("kernels", "roofline", "workbench")


def module_files(root: Path = ROOT, packages=PACKAGES) -> dict[str, Path]:
    """``{"workbench.harness.check": path, ...}`` for every ``.py`` file of our packages."""
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _resolve(name: str, path: Path, level: int, module: str | None) -> str:
    if not level:
        return module or ""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    base = package[: len(package) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def _runtime_nodes(tree: ast.AST):
    """Every node, less the bodies of ``if TYPE_CHECKING:`` blocks."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def imports_of(name: str, path: Path, modules) -> set[str]:
    """The modules of ours that module ``name`` (at ``path``) imports."""
    targets = set()
    for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(name, path, node.level, node.module)
            candidates = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                          for alias in node.names]
        else:
            continue
        for candidate in candidates:
            while candidate and candidate not in modules:   # import a.b.c where only a.b is ours
                candidate = candidate.rpartition(".")[0]
            if candidate and candidate != name:
                targets.add(candidate)
    return targets


def graph(root: Path = ROOT, packages=PACKAGES) -> dict[str, set[str]]:
    modules = module_files(root, packages)
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def circles(arrows: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in arrows.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(arrows):
        if node not in index:
            visit(node)
    return found
