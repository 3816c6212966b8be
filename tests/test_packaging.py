"""pyproject.toml: every dependency comes from a package index, so the package can be published."""
from __future__ import annotations

from pathlib import Path

import pytest
from packaging.requirements import Requirement

tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")

PROJECT = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())["project"]
DEPENDENCIES = [*PROJECT["dependencies"],
                *(dep for extra in PROJECT["optional-dependencies"].values() for dep in extra)]


def test_no_dependency_is_a_direct_url():
    direct = [dep for dep in DEPENDENCIES if Requirement(dep).url]
    assert not direct, f"PyPI refuses packages with direct URL dependencies: {direct}"


def test_the_amd_extra_takes_numba_hip_from_pypi():
    numba_hip = [Requirement(dep) for dep in PROJECT["optional-dependencies"]["amd"]
                 if Requirement(dep).name == "numba-hip"]
    assert len(numba_hip) == 1 and numba_hip[0].url is None
    assert numba_hip[0].specifier.contains("0.2.1") and not numba_hip[0].specifier.contains("0.2.0")
