"""Run a function on p local processes joined by a gloo process group, with a deadline.

Tests and the cost-model measurements need a few ranks on one machine. Everything here
is chosen so that a broken collective fails instead of hanging a CI job: the processes
talk over 127.0.0.1 only (``GLOO_SOCKET_IFNAME=lo``), the port is a free one the OS
picked, the process group has a timeout, and the parent kills every child once
``timeout`` seconds have passed and raises ``TimeoutError``.

Children come from a fork server that has imported torch once (start method
"forkserver"): importing torch in every fresh child cost seconds per rank, and a plain
fork of a parent that already ran torch ops can inherit a stuck thread pool.
"""

import multiprocessing
import os
import queue
import socket
import time
import traceback
from datetime import timedelta


def free_port() -> int:
    """A port on 127.0.0.1 that was free a moment ago (the OS picks it: bind to port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _child(fn, rank, world, port, group_timeout, args, results):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    import torch.distributed as dist

    try:
        dist.init_process_group("gloo", rank=rank, world_size=world,
                                timeout=timedelta(seconds=group_timeout))
        # every rank finishes connecting before any runs fn: a rank that returned at once
        # and closed its group could otherwise cut a peer's connection set-up short
        dist.barrier()
        try:
            results.put((rank, True, fn(rank, world, *args)))
        finally:
            dist.destroy_process_group()
    except BaseException:
        results.put((rank, False, traceback.format_exc()))


def run_local(fn, world, *args, timeout=60.0, group_timeout=20.0):
    """``[fn(rank, world, *args) for rank in range(world)]``, each rank in its own process.

    ``fn`` must be importable by name (the children import it) and return something
    picklable. A rank that raises makes this raise ``RuntimeError`` with its traceback.
    """
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["torch.distributed", "kernels.comm"])
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_child, args=(fn, r, world, port, group_timeout, args, results),
                         daemon=True) for r in range(world)]
    for proc in procs:
        proc.start()
    deadline = time.monotonic() + timeout
    got = {}
    try:
        while len(got) < world:
            try:
                rank, ok, value = results.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(f"{world} ranks did not finish within {timeout} s "
                                   f"(finished: {sorted(got)})") from None
            if not ok:
                raise RuntimeError(f"rank {rank} of {world} failed:\n{value}")
            got[rank] = value
    finally:
        for proc in procs:
            proc.join(timeout=max(0.1, min(5.0, deadline - time.monotonic())))
            if proc.is_alive():
                proc.kill()
                proc.join()
    return [got[r] for r in range(world)]
