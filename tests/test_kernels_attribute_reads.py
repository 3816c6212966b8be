"""Every ``kernels.X`` a module reads resolves in a fresh interpreter, whatever was imported before.

``import kernels`` binds a few submodules and resolves the public names lazily
(``kernels.__getattr__``); any other submodule (``kernels.eager``, ``kernels.autocast``) exists
as an attribute only once something has imported it. A module that reads ``kernels.eager``
without importing it works inside the suite, where another module imported it first, and
fails at import on its own (``workbench/harness/host_overhead.py`` did, run as a script).
Read from the source with ``ast``; the names ``import kernels`` provides come from a fresh
interpreter.
"""
from __future__ import annotations

import ast
import json
import subprocess
import sys

import import_graph


def _fresh_names() -> set[str]:
    """What ``kernels.X`` resolves right after ``import kernels``: bound names and lazy ones."""
    probe = "import json, kernels; print(json.dumps(sorted(set(dir(kernels)) | set(kernels._LAZY) | set(kernels.OPS))))"
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True,
                         cwd=import_graph.ROOT)
    return set(json.loads(out.stdout.splitlines()[-1]))


def _imported_submodules(tree: ast.AST) -> set[str]:
    """``kernels.X`` names a file makes sure of: ``import kernels.X...`` and ``from kernels[.X] import ...``."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[1] for alias in node.names
                      if alias.name.startswith("kernels.")}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            parts = node.module.split(".")
            if parts[0] == "kernels":
                names |= {parts[1]} if len(parts) > 1 else {alias.name for alias in node.names}
    return names


def _unresolved(source: str, name: str, fresh: set[str]) -> list[str]:
    tree = ast.parse(source, name)
    if any(isinstance(node, ast.Name) and node.id == "kernels" and isinstance(node.ctx, ast.Store)
           or isinstance(node, ast.arg) and node.arg == "kernels" for node in ast.walk(tree)):
        return []         # a local named ``kernels`` (a list of launches), not the package
    allowed = fresh | _imported_submodules(tree)
    return [f"{name}:{node.lineno} kernels.{node.attr}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
            and node.value.id == "kernels" and node.attr not in allowed and not node.attr.startswith("__")]


def test_every_kernels_attribute_read_resolves_without_a_prior_import():
    fresh = _fresh_names()
    files = list(import_graph.module_files(packages=("kernels", "roofline", "workbench")).values())
    files += sorted((import_graph.ROOT / "tests").rglob("*.py"))
    unresolved = [line for path in files
                  for line in _unresolved(path.read_text(), str(path.relative_to(import_graph.ROOT)), fresh)]
    assert not unresolved, "read without importing the submodule:\n" + "\n".join(unresolved)


def test_the_rule_sees_a_read_of_an_unimported_submodule():
    """The check itself: a read of ``kernels.eager`` fails it until the file imports it."""
    fresh = _fresh_names()
    assert "eager" not in fresh
    read = "import kernels\n\nf = kernels.eager.applier\n"
    assert _unresolved(read, "probe.py", fresh) == ["probe.py:3 kernels.eager"]
    assert _unresolved("from kernels import eager\n" + read, "probe.py", fresh) == []
    assert _unresolved("import kernels.eager\n" + read, "probe.py", fresh) == []
    assert _unresolved("kernels = []\nkernels.append(1)\n", "probe.py", fresh) == []
