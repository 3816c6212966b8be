"""Backend selection: automatic on a CPU machine, forced by env, final once kernels load."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import kernels
from kernels import backend
from kernels.simt import as_simt_array, simt


def _python(code: str, **env) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items()
             if k not in ("KERNELS_BACKEND", "TRITON_INTERPRET", "NUMBA_ENABLE_CUDASIM")}
    return subprocess.run([sys.executable, "-c", code], env={**clean, **env},
                          capture_output=True, text=True, timeout=120)


def test_cpu_machine_picks_interpreter_without_env():
    result = _python("import kernels, os; b = kernels.backend.current(); "
                     "print(b.name, b.device, os.environ['TRITON_INTERPRET'], os.environ['NUMBA_ENABLE_CUDASIM'])")
    assert result.returncode == 0, result.stderr
    if "cuda" in result.stdout.split()[:1]:
        pytest.skip("this machine has a GPU")
    assert result.stdout.split() == ["interpreter", "cpu", "1", "1"]


def test_a_process_whose_first_op_call_is_compiled_traces_the_backend():
    """torch.compile traces the device check of a public op's first call in a process.

    The check once kept the last backend in a module-level tuple, which Dynamo could not
    guard on before an eager call had filled it: ``workbench train --compile`` crashed in
    a fresh process (``Unexpected type <class 'kernels.backend.Backend'>``), and the suite
    passed only because some earlier test had called an op eagerly."""
    result = _python(
        "import torch, kernels\n"
        "layer, x = kernels.nn.Linear(7, 3), torch.randn(5, 7, requires_grad=True)\n"
        "f = torch.compile(layer, fullgraph=True, backend='aot_eager')\n"
        "f(x).sum().backward()\n"
        "torch.testing.assert_close(x.grad, layer.weight.sum(0).expand(5, 7))\n"
        "print(kernels.backend.current().device)")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split()[-1] == kernels.backend.current().device


def test_interpreter_kernels_are_defined_as_interpreted():
    kernels.variants("gemm")
    from triton.runtime.interpreter import InterpretedFunction

    from kernels.gemm import v2_triton_tile
    assert isinstance(v2_triton_tile._gemm_tile_kernel, InterpretedFunction)


def test_unknown_backend_name_is_a_clear_error():
    result = _python("import kernels", KERNELS_BACKEND="rocm")
    assert result.returncode != 0
    assert "KERNELS_BACKEND='rocm'" in result.stderr and "interpreter" in result.stderr


def test_asking_for_a_missing_gpu_is_a_clear_error():
    if backend.current().is_gpu:
        pytest.skip("this machine has a GPU")
    result = _python("import kernels", KERNELS_BACKEND="hip")
    assert result.returncode != 0
    assert "KERNELS_BACKEND=hip was asked for" in result.stderr


def test_force_interpreter_before_first_kernel():
    result = _python("import kernels; kernels.backend.force_interpreter(); "
                     "print(kernels.variants('gemm')[0].runs_here(), kernels.backend.current().name)")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "interpreter"]


def test_changing_triton_interpret_behind_the_backend_is_caught(monkeypatch):
    monkeypatch.setattr(backend, "_kernels_loaded", False)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET was changed"):
        backend.mark_kernels_loaded()


def test_backend_record_describes_the_interpreter():
    here = backend.current()
    assert here.name == "interpreter" and here.device == "cpu"
    assert here.is_interpreter and not here.is_gpu and here.compute_units == 0


@simt.jit
def _add_one(x):
    i = simt.grid(1)
    if i < x.shape[0]:
        x[i] += 1.0


def test_simt_selector_binds_the_simulator_on_cpu():
    """A kernel written once against `simt` runs in the simulator (module-level, like rungs)."""
    t = torch.zeros(37)
    _add_one[2, 32](as_simt_array(t))   # the view writes through into the tensor
    assert np.array_equal(t.numpy(), np.ones(37, dtype=np.float32))
    assert os.environ["NUMBA_ENABLE_CUDASIM"] == "1"
