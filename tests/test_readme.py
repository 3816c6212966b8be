"""The README's Python examples run as written."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kernels import triton_version
from workbench.isa import compat

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", README, re.S)


def test_readme_has_python_examples_and_the_quickstart():
    assert len(BLOCKS) >= 2
    quickstart = README.split("## Quickstart")[1].split("##")[0]
    assert "make tour" in quickstart and "make test" in quickstart


@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: b.splitlines()[0][:40])
def test_readme_example_runs(block):
    exec(compile(block, "README.md", "exec"), {})


def test_readme_states_the_triton_range_and_the_matrix_compat_recorded():
    section = README.split("## Supported Triton versions")[1].split("\n## ")[0]
    record = json.loads(compat.RECORDED.read_text())
    assert f"Triton **{triton_version.gpu_range_text()}**" in section and "make compat" in section
    assert compat.matrix(record) in section and record["date"] in section
