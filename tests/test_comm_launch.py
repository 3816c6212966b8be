"""run_local fails instead of hanging: a stuck rank is killed at the deadline, a raising
rank's traceback reaches the parent, and gloo uses the loopback interface only."""

import os
import time

import pytest
import torch.distributed as dist

from kernels.comm.launch import run_local

pytestmark = pytest.mark.timeout(60)


def _identity(rank, world):
    return rank, world, os.environ["GLOO_SOCKET_IFNAME"], dist.get_backend()


def _rank1_hangs(rank, world):
    if rank == 1:
        time.sleep(600)
    return rank


def _rank0_raises(rank, world):
    if rank == 0:
        raise KeyError("boom")
    return rank


@pytest.mark.timeout(60)
def test_ranks_report_in_order():
    assert run_local(_identity, 2, timeout=45) == [(0, 2, "lo", "gloo"), (1, 2, "lo", "gloo")]


@pytest.mark.timeout(60)
def test_stuck_rank_is_killed():
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="did not finish"):
        run_local(_rank1_hangs, 2, timeout=8)
    assert time.monotonic() - start < 30


@pytest.mark.timeout(60)
def test_failing_rank_raises_with_traceback():
    with pytest.raises(RuntimeError, match="(?s)rank 0 of 2 failed.*KeyError"):
        run_local(_rank0_raises, 2, timeout=45)


def _rank1_aborts(rank, world):
    if rank == 1:
        os.abort()   # as gloo does on a size mismatch: no exception, no result
    time.sleep(600)
    return rank


@pytest.mark.timeout(60)
def test_a_rank_whose_process_dies_is_reported_before_the_deadline():
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="rank 1 of 2 died without a result"):
        run_local(_rank1_aborts, 2, timeout=45)
    assert time.monotonic() - start < 30
