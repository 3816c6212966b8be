"""Per-rank event timelines of a chunked, overlapped layer, and how well they overlap.

A layer that splits its work into chunks (:class:`kernels.moe.ep_layer.ExpertParallelMoE`
with ``ep_chunks > 1``) issues the all-to-all of chunk i+1 before it computes chunk i.
Whether that hides the communication is a measurement, not a promise: :class:`Timeline`
records when each phase of each chunk ran, and :func:`overlap_efficiency` says how much
of the wall time the longer of the two kinds of work filled.

Which clock, :attr:`Timeline.clock` and every event's ``"clock"`` say:

- ``"host"`` (gloo, CPU tensors): seconds of ``time.perf_counter`` since a common start:
  every rank passes a barrier, then reads the clock (CLOCK_MONOTONIC on Linux, one clock
  for all local processes), so local ranks' timelines line up to within the barrier's exit
  skew. A communication event starts when its asynchronous work is issued and ends when
  its future's callback runs, which on gloo is when the collective has completed (not
  when the layer gets round to waiting for it, which would count the layer's own compute
  as communication).
- ``"device"`` (CUDA or ROCm tensors): CUDA/HIP events with timing. On NCCL/RCCL the work's
  future completes when the collective is enqueued, so host stamps would measure
  dispatch, not transfer. Instead each collective is issued from a communication stream
  of the timeline's: an event on that stream before the issue, ``work.wait()`` (which
  makes the issuing stream wait for the communicator's), an event after; the compute
  stream waits for that end event before it uses the output. Compute is bracketed by
  events on the compute (current) stream. Times are ``elapsed_time`` from an event
  recorded after the barrier, read after one synchronize when :attr:`Timeline.events` is
  first read. Each rank's times are on its own GPU's clock, from its own start event, so
  ranks line up only as well as their start events do; efficiencies are per rank and do
  not depend on that. Not run on a GPU yet: the arithmetic is tested with stub events,
  and only a GPU can show that the end event waits for the transfer and that the two
  streams really overlap.

An all-to-all completes only once every peer has sent its block, so a rank's
communication time also holds its wait for slower peers: load imbalance shows up as
communication.
"""
from __future__ import annotations

import contextlib
import time

import torch
import torch.distributed as dist

PHASES = ("dispatch", "compute", "combine")
COMM_PHASES = ("dispatch", "combine")
KEYS = ("rank", "chunk", "phase", "start_s", "end_s")


class _HostClock:
    """``perf_counter`` stamps; a communication ends when its future's callback runs."""
    name = "host"

    def __init__(self):
        self._t0 = time.perf_counter()

    def mark(self) -> float:
        return time.perf_counter()

    def comm(self, issue, inputs, done):
        start = self.mark()
        out, work = issue()
        return out, work.get_future().then(lambda _: done(start, self.mark()))

    def seconds(self, marks) -> list[float]:
        return [m - self._t0 for m in marks]


class _StreamWait:
    """What :meth:`_DeviceClock.comm` returns for the work: ``wait()`` makes the current
    stream wait for the communication stream's end event, without blocking the host."""

    def __init__(self, cuda, event):
        self._cuda, self._event = cuda, event

    def wait(self) -> None:
        self._cuda.current_stream().wait_event(self._event)


class _DeviceClock:
    """Events with timing: compute on the current stream, communication on a side stream."""
    name = "device"

    def __init__(self, cuda):
        self._cuda = cuda
        self._stream = cuda.Stream()
        self._t0 = self.mark()

    def mark(self):
        event = self._cuda.Event(enable_timing=True)
        event.record()        # on the current stream
        return event

    def comm(self, issue, inputs, done):
        compute = self._cuda.current_stream()
        self._stream.wait_stream(compute)                  # the inputs are computed there
        with self._cuda.stream(self._stream):
            for tensor in inputs:                          # read here: not freed too early
                tensor.record_stream(self._stream)
            start = self.mark()
            out, work = issue()
            work.wait()       # this (the communication) stream waits for the collective
            end = self.mark()
        out.record_stream(compute)                         # written here, read there
        done(start, end)
        return out, _StreamWait(self._cuda, end)

    def seconds(self, marks) -> list[float]:
        self._cuda.synchronize()
        return [self._t0.elapsed_time(m) / 1e3 for m in marks]


class Timeline:
    """Collects events ``{"rank", "chunk", "phase", "start_s", "end_s", "clock"}`` in ``events``.

    Construct it on every rank of ``group`` at once: it starts with a barrier. ``device``:
    where the layer's tensors live; a CUDA device (ROCm's included) takes device events,
    anything else host stamps. ``cuda`` replaces ``torch.cuda`` (its ``Event``,
    ``Stream``, ``stream``, ``current_stream``, ``synchronize``) for the device clock, so
    tests can drive it with stubs.
    """

    def __init__(self, group=None, device=None, cuda=None):
        dist.barrier(group=group)
        on_gpu = device is not None and torch.device(device).type == "cuda"
        self._clock = _DeviceClock(cuda or torch.cuda) if on_gpu or cuda is not None \
            else _HostClock()
        self.rank = dist.get_rank(group)
        self._marks: list[tuple] = []
        self._events: list[dict] | None = None

    @property
    def clock(self) -> str:
        """``"device"`` or ``"host"``: what the times are (see the module doc)."""
        return self._clock.name

    def _add(self, chunk: int, phase: str, start, end) -> None:
        self._marks.append((chunk, phase, start, end))

    @contextlib.contextmanager
    def compute(self, chunk: int):
        """Times the block as chunk ``chunk``'s compute."""
        start = self._clock.mark()
        yield
        self._add(chunk, "compute", start, self._clock.mark())

    def comm(self, chunk: int, phase: str, issue, inputs=()):
        """Issues a collective, ``issue() -> (output, work)`` with ``async_op=True``, and
        records it from its issue until it completes; returns (output, handle). Wait on the
        handle, not on ``work``: with host stamps the event is then in ``events``, with
        device events the current stream then waits for the communication stream.
        ``inputs``: tensors the collective reads, kept from reuse until it has."""
        return self._clock.comm(issue, inputs, lambda start, end: self._add(chunk, phase, start, end))

    @property
    def events(self) -> list[dict]:
        """The events, in seconds since the start; with device events the first read
        synchronizes once."""
        if self._events is None:
            times = self._clock.seconds([mark for m in self._marks for mark in m[2:]])
            self._events = [{"rank": self.rank, "chunk": chunk, "phase": phase, "start_s": s,
                             "end_s": e, "clock": self.clock}
                            for (chunk, phase, _, _), s, e in zip(self._marks, times[::2], times[1::2])]
        return self._events


def _union(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of intervals: overlapping events of one kind count once.

    Summed piece by piece, rounding can make it an ulp longer than the distance from the
    first start to the last end (when the pieces tile that distance, e.g. some all-to-all
    is in flight all the time while a peer lags), and an efficiency come out above 1;
    that distance caps it."""
    if not intervals:
        return 0.0
    intervals = sorted(intervals)
    total, reach = 0.0, float("-inf")
    for start, end in intervals:
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return min(total, reach - intervals[0][0])


def checked_events(events) -> list[dict]:
    """The events as a list, or a ValueError naming what a timeline or an efficiency
    cannot use (none at all, a missing key, an unknown phase, an end before its start)."""
    events = list(events)
    if not events:
        raise ValueError("no events: events is empty; record a forward with record_events=True first")
    for i, e in enumerate(events):
        missing = set(KEYS) - set(e) if isinstance(e, dict) else set(KEYS)
        if missing:
            raise ValueError(f"event {i} lacks {sorted(missing)}: each event is a dict with keys {KEYS}")
        if e["phase"] not in PHASES:
            raise ValueError(f"event {i}: phase must be one of {PHASES}, got {e['phase']!r}")
        if not e["end_s"] >= e["start_s"]:
            raise ValueError(f"event {i}: end_s {e['end_s']} is before start_s {e['start_s']}")
    return events


def _rank_times(events: list[dict]) -> tuple[float, float, float]:
    """(T_comm, T_compute, T_total) of one rank's events."""
    comm = _union([(e["start_s"], e["end_s"]) for e in events if e["phase"] in COMM_PHASES])
    compute = _union([(e["start_s"], e["end_s"]) for e in events if e["phase"] == "compute"])
    total = max(e["end_s"] for e in events) - min(e["start_s"] for e in events)
    return comm, compute, total


def phase_seconds(events) -> tuple[float, float]:
    """(T_comm, T_compute) summed over ranks: how balanced the two kinds of work are."""
    events = checked_events(events)
    per_rank = [_rank_times([e for e in events if e["rank"] == r]) for r in sorted({e["rank"] for e in events})]
    return sum(t[0] for t in per_rank), sum(t[1] for t in per_rank)


def overlap_efficiency(events, rank: int | None = None) -> float:
    """``max(T_comm, T_compute) / T_total`` of one rank's events, or of all ranks' (``rank=None``).

    T_comm and T_compute are the lengths of the unions of that rank's communication and
    compute intervals, T_total the span from its first start to its last end. 1 means
    the shorter kind of work hid entirely under the longer one; with no overlap at all
    it is max/(sum) (0.5 when the two are equal). Over all ranks it is
    ``Σ_r max(T_comm, T_compute) / Σ_r T_total``: each rank's efficiency weighted by its
    wall time. A span of zero (every event instantaneous) counts as fully overlapped.
    """
    events = checked_events(events)
    ranks = sorted({e["rank"] for e in events}) if rank is None else [rank]
    if rank is not None and not any(e["rank"] == rank for e in events):
        raise ValueError(f"no events of rank {rank}")
    busy = span = 0.0
    for r in ranks:
        comm, compute, total = _rank_times([e for e in events if e["rank"] == r])
        busy, span = busy + max(comm, compute), span + total
    return 1.0 if span == 0 else busy / span
