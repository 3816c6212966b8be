"""SIMT launches go on torch's current stream, so they are ordered with the torch ops around them."""
from __future__ import annotations

import contextlib
import importlib
import sys
from types import SimpleNamespace

import pytest
import torch

import kernels
from kernels import simt as simt_module
from kernels.backend import Backend

SIMT_RUNGS = [r for r in kernels.variants("gemm") if r.kind == "simt"]


class FakeNumba:
    """numba.cuda / numba.hip as far as a launch on a GPU touches them."""

    def external_stream(self, ptr: int):
        return ("numba stream wrapping", ptr)

    def as_cuda_array(self, tensor: torch.Tensor):
        return tensor


class RecordingKernel:
    """Stands in for a compiled SIMT kernel: records each launch configuration."""

    def __init__(self):
        self.launches = []

    def __getitem__(self, config):
        self.launches.append(config)
        return lambda *args: None


def test_the_simulator_launches_on_numbas_default_stream():
    assert simt_module.current_stream(torch.device("cpu")) == 0


@pytest.mark.parametrize("rung", SIMT_RUNGS, ids=lambda r: r.title)
def test_a_gpu_launch_goes_on_torchs_current_stream(rung, monkeypatch):
    asked = []

    def current_stream(device=None):
        asked.append(device)
        return SimpleNamespace(cuda_stream=0xBEEF)

    monkeypatch.setattr(simt_module, "_BACKEND", Backend("cuda", "sm_90", "a pretend GPU", 132))
    monkeypatch.setattr(simt_module, "simt", FakeNumba())
    monkeypatch.setattr(torch.cuda, "current_stream", current_stream)
    module = importlib.import_module(rung.module)
    kernel_names = [name for name, obj in vars(module).items()
                    if name.endswith("_kernel") and hasattr(obj, "__getitem__")]
    assert len(kernel_names) == 1, kernel_names
    kernel = RecordingKernel()
    monkeypatch.setattr(module, kernel_names[0], kernel)

    rung(torch.randn(5, 3), torch.randn(3, 4))
    assert asked == [torch.device("cpu")]   # the device of the output (here a CPU tensor)
    assert [config[2] for config in kernel.launches] == [("numba stream wrapping", 0xBEEF)]


@pytest.mark.gpu
@pytest.mark.parametrize("rung", SIMT_RUNGS, ids=lambda r: r.title)
def test_a_simt_rung_is_ordered_with_torch_on_a_side_stream(rung):
    """Inputs finished on stream s just before the launch, with s kept busy first: a launch on
    another stream would read them unfinished."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        a, b = torch.randn(512, 256, device="cuda"), torch.randn(256, 384, device="cuda")
        torch.cuda._sleep(100_000_000)
        a, b = a * 2.0, b + 1.0
        c = rung(a, b)
        expected = a.double() @ b.double()
    torch.cuda.synchronize()
    error = (c.double() - expected).abs().max() / expected.abs().max()
    assert error < 1e-5


class TurnRecordingKernel(RecordingKernel):
    """Also records the GIL's switch interval while the launch runs, then optionally fails."""

    def __init__(self, fail: bool = False):
        super().__init__()
        self.turns, self.fail = [], fail

    def __getitem__(self, config):
        self.launches.append(config)

        def run(*arrays):
            self.turns.append(sys.getswitchinterval())
            if self.fail:
                raise RuntimeError("the kernel failed")
        return run


@pytest.mark.parametrize("fail", (False, True), ids=("returns", "raises"))
def test_a_simulated_launch_takes_short_gil_turns_and_gives_the_interval_back(fail):
    """The simulator's poller holds the GIL for whole turns while woken threads wait: the launch
    shortens them, and the process's own interval is back afterwards, whatever the kernel did."""
    kernel, before = TurnRecordingKernel(fail), sys.getswitchinterval()
    assert before > simt_module.SIMULATOR_GIL_TURN_S   # CPython's default, 5 ms
    with pytest.raises(RuntimeError) if fail else contextlib.nullcontext():
        simt_module.launch(kernel, (1, 1), (4, 4), torch.zeros(4, 4))
    assert kernel.turns == [simt_module.SIMULATOR_GIL_TURN_S]
    assert kernel.launches == [((1, 1), (4, 4), 0)]
    assert sys.getswitchinterval() == before


def test_a_gpu_launch_leaves_the_gil_turns_alone(monkeypatch):
    monkeypatch.setattr(simt_module, "_BACKEND", Backend("cuda", "sm_90", "a pretend GPU", 132))
    monkeypatch.setattr(simt_module, "simt", FakeNumba())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: SimpleNamespace(cuda_stream=1))
    kernel = TurnRecordingKernel()
    simt_module.launch(kernel, (1, 1), (4, 4), torch.zeros(4, 4))
    assert kernel.turns == [sys.getswitchinterval()]
