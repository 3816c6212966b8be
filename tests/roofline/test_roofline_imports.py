"""roofline stands alone: no project imports, and no altair until a chart is asked for."""

import ast
import subprocess
import sys
from pathlib import Path

import roofline

PACKAGE = Path(roofline.__file__).parent


def test_imports_nothing_from_the_project():
    for source in PACKAGE.glob("*.py"):
        for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level \
                else []
            assert not any(n.split(".")[0] in ("kernels", "workbench") for n in names), source


def test_model_works_without_loading_altair():
    code = ("import sys, roofline; roofline.attainable('MI300X', 10, 'bf16'); "
            "assert 'altair' not in sys.modules; roofline.chart; "
            "assert 'altair' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=PACKAGE.parent)
