"""`import kernels` names an unsupported Triton at once, with the range and what to do."""
from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from kernels import triton_version
from kernels.triton_version import UnsupportedTritonError, TritonVersionWarning

FLOOR, NEWEST = (f"{v[0]}.{v[1]}" for v in triton_version.GPU_RANGE)
BELOW = f"{triton_version.oldest()[0]}.{triton_version.oldest()[1] - 1}.1"
ABOVE = f"{triton_version.GPU_RANGE[1][0]}.{triton_version.GPU_RANGE[1][1] + 1}.0"

ROOT = Path(__file__).resolve().parent.parent

# Pretends to be a ROCm machine with an MI300X (or, with gfx950, an MI355X), then imports kernels.
_FAKE_GPU = """
import types, torch
torch.version.hip = "6.4"
torch.cuda.is_available = lambda: True
torch.cuda.get_device_properties = lambda i: types.SimpleNamespace(
    gcnArchName="gfx942:sramecc+:xnack-", name="AMD Instinct", multi_processor_count=304)
"""


def _fake_triton(folder: Path, version: str, *distributions: str) -> Path:
    """A ``triton`` package that must not be imported, owned by the given distributions."""
    (folder / "triton").mkdir(parents=True)
    (folder / "triton" / "__init__.py").write_text(
        f"__version__ = {version!r}\nimport os\n"
        "if os.environ.get('TRITON_MUST_NOT_LOAD'): raise ImportError('import kernels loaded triton')\n")
    for name in distributions or ("triton",):
        info = folder / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        (info / "RECORD").write_text(f"{info.name}/METADATA,,\ntriton/__init__.py,,\n")
    return folder


def _python(code: str, triton_folder: Path, **env) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items()
             if k not in ("KERNELS_BACKEND", "TRITON_INTERPRET", "NUMBA_ENABLE_CUDASIM")}
    clean["PYTHONPATH"] = os.pathsep.join([str(triton_folder), str(ROOT)])
    return subprocess.run([sys.executable, "-c", code], env={**clean, **env},
                          capture_output=True, text=True, timeout=120)


def test_an_older_triton_on_a_gpu_fails_at_import_naming_version_range_and_fix(tmp_path):
    folder = _fake_triton(tmp_path, BELOW + "+rocm6.4", "pytorch-triton-rocm")
    result = _python(_FAKE_GPU + "import kernels", folder, TRITON_MUST_NOT_LOAD="1")
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"kernels.triton_version.UnsupportedTritonError: Triton {BELOW}+rocm6.4 ")
    assert f"Triton {FLOOR} to {NEWEST}" in last and "pytorch-triton-rocm" in last


def test_a_supported_triton_on_a_gpu_imports_quietly_and_is_not_loaded_yet(tmp_path):
    folder = _fake_triton(tmp_path, f"{FLOOR}.0")
    result = _python(_FAKE_GPU + "import sys, kernels; print(kernels.backend.current().name, "
                     "'triton' in sys.modules)", folder, TRITON_MUST_NOT_LOAD="1")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["hip", "False"] and "Warning" not in result.stderr


@pytest.mark.parametrize("arch, warns", [("gfx942", True), ("gfx950", False)])
def test_a_partial_release_warns_at_import_only_where_a_rung_misses_this_gpu(tmp_path, arch, warns):
    release = f"{max(triton_version.PARTIAL)[0]}.{max(triton_version.PARTIAL)[1]}.0"
    assert ("gemm_mxfp4 v0 @ gfx942", "grouped_gemm_mxfp8 v0 @ gfx942") == triton_version.PARTIAL[max(triton_version.PARTIAL)]
    result = _python(_FAKE_GPU.replace("gfx942", arch) + "import kernels", _fake_triton(tmp_path, release))
    assert result.returncode == 0, result.stderr
    assert ("TritonVersionWarning" in result.stderr) == warns, result.stderr
    assert ("gemm_mxfp4 v0 @ gfx942" in result.stderr) == warns


def test_the_interpreter_warns_below_its_floor_and_says_why(tmp_path):
    result = _python("import kernels", _fake_triton(tmp_path, "3.6.0"))
    assert result.returncode == 0, result.stderr
    assert "TritonVersionWarning: Triton 3.6.0 is installed" in result.stderr
    assert "needs Triton >= 3.9" in result.stderr and "NumPy >= 2.4" in result.stderr


def test_two_distributions_owning_triton_leave_the_module_to_say(tmp_path):
    folder = _fake_triton(tmp_path, "3.2.0", "triton", "pytorch-triton-rocm")
    (folder / "triton" / "__init__.py").write_text("__version__ = '3.7.0'\n")  # whose files won
    result = _python("from kernels import triton_version; print(triton_version.installed_version())",
                     folder)
    assert result.stdout.split()[-1:] == ["3.7.0"], result.stderr


@pytest.mark.parametrize("backend", ["hip", "cuda"])
def test_gpu_floor_raises_and_newer_than_tested_warns(backend):
    with pytest.raises(UnsupportedTritonError, match=f"Triton {BELOW} is installed"):
        triton_version.check(backend, BELOW)
    with pytest.warns(TritonVersionWarning, match=f"Triton {ABOVE} is newer.*make compat"):
        triton_version.check(backend, ABOVE)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        triton_version.check(backend, f"{NEWEST}.0")
        triton_version.check(backend, f"{FLOOR}.0")


@pytest.mark.parametrize("release", sorted(triton_version.PARTIAL))
def test_a_release_that_misses_some_rungs_warns_naming_them(release):
    missing = triton_version.PARTIAL[release]
    with pytest.warns(TritonVersionWarning) as caught:
        triton_version.check("hip", f"{release[0]}.{release[1]}.0", "gfx90a")  # not compiled for
    message = str(caught[0].message)
    assert all(case in message for case in missing) and f"{FLOOR} to {NEWEST}" in message


@pytest.mark.parametrize("release", sorted(triton_version.PARTIAL))
@pytest.mark.parametrize("target", triton_version.TARGETS)
def test_on_a_compat_target_only_its_own_missing_rungs_are_named(release, target):
    own = [c for c in triton_version.PARTIAL[release] if c.endswith(f" @ {target}")]
    arch = target.replace("sm", "sm_")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        triton_version.check("cuda" if arch.startswith("sm_") else "hip", f"{release[0]}.{release[1]}.0", arch)
    assert [all(c in str(w.message) for c in own) for w in caught] == ([True] if own else [])
    assert not any(" @ " + other in str(w.message) for w in caught
                   for other in triton_version.TARGETS if other != target)


def test_the_targets_are_those_compat_compiles_for():
    from workbench import isa

    assert triton_version.TARGETS == tuple(isa.TARGETS)


def test_interpreter_at_its_floor_is_quiet_whatever_the_gpu_range():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        triton_version.check("interpreter", "3.9.0")
        triton_version.check("interpreter", ABOVE)


def test_version_strings_of_local_builds_are_read():
    assert triton_version.minor("3.4.0+rocm6.4.1.git7bb8d9a") == (3, 4)
    assert triton_version.minor("3.10.0") == (3, 10)
    with pytest.raises(ValueError, match="'nightly'"):
        triton_version.minor("nightly")
