"""run_local fails instead of hanging: a stuck rank is killed at the deadline, a raising
rank's traceback reaches the parent, and gloo uses the loopback interface only. Its
results come back by value, even when every rank exits the moment it returns on a
loaded machine.

Deadlines have the headroom of a loaded 2-core machine (4x slower than an idle one):
run_local's own ``timeout`` ends a hang, and pytest-timeout, above it, also covers the
fork server's start (a fresh interpreter importing torch, outside run_local's deadline).
"""

import multiprocessing.process
import os
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist

from kernels.comm.launch import run_local

pytestmark = pytest.mark.timeout(150)


def _identity(rank, world):
    return rank, world, os.environ["GLOO_SOCKET_IFNAME"], dist.get_backend()


@pytest.fixture(scope="module")
def warm():
    """The fork server started by a first call, so that a test's elapsed time is its own call's."""
    run_local(_identity, 2, timeout=60)


def _rank1_hangs(rank, world):
    if rank == 1:
        time.sleep(600)
    return rank


def _rank0_raises(rank, world):
    if rank == 0:
        raise KeyError("boom")
    return rank


def test_ranks_report_in_order():
    assert run_local(_identity, 2, timeout=60) == [(0, 2, "lo", "gloo"), (1, 2, "lo", "gloo")]


def _dynamo_imported(rank, world):
    return "torch._dynamo" in sys.modules


def test_ranks_start_with_torch_dynamo_imported():
    """By the fork server, once: else each rank's first custom op call imports it (launch's
    docstring)."""
    assert run_local(_dynamo_imported, 1, timeout=60) == [True]


def test_stuck_rank_is_killed(warm):
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="did not finish"):
        run_local(_rank1_hangs, 2, timeout=3)   # rank 1 never returns: any deadline fails it
    assert time.monotonic() - start < 30


def test_failing_rank_raises_with_traceback():
    with pytest.raises(RuntimeError, match="(?s)rank 0 of 2 failed.*KeyError"):
        run_local(_rank0_raises, 2, timeout=60)


def _rank1_aborts(rank, world):
    if rank == 1:
        os.abort()   # as gloo does on a size mismatch: no exception, no result
    time.sleep(600)
    return rank


def test_a_rank_whose_process_dies_is_reported_before_the_deadline(warm, monkeypatch):
    """Reported, and the rank still waiting (here asleep; in gloo, in a collective for the dead
    rank) is killed at once: no exit grace is waited out after a failure."""
    graces, join = [], multiprocessing.process.BaseProcess.join
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "join",
                        lambda self, timeout=None: graces.append(timeout) or join(self, timeout))
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="rank 1 of 2 died without a result"):
        run_local(_rank1_aborts, 2, timeout=90)
    assert time.monotonic() - start < 45
    assert [g for g in graces if g is not None] == [0, 0], graces   # then the sleeper's kill, joined


def _tensors(rank, world, count):
    return [torch.full((3,), float(rank * count + i)) for i in range(count)]


def test_tensors_come_back_after_their_ranks_exit_on_a_loaded_machine(warm):
    """Once, each returned tensor travelled as a file descriptor that the parent fetched
    from its rank's process while unpickling: a rank that had already exited left the
    parent with ConnectionResetError or FileNotFoundError (the rank's socket gone). A busy
    process widens that window; many tensors per call open it on nearly every call."""
    calls, count, budget = 8, 32, 60.0
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        deadline = time.monotonic() + budget
        for _ in range(calls):
            got = run_local(_tensors, 2, count, timeout=max(1.0, deadline - time.monotonic()))
            assert [[t.tolist() for t in tensors] for tensors in got] == [
                [[float(rank * count + i)] * 3 for i in range(count)] for rank in range(2)]
    finally:
        busy.kill()
        busy.wait()


def _rank1_returns_a_lambda(rank, world):
    return (lambda: rank) if rank == 1 else rank


def test_a_result_that_cannot_be_pickled_is_its_ranks_failure():
    with pytest.raises(RuntimeError, match="(?s)rank 1 of 2 failed.*pickle"):
        run_local(_rank1_returns_a_lambda, 2, timeout=60)
