"""Every workbench module imports, and every workbench name the README and the notebooks use
resolves: parsed from their code, not listed by hand, so a moved module cannot strand them."""
from __future__ import annotations

import ast
import importlib
import inspect
import json
import pkgutil
import re
from pathlib import Path

import pytest

import workbench

ROOT = Path(__file__).resolve().parents[1]
DOTTED = re.compile(r"(?<![\w.])workbench(?:\.[A-Za-z_]\w*)+")


def code_blocks() -> list[tuple[str, str]]:
    """(where, code): the README's python blocks and every notebook's code cells."""
    blocks = [(f"README.md block {i}", block) for i, block in
              enumerate(re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S))]
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for i, cell in enumerate(json.loads(notebook.read_text())["cells"]):
            if cell["cell_type"] == "code":
                source = "".join(cell["source"])
                source = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!")))
                blocks.append((f"{notebook.name} cell {i}", source))
    return blocks


def used_names() -> set[str]:
    """Dotted workbench names the code imports or spells out (``workbench.x.y``)."""
    names = set()
    for where, code in code_blocks():
        tree, bound = ast.parse(code, where), {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "workbench":
                for alias in node.names:
                    bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "workbench":
                        bound[alias.asname or alias.name] = alias.name if alias.asname else "workbench"
        names.update(bound.values())
        names.update(f"{bound[node.value.id]}.{node.attr}" for node in ast.walk(tree)   # isa.inspect after
                     if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)  # from workbench
                     and node.value.id in bound)                                             # import isa
        names.update(DOTTED.findall(code))
    return names


def resolve(dotted: str):
    """Import the longest module prefix of ``dotted`` and read the rest as attributes."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[i:]:
            found = getattr(found, attribute)
        return found
    raise ModuleNotFoundError(dotted)


def test_every_workbench_module_imports():
    modules = [m.name for m in pkgutil.walk_packages(workbench.__path__, "workbench.")]
    assert "workbench.harness.check" in modules and "workbench.learn.exercises.catalog.gemm" in modules
    for name in modules:
        importlib.import_module(name)


def test_readme_and_notebooks_use_names_that_exist():
    names = used_names()
    assert {"workbench.isa.inspect", "workbench.format_table", "workbench.widgets.LadderProfiler"} <= names
    missing = []
    for name in sorted(names):
        try:
            resolve(name)
        except (ImportError, AttributeError) as error:
            missing.append(f"{name}: {error}")
    assert not missing, "\n".join(missing)


@pytest.mark.parametrize("name", ["check", "results", "exercises"])
def test_public_faces_are_one_module_under_two_names(name):
    public = importlib.import_module(f"workbench.{name}")
    home = importlib.import_module({"check": "workbench.harness.check", "results": "workbench.harness.results",
                                    "exercises": "workbench.learn.exercises"}[name])
    assert public is home


def test_workbench_check_stays_the_function_after_importing_the_module():
    import workbench.check  # noqa: F401  (binds nothing new: the alias is in sys.modules already)

    assert callable(workbench.check) and workbench.check is importlib.import_module("workbench.harness.check").check



def test_no_package_under_a_second_name_exports_a_name_one_of_its_submodules_takes():
    """Importing a submodule binds it on its package under its own name. A package that the
    import system also knows under a second name (``workbench.exercises`` is
    ``workbench.learn.exercises``) loads a second copy of a submodule imported by that name
    (``import workbench.exercises.hints``), and the binding then turns a function of the same
    name into the module: ``exercises.hints`` did, beside ``exercises/hints.py``."""
    import sys

    for info in pkgutil.walk_packages(workbench.__path__, "workbench."):
        importlib.import_module(info.name)
    aliased = {module for name, module in list(sys.modules.items())
               if name.startswith("workbench.") and getattr(module, "__name__", name) != name
               and hasattr(module, "__path__")}
    assert workbench.exercises in aliased
    clashes = [f"{package.__name__}.{name}" for package in aliased
               for name in {m.name for m in pkgutil.iter_modules(package.__path__)}
               if name in getattr(package, "__all__", ()) and not inspect.ismodule(getattr(package, name))]
    assert not clashes, clashes
