"""Per-rank event timelines of a chunked, overlapped layer, and how well they overlap.

A layer that splits its work into chunks (:class:`kernels.moe.ep_layer.ExpertParallelMoE`
with ``ep_chunks > 1``) issues the all-to-all of chunk i+1 before it computes chunk i.
Whether that hides the communication is a measurement, not a promise: :class:`Timeline`
records when each phase of each chunk ran, and :func:`overlap_efficiency` says how much
of the wall time the longer of the two kinds of work filled.

Times are seconds since a common start: every rank passes a barrier, then reads
``time.perf_counter`` (CLOCK_MONOTONIC on Linux, one clock for all local processes), so
local ranks' timelines line up to within the barrier's exit skew.

A communication event starts when its asynchronous work is issued and ends when the work
completes, as seen by a callback on its future (not when the layer gets round to waiting
for it, which would count the layer's own compute as communication). An all-to-all
completes only once every peer has sent its block, so a rank's communication time also
holds its wait for slower peers: load imbalance shows up as communication.
"""
from __future__ import annotations

import contextlib
import time

import torch.distributed as dist

PHASES = ("dispatch", "compute", "combine")
COMM_PHASES = ("dispatch", "combine")
KEYS = ("rank", "chunk", "phase", "start_s", "end_s")


class Timeline:
    """Collects event dicts ``{"rank", "chunk", "phase", "start_s", "end_s"}`` in ``events``.

    Construct it on every rank of ``group`` at once: it starts with a barrier.
    """

    def __init__(self, group=None):
        dist.barrier(group=group)
        self._t0 = time.perf_counter()
        self.rank = dist.get_rank(group)
        self.events: list[dict] = []

    def _now(self) -> float:
        return time.perf_counter() - self._t0

    def _add(self, chunk: int, phase: str, start: float, end: float) -> None:
        self.events.append({"rank": self.rank, "chunk": chunk, "phase": phase,
                            "start_s": start, "end_s": end})

    @contextlib.contextmanager
    def compute(self, chunk: int):
        """Times the block as chunk ``chunk``'s compute."""
        start = self._now()
        yield
        self._add(chunk, "compute", start, self._now())

    def comm(self, chunk: int, phase: str, work):
        """Records ``work`` (an ``async_op=True`` handle issued just now) from now until it
        completes; returns a future that is done once the event is recorded (wait on it,
        not on ``work``, so the event is in ``events`` when the wait returns)."""
        start = self._now()
        return work.get_future().then(lambda _: self._add(chunk, phase, start, self._now()))


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
