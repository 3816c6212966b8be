"""Run a function on p local processes joined by a gloo (or NCCL) process group, with a deadline.

Tests and the cost-model measurements need a few ranks on one machine. Everything here
is chosen so that a broken collective fails instead of hanging a CI job: the processes
talk over 127.0.0.1 only (``GLOO_SOCKET_IFNAME=lo``), the rendezvous store is opened by
the parent on a port the OS assigns and held for the whole run (so no other job can take
the port between choosing and binding it), the process group has a timeout, and the
parent kills every child once ``timeout`` seconds have passed and raises ``TimeoutError``.

Children come from a fork server that has imported torch once (start method
"forkserver"): importing torch in every fresh child cost seconds per rank, and a plain
fork of a parent that already ran torch ops can inherit a stuck thread pool. The server
also imports ``torch._dynamo``, which torch would otherwise import at each rank's first
custom op call (``torch._compile``'s lazy import: some 900 modules, sympy and triton among
them; kernels is imported before it, to pick the backend before triton loads). Measured
once, one thread, on a 2-core Intel Xeon (2026-12-05): the CPU time of a rank's first forward and
backward of a small ``kernels.MoE``, 1.25 s -> 0.34 s (its second: 0.19 s); a test checks only
that ranks start with it imported.

Results come back by value: each rank pickles its result itself, with the standard
pickler, and sends bytes. Through a multiprocessing queue, torch would send each tensor
as a file descriptor that the parent fetches from the rank's process while unpickling;
a rank that had already exited by then (all ranks exit the moment they return) left
the parent with ``ConnectionResetError``, ``EOFError`` or, once the rank's exit had
unlinked the socket file it serves descriptors on, ``FileNotFoundError``: on a loaded
machine, often.
"""

import multiprocessing
import os
import pickle
import queue
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist

_HOST = "127.0.0.1"
_POLL_S = 0.5   # how often the parent looks for a rank whose process died


def _child(fn, rank, world, port, group_timeout, backend, args, results):
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    try:
        timeout = timedelta(seconds=group_timeout)
        store = dist.TCPStore(_HOST, port, is_master=False, timeout=timeout)
        if backend == "nccl":   # one GPU per rank; RCCL answers to "nccl" on ROCm
            torch.cuda.set_device(rank)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
        # every rank finishes connecting before any runs fn: a rank that returned at once
        # and closed its group could otherwise cut a peer's connection set-up short
        dist.barrier()
        try:
            value = pickle.dumps(fn(rank, world, *args), protocol=pickle.HIGHEST_PROTOCOL)
        finally:
            dist.destroy_process_group()
        results.put((rank, True, value))
    except BaseException:
        results.put((rank, False, traceback.format_exc()))


def run_local(fn, world, *args, timeout=60.0, group_timeout=20.0, backend="gloo"):
    """``[fn(rank, world, *args) for rank in range(world)]``, each rank in its own process.

    ``fn`` must be importable by name (the children import it) and return something
    picklable; tensors come back as copies. A rank that raises, or returns something
    that cannot be pickled, makes this raise ``RuntimeError`` with its traceback.
    ``backend="nccl"`` (NCCL, or RCCL on ROCm) puts rank r on GPU r, in spawned processes.
    """
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
    if backend == "nccl":   # importing kernels touches CUDA, which a forked child cannot reuse
        ctx = multiprocessing.get_context("spawn")
    else:
        ctx = multiprocessing.get_context("forkserver")
        # kernels (through kernels.comm) before torch._dynamo, which imports triton: see the docstring
        ctx.set_forkserver_preload(["torch.distributed", "kernels.comm", "torch._dynamo"])
    results = ctx.Queue()
    store = dist.TCPStore(_HOST, 0, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=group_timeout))
    port = store.port
    procs = [ctx.Process(target=_child, daemon=True,
                         args=(fn, r, world, port, group_timeout, backend, args, results))
             for r in range(world)]
    for proc in procs:
        proc.start()
    deadline = time.monotonic() + timeout
    got = {}
    done = False
    try:
        while len(got) < world:
            try:  # short waits, so a rank whose process died is noticed before the deadline
                rank, ok, value = results.get(timeout=min(_POLL_S, max(0.1, deadline - time.monotonic())))
            except queue.Empty:
                dead = [r for r, proc in enumerate(procs) if proc.exitcode is not None and r not in got]
                if dead and results.empty():   # a result it sent before exiting would be queued
                    raise RuntimeError(f"rank {dead[0]} of {world} died without a result (exit code "
                                       f"{procs[dead[0]].exitcode}; gloo aborts a process, e.g. when "
                                       f"a receive's size differs from its send's)") from None
                if time.monotonic() < deadline:
                    continue
                raise TimeoutError(f"{world} ranks did not finish within {timeout} s "
                                   f"(finished: {sorted(got)})") from None
            if not ok:
                raise RuntimeError(f"rank {rank} of {world} failed:\n{value}")
            got[rank] = pickle.loads(value)
        done = True
    finally:
        # After every result, the ranks are leaving: a grace to exit. After a failure the others
        # may wait in a collective for the failed rank until the group's timeout: killed now.
        for proc in procs:
            proc.join(timeout=max(0.1, min(5.0, deadline - time.monotonic())) if done else 0)
            if proc.is_alive():
                proc.kill()
                proc.join()
    return [got[r] for r in range(world)]
