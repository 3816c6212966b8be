"""Test setup: CPU interpreter by default; the ``gpu`` marker skips cleanly without a GPU.

On a GPU machine, ``WORKBENCH_TEST_GPU=1 pytest -m gpu`` runs the GPU tests on the real
backend (the rest of the suite is written for the interpreter and its CPU tensors).
"""
from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

import pytest

# pytest rewrites the asserts of test modules and conftests only: the helper modules beside them
# (tests/**/*.py without the test_ prefix, each imported by its bare name) get the same failure reports.
pytest.register_assert_rewrite(*sorted(path.stem for path in Path(__file__).parent.rglob("*.py")
                                       if not path.stem.startswith(("test_", "conftest", "__init__"))))

# Before anything imports kernels: tests run the interpreter unless a GPU run is asked for.
if os.environ.get("WORKBENCH_TEST_GPU") != "1":
    os.environ.setdefault("KERNELS_BACKEND", "interpreter")

# pytest-xdist's workers already keep every core busy: each worker's OpenMP pool (torch's
# intra-op threads, in it and in the processes it starts: gloo ranks, notebook kernels) gets
# its share of the cores, not all of them. Two workers with two threads each on two cores
# spin at every parallel region's barrier for the other worker's time slice: a 21-row
# ``index_add`` took 0.4 ms so (0.02 ms with one thread), several ms under load.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // _WORKERS)))

import kernels  # noqa: E402
import torch.distributed as dist  # noqa: E402

import host_sync  # noqa: E402  (tests/ is on sys.path: pytest puts a conftest's folder there)


@pytest.fixture(autouse=True)
def fresh_tuning_cache(tmp_path_factory, monkeypatch):
    """Every test tunes from nothing, into a cache folder of its own (never the user's):
    choices timed by one test must not be another's cache hits."""
    monkeypatch.setenv("KERNELS_TUNING_DIR", str(tmp_path_factory.mktemp("tuning")))
    if "kernels.tuning" in sys.modules:   # else nothing was chosen yet, and triton stays unloaded
        sys.modules["kernels.tuning"].forget()
    yield
    if "kernels.tuning" in sys.modules:
        sys.modules["kernels.tuning"].forget()


@pytest.fixture
def no_host_sync():
    """For the whole test, any read of a tensor's values on the host raises
    (:func:`host_sync.no_host_sync`)."""
    with host_sync.no_host_sync():
        yield


@pytest.fixture
def trap_host_syncs():
    """``trap_host_syncs(allowed=(fn, ...))``: from then on until the test ends,
    :func:`host_sync.no_host_sync` with those functions allowed; returns its list of reads."""
    with contextlib.ExitStack() as stack:
        yield lambda allowed=(): stack.enter_context(host_sync.no_host_sync(allowed))


@pytest.fixture
def short_deadlocks(monkeypatch):
    """For a test whose collective exercise answer deadlocks by design: its ranks' receives wait
    the process group's timeout before the grade can say so. 2 s instead of the learner's 8
    (which leaves a slow machine's legitimate waits room) still fails every such answer."""
    from workbench.learn.exercises.catalog import comm
    monkeypatch.setattr(comm, "GROUP_TIMEOUT_S", 2.0)


@pytest.fixture
def one_rank():
    """A gloo process group of one rank in this process, destroyed after the test."""
    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


@pytest.fixture
def make_row():
    """A valid results row; keyword arguments change fields."""
    from workbench.results import ResultRow

    def make(**change):
        base = dict(op="gemm", rung="v2", name="triton_tile", shape="4096x4096x4096", dtype="bfloat16",
                    ms=0.5, tflops=274.9, gbps=201.3, ratio_to_ref=0.8, gpu="AMD Instinct MI300X",
                    backend="hip", arch="gfx942", torch_version="2.13.0", triton_version="3.9.0",
                    commit="abc123", timestamp="2026-11-30T12:00:00+00:00")
        return ResultRow(**{**base, **change})
    return make


def _long(item) -> bool:
    """A test that takes tens of seconds: marked ``slow`` or ``browser``, or a notebook nbmake runs."""
    return type(item).__module__.startswith("nbmake") or any(item.iter_markers("slow")) \
        or any(item.iter_markers("browser"))


@pytest.hookimpl(trylast=True)   # after ``-m``/``-k`` have deselected what they deselect
def pytest_collection_modifyitems(config, items):
    """GPU tests skip on the interpreter. A notebook that a selected test runs cell by cell
    (marked ``runs_notebook``: the browser tests' Run All and the Binder build's nbconvert,
    each failing on any error) is not run a second time by nbmake: a run of notebook 01
    costs a minute of CI. The long tests run first: pytest-xdist hands out tests in this
    order, so the last ones decide how long one worker waits for the other (collected last,
    the notebooks kept one of two cores idle for the last 50 s of a CI run)."""
    run_elsewhere = {mark.args[0] for item in items for mark in item.iter_markers("runs_notebook")}
    twice = [item for item in items if type(item).__module__.startswith("nbmake")
             and item.path.name in run_elsewhere]
    if twice:
        config.hook.pytest_deselected(items=twice)
        items[:] = [item for item in items if item not in twice]
    items.sort(key=lambda item: not _long(item))   # stable: each group keeps pytest's order
    if kernels.backend.current().is_gpu:
        return
    skip = pytest.mark.skip(reason="needs a GPU (this run uses the Triton interpreter)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def fake_gpu(monkeypatch):
    """Pretend to be a GPU: ``fake_gpu("hip", "gfx942")`` -> the Backend now current.

    Its tensors stay on the CPU, so GPU code paths (planning, the library's operand form,
    refusals) run here. FP8 rungs declare ``native_dtypes()`` when they are imported, so
    they are re-declared as that GPU's import would have declared them.
    """
    import dataclasses

    from kernels import registry
    from kernels.backend import Backend
    from kernels.gemm_fp8.formats import FP8_DTYPES, native_dtypes

    class GpuOnCpu(Backend):
        def __post_init__(self):
            super().__post_init__()
            object.__setattr__(self, "device", "cpu")

    def pretend(name="cuda", arch="sm_90", device_name="NVIDIA H200"):
        backend = GpuOnCpu(name, arch, device_name, 132)
        # Every op imported first, on the real backend: one first imported under the pretended
        # one would keep that GPU's declarations after the test.
        ladders = {op: kernels.variants(op) for op in kernels.ops()}
        monkeypatch.setattr(kernels.backend, "current", lambda: backend)
        for op, ladder in ladders.items():
            monkeypatch.setitem(registry._RUNGS, op, [
                dataclasses.replace(r, dtypes=native_dtypes()) if set(r.dtypes) <= set(FP8_DTYPES)
                else r for r in ladder])
        return backend
    return pretend


@pytest.fixture
def fake_timer(monkeypatch):
    """Replace the benchmark's ``time_ms``: ``fake_timer(ms=[1.0, 0.5], fail={3: exc})``.

    The n-th call (from 1) takes ``ms[(n - 1) % len(ms)]`` milliseconds, or raises
    ``fail[n]``; the timed function is not run. Returns a list of the calls' numbers.
    """
    from workbench.harness import bench
    from workbench.harness.timing import Timing

    def install(ms=(1.0,), fail=None):
        calls = []

        def time_ms(fn, flops=None, bytes_moved=None, **_):
            calls.append(len(calls) + 1)
            if calls[-1] in (fail or {}):
                raise fail[calls[-1]]
            t = ms[(calls[-1] - 1) % len(ms)]
            return Timing(t, t, t, 10, flops, bytes_moved)
        monkeypatch.setattr(bench, "time_ms", time_ms)
        return calls
    return install


@pytest.fixture
def fake_tuner_clock(monkeypatch):
    """Time a tuner's candidates with a fake clock: ``fake_tuner_clock(owner, "launch", ms)``.

    ``owner.launch`` (whose last positional argument is the config) is wrapped to note each
    launch's (BLOCK_M, BLOCK_N); ``kernels.tuning.time_ms`` runs the real launch and
    answers ``ms[that tile]``. Returns the list of tiles timed, in order.
    """
    from kernels import tuning

    def install(owner, name, ms):
        launched, timed = [], []
        real = getattr(owner, name)

        def launch(*args, **kwargs):
            launched.append((args[-1]["BLOCK_M"], args[-1]["BLOCK_N"]))
            return real(*args, **kwargs)

        def time_ms(fn):
            fn()
            timed.append(launched[-1])
            return ms[launched[-1]]

        monkeypatch.setattr(owner, name, launch)
        monkeypatch.setattr(tuning, "time_ms", time_ms)
        return timed
    return install


@pytest.fixture
def clock(monkeypatch):
    """A fake op's tuner clock: ``kernels.tuning.time_ms`` runs the launch, whose answer is
    the candidate's "milliseconds"; returns those timed, in order."""
    from kernels import tuning

    timed = []

    def time_ms(fn):
        timed.append(fn())
        return timed[-1]
    monkeypatch.setattr(tuning, "time_ms", time_ms)
    return timed


@pytest.fixture
def real_tuner_clock(monkeypatch):
    """On a GPU: the tuners time with the real clock, and each time taken is noted in the list returned."""
    from kernels import tuning

    timed, real = [], tuning.time_ms
    monkeypatch.setattr(tuning, "time_ms", lambda fn: timed.append(real(fn)) or timed[-1])
    return timed


@pytest.fixture
def shortlisting_ranker():
    """Install a ranker that shortlists the candidates of the tiles given, in that order:
    ``asked = shortlisting_ranker([(16, 32), (32, 16)])`` (tiles as (BLOCK_M, BLOCK_N));
    ``asked`` collects every problem it was handed. The ranker before is restored after."""
    from kernels import tuning

    asked, before = [], []

    def install(tiles):
        def rank(problem, candidates):
            asked.append(problem)
            found = [(c["BLOCK_M"], c["BLOCK_N"]) for c in candidates]
            return [found.index(tile) for tile in tiles if tile in found]
        before.append(tuning.set_ranker(rank))
        return asked
    yield install
    if before:
        tuning.set_ranker(before[0])
