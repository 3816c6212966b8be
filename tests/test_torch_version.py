"""`import kernels` warns where torch is older than the releases the package was run under."""
from __future__ import annotations

import re
import warnings

import pytest

from kernels import torch_version
from kernels.torch_version import TorchVersionWarning


@pytest.mark.parametrize("version", ["2.11.0+cu130", "2.5.1"])
def test_an_older_cpu_torch_is_told_the_fp8_baseline_fails_and_what_to_install(version):
    with pytest.warns(TorchVersionWarning, match=re.escape(f"torch {version} on the CPU: the FP8 GEMM baseline")
                      + r".*row-wise scales.*from torch 2\.12 on.*pip install torch==2\.13\.0"):
        torch_version.check("interpreter", version)


@pytest.mark.parametrize("backend", ["hip", "cuda"])
def test_a_gpu_torch_older_than_any_tried_is_told_so(backend):
    with pytest.warns(TorchVersionWarning, match=r"torch 2\.10\.0\+rocm6\.4 is older than any torch .*2\.11"):
        torch_version.check(backend, "2.10.0+rocm6.4")


@pytest.mark.parametrize("backend,version", [("interpreter", "2.12.0+cu130"), ("interpreter", "2.15.0"),
                                             ("cuda", "2.11.0+cu130"), ("hip", "2.13.0a0+git1234")])
def test_the_releases_it_was_run_under_are_quiet(backend, version):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch_version.check(backend, version)


def test_the_installed_torch_is_checked_by_default(monkeypatch):
    monkeypatch.setattr(torch_version.torch, "__version__", "2.11.0+cu130")
    with pytest.warns(TorchVersionWarning, match="torch 2.11.0"):
        torch_version.check("interpreter")
