"""Without numba (no `cpu`/`cuda`/`amd` extra) only the SIMT rungs go; everything else works.

Each test runs Python in a subprocess whose ``sitecustomize`` makes ``numba`` and
``numba_cuda`` unimportable, as in an environment installed without the extras. The
blocker travels on ``PYTHONPATH``, so the ISA inspector's helper process, which
inherits it, runs without numba too.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOT_HERE = "not available here: install the `cpu` extra"

BLOCKER = '''\
"""Makes numba unimportable, as in an install without the cpu/cuda/amd extra."""
import sys


class _NoNumba:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("numba", "numba_cuda"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _NoNumba())
'''


@pytest.fixture(scope="module")
def without_numba(tmp_path_factory):
    """Run ``python args...`` on the interpreter backend with numba unimportable."""
    blocker = tmp_path_factory.mktemp("no_numba")
    (blocker / "sitecustomize.py").write_text(BLOCKER)
    path = os.pathsep.join(p for p in (str(blocker), str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**{k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "NUMBA_ENABLE_CUDASIM")},
           "PYTHONPATH": path, "KERNELS_BACKEND": "interpreter"}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, *args], env=env, cwd=ROOT, capture_output=True,
                              text=True, timeout=600)
    return run


KERNELS_WITHOUT_NUMBA = f'''
import pytest, sys, torch
with pytest.raises(ModuleNotFoundError, match="No module named 'numba'"):
    import numba

import kernels
a, b = torch.randn(37, 29), torch.randn(29, 53)
assert torch.allclose(kernels.matmul(a, b), a @ b, rtol=1e-5, atol=1e-5)

simt = [r for r in kernels.variants("gemm") if r.kind == "simt"]
assert [r.label for r in simt] == ["v0", "v1"]
assert not any(r.runs_here() for r in simt)
assert all(r.unavailable == "{NOT_HERE}" for r in simt)
assert all(r.runs_here() for r in kernels.variants("gemm") if r.kind != "simt")
with pytest.raises(ImportError, match="gemm v0 simt_naive is {NOT_HERE}"):
    kernels.get("gemm", "v0")(a, b)
from kernels.gemm.v1_simt_lds_tiled import gemm_v1   # the module function itself, too
with pytest.raises(ImportError, match="SIMT kernels are {NOT_HERE} .No module named 'numba'"):
    gemm_v1(a, b)

from workbench import isa
assert "v_mfma_f32_32x32x8_bf16" in isa.inspect("gemm", "v2", "gfx942").matrix_instructions
assert "numba" not in sys.modules
print("ok")
'''


def test_kernels_and_the_isa_inspector_work_without_numba(without_numba):
    result = without_numba("-c", KERNELS_WITHOUT_NUMBA)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-1] == "ok"


def test_workbench_info_lists_the_simt_rungs_as_not_available(without_numba):
    result = without_numba("-m", "workbench.cli", "info")
    assert result.returncode == 0, result.stderr
    rows = {line.split()[1]: line for line in result.stdout.splitlines() if line.startswith("gemm ")}
    assert NOT_HERE in rows["v0"] and NOT_HERE in rows["v1"]
    assert rows["v2"].rstrip().endswith("yes") and rows["ref"].rstrip().endswith("yes")


def test_workbench_check_passes_for_the_triton_rungs_without_numba(without_numba):
    result = without_numba("-m", "workbench.cli", "check", "gemm", "--dtype", "fp32")
    assert result.returncode == 0, result.stderr + result.stdout
    assert "v2 triton_tile" in result.stdout and "v6 persistent" in result.stdout
    assert "simt" not in result.stdout and " 0 failed" in result.stdout
