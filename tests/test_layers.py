"""Imports run one way: no circle anywhere in kernels/, roofline/ or workbench/, and no
import from a lower layer into a higher one (the table in ``workbench/__init__.py``).

Read from the source (tests/import_graph.py), so a lazy import inside a function counts:
it is a dependency all the same.
"""
from __future__ import annotations

import pytest

import import_graph
import workbench

OURS = ("kernels", "roofline", "workbench")
# Below workbench (DESIGN.md): kernels and roofline import nothing of ours but themselves.
MAY_IMPORT = {"kernels": {"kernels"}, "roofline": {"roofline"}}
# Modules of workbench's top that are not in a layer package: the root and its public face
# (they re-export), the tools a user runs.
FACES = {"workbench", "workbench.exercises"}
TOOLS = {"workbench.cli", "workbench.gpu_report", "workbench.gpu_report_fp8", "workbench.gpu_report_goals",
         "workbench.grade"}


def layers() -> list[str]:
    """The layer names, lowest first, read from the LAYERS table in workbench's docstring."""
    lines = workbench.__doc__.split("LAYERS\n", 1)[1].split("\n\n", 1)[0].splitlines()
    return [line.split()[0] for line in lines]


def layer_of(module: str) -> int | None:
    """The layer index of a workbench module (None for the faces, which may import anything)."""
    if module in FACES:
        return None
    top = ".".join(module.split(".")[:2])
    names = layers()
    if top in TOOLS:
        return names.index("tools")
    return names.index(top.split(".")[1])


@pytest.fixture(scope="module")
def arrows():
    return import_graph.graph()


def test_no_import_circle(arrows):
    assert import_graph.circles(arrows) == []


@pytest.mark.parametrize("package", ["kernels", "roofline"])
def test_lower_packages_import_nothing_above_them(arrows, package):
    wrong = sorted(f"{m} -> {t}" for m, ts in arrows.items() if m.split(".")[0] == package
                   for t in ts if t.split(".")[0] not in MAY_IMPORT[package])
    assert not wrong, "\n".join(wrong)


def test_every_workbench_module_has_a_layer(arrows):
    names = layers()
    assert names[0] == "harness" and names[-1] == "tools"
    for module in arrows:
        if module.startswith("workbench"):
            layer_of(module)   # raises ValueError for a package missing from the table


def test_workbench_imports_run_down_the_layers(arrows):
    names = layers()
    wrong = []
    for module, targets in arrows.items():
        if not module.startswith("workbench"):
            continue
        for target in targets:
            if target in FACES and module not in FACES:
                wrong.append(f"{module} -> {target} (inside workbench, import the real home)")
            elif target.startswith("workbench") and module not in FACES:
                if layer_of(target) > layer_of(module):
                    wrong.append(f"{module} ({names[layer_of(module)]}) -> {target} ({names[layer_of(target)]})")
    assert not wrong, "\n".join(wrong)


def test_the_graph_sees_lazy_imports_and_circles(tmp_path):
    """The checks above can fail: a lazy import is an arrow, a pair importing each other a circle,
    and an import under ``if TYPE_CHECKING:`` is not an arrow."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("def f():\n    from . import b\n")
    (package / "b.py").write_text("from typing import TYPE_CHECKING\nfrom .a import f\n"
                                  "if TYPE_CHECKING:\n    from . import c\n")
    (package / "c.py").write_text("from pkg import b\n")
    arrows = import_graph.graph(tmp_path, ("pkg",))
    assert arrows["pkg.a"] == {"pkg.b"} and arrows["pkg.b"] == {"pkg.a"} and arrows["pkg.c"] == {"pkg.b"}
    assert import_graph.circles(arrows) == [["pkg.a", "pkg.b"]]
