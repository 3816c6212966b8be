"""Views of the collectives for notebook 05 (``notebooks/05_collectives_and_overlap.ipynb``).

The ring's schedule lives inside :func:`kernels.comm.ring.ring_pass`, as index arithmetic
a reader cannot print. :func:`trace_ring` runs that code itself, every rank on its own
thread, with an in-memory stand-in for ``torch.distributed`` that logs each message, so
the schedule tables are what the ring does, not a second copy of its formulas. Each
rank's input holds 2**rank, so a message's value names the ranks summed into it.

The other views turn rows into charts: measured times beside the alpha-beta model
(:func:`model_vs_measured`), EP dispatch bytes (:func:`volume_chart`) and a per-rank
timeline of dispatch / compute / combine events (:func:`timeline_chart`) recorded by the
expert-parallel MoE layer on local ranks (:func:`workbench.comm.ep_overlap.measure`).
"""
from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass

import altair as alt
import torch
import torch.distributed as dist

from kernels.comm import collectives, ring
from kernels.comm.cost_model import cost
from kernels.comm.measure import MODEL_ALGORITHM
from kernels.comm.overlap import PHASES, checked_events

RING_COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather")
_WAIT_S = 10.0
_patch_lock = threading.Lock()


class _Done:
    def wait(self):
        return True


class _Receive:
    def __init__(self, net, key, target):
        self.net, self.key, self.target = net, key, target

    def wait(self):
        self.target.copy_(self.net.take(self.key))
        return True


class _Network:
    """Stands in for ``torch.distributed`` on threads: sends are delivered by (src, dst, tag)."""

    def __init__(self, world, segments):
        self.world, self.segments = world, segments
        self.local = threading.local()
        self.ready = threading.Condition()
        self.mailbox, self.messages = {}, []

    def __getattr__(self, name):   # ReduceOp and the like come from the real module
        return getattr(dist, name)

    def get_world_size(self, group=None):
        return self.world

    def get_rank(self, group=None):
        return self.local.rank

    def get_global_rank(self, group, rank):
        return rank

    def isend(self, tensor, dst, group=None, tag=0):
        start = tensor.storage_offset()
        segment = next(j for j, (a, b) in enumerate(self.segments) if a <= start < b)
        with self.ready:
            self.messages.append(dict(tag=tag, src=self.local.rank, dst=dst, segment=segment,
                                      mask=int(tensor[0].item())))
            self.mailbox[(self.local.rank, dst, tag)] = tensor.clone()
            self.ready.notify_all()
        return _Done()

    def irecv(self, tensor, src, group=None, tag=0):
        return _Receive(self, (src, self.local.rank, tag), tensor)

    def take(self, key):
        with self.ready:
            if not self.ready.wait_for(lambda: key in self.mailbox, timeout=_WAIT_S):
                raise TimeoutError(f"traced ring: message {key} (src, dst, tag) never sent")
            return self.mailbox.pop(key)


@contextlib.contextmanager
def _traced(net):
    """``torch.distributed`` is ``net`` inside the ring code while open (one trace at a time)."""
    with _patch_lock:
        saved = ring.dist, collectives.dist
        ring.dist = collectives.dist = net
        try:
            yield
        finally:
            ring.dist, collectives.dist = saved


@dataclass(frozen=True)
class RingTrace:
    """What a traced ring collective did: its messages and every rank's result."""

    collective: str
    world: int
    chunks: int
    messages: list[dict]     # tag, src, dst, segment, mask (bit r set: rank r's data is in it)
    outputs: list[torch.Tensor]

    @property
    def steps(self) -> int:
        return max(m["tag"] for m in self.messages) // self.chunks + 1 if self.messages else 0

    def phase(self, step: int) -> tuple[str, int]:
        """(pass name, step within that pass) of a global step."""
        if self.collective == "all_gather" or (self.collective == "all_reduce"
                                               and step >= self.world - 1):
            return "all-gather", step % (self.world - 1)
        return "reduce-scatter", step


def _rank_call(collective, world, rank, numel, chunks):
    """The call rank ``rank`` makes, on inputs that hold 2**rank (float64: exact sums)."""
    kw = dict(algorithm="ring_chunked" if chunks > 1 else "ring", chunks=chunks, validate=False)
    mine = torch.full((numel,), float(2 ** rank), dtype=torch.float64)
    if collective == "all_reduce":
        return mine, lambda: collectives.all_reduce(mine, **kw)
    if collective == "reduce_scatter":
        out = torch.empty(numel // world, dtype=torch.float64)
        return out, lambda: collectives.reduce_scatter_tensor(out, mine, **kw)
    out = torch.empty(numel * world, dtype=torch.float64)
    return out, lambda: collectives.all_gather_into_tensor(out, mine, **kw)


def trace_ring(collective: str = "all_reduce", world: int = 4, chunks: int = 1,
               numel: int | None = None) -> RingTrace:
    """Run ``kernels.comm``'s ring ``collective`` on ``world`` threads and log its messages.

    ``numel``: elements per rank's input (default: ``world * chunks``, one element per
    piece); reduce_scatter needs a multiple of ``world``.
    """
    if collective not in RING_COLLECTIVES:
        raise ValueError(f"collective must be one of {RING_COLLECTIVES}, got {collective!r}")
    if not 2 <= world <= 16:
        raise ValueError(f"world must be 2..16 (2**rank must stay exact), got {world}")
    if chunks < 1:
        raise ValueError(f"chunks must be >= 1, got {chunks}")
    numel = world * chunks if numel is None else numel
    if collective == "reduce_scatter" and numel % world:
        raise ValueError(f"numel must be a multiple of world for reduce_scatter, got {numel}")
    flat = numel * world if collective == "all_gather" else numel
    segments = (ring.bounds(flat, world) if collective == "all_reduce"
                else [(i * (flat // world), (i + 1) * (flat // world)) for i in range(world)])
    net = _Network(world, segments)
    calls = [_rank_call(collective, world, r, numel, chunks) for r in range(world)]
    errors = []

    def rank_main(rank):
        net.local.rank = rank
        try:
            calls[rank][1]()
        except BaseException as exc:   # reported after every thread has stopped
            errors.append(exc)

    with _traced(net):
        threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if errors:
        raise errors[0]
    messages = sorted(net.messages, key=lambda m: (m["tag"], m["src"]))
    return RingTrace(collective, world, chunks, messages, [out for out, _ in calls])


def _ranks(mask: int) -> str:
    return "+".join(f"r{r}" for r in range(mask.bit_length()) if mask >> r & 1) or "-"


def schedule_rows(trace: RingTrace) -> list[dict]:
    """One row per (step, rank): the segment it sends right, the one it gets from the left,
    and what that segment holds after the step (reduce-scatter adds its own data to it)."""
    rows = {}
    for m in trace.messages:
        step = m["tag"] // trace.chunks
        phase, within = trace.phase(step)
        for rank, role in ((m["src"], "send"), (m["dst"], "receive")):
            row = rows.setdefault((step, rank), dict(phase=phase, step=within + 1, rank=rank))
            row[role] = f"s{m['segment']}"
            row["pieces"] = max(row.get("pieces", 0), m["tag"] % trace.chunks + 1)
            if role == "receive":
                after = m["mask"] | (1 << rank) if phase == "reduce-scatter" else m["mask"]
                row["holds_after"] = f"s{m['segment']} = {_ranks(after)}"
    return [rows[k] for k in sorted(rows)]


def schedule_grid(trace: RingTrace) -> list[dict]:
    """The schedule as one row per step and one column per rank (the notebook's table)."""
    grid = {}
    for row in schedule_rows(trace):
        line = grid.setdefault((row["phase"], row["step"]),
                               {"pass": row["phase"], "step": row["step"]})
        line[f"rank {row['rank']}"] = f"{row['send']}→  ←{row['receive']}  ({row['holds_after']})"
    return list(grid.values())


def segment_states(trace: RingTrace) -> list[dict]:
    """How many ranks' data each rank's copy of each segment holds, after every step.

    Derived from the messages (reduce-scatter adds a received segment into the local one,
    all-gather overwrites it); a test holds the last state to the buffers the ring wrote.
    """
    p = trace.world
    if trace.collective == "all_gather":
        state = [[1 << r if j == r else 0 for j in range(p)] for r in range(p)]
    else:
        state = [[1 << r] * p for r in range(p)]
    rows = []

    def snapshot(step, label):
        rows.extend(dict(step=step, label=label, rank=r, segment=j,
                         ranks_in=bin(state[r][j]).count("1"), holds=_ranks(state[r][j]))
                    for r in range(p) for j in range(p))

    snapshot(0, "start")
    for step in range(trace.steps):
        phase, within = trace.phase(step)
        for m in (m for m in trace.messages if m["tag"] // trace.chunks == step):
            seg, dst = m["segment"], m["dst"]
            state[dst][seg] = m["mask"] | state[dst][seg] if phase == "reduce-scatter" else m["mask"]
        snapshot(step + 1, f"{phase} {within + 1}")
    return rows


def segment_chart(trace: RingTrace, width: int = 90) -> alt.Chart:
    """Per step: a rank x segment grid coloured by how many ranks each copy holds."""
    p = trace.world
    data = alt.Data(values=segment_states(trace))
    return alt.Chart(data, title=f"Ring {trace.collective} on {p} ranks: ranks summed into each "
                                 f"segment copy, step by step").mark_rect().encode(
        x=alt.X("segment:O"), y=alt.Y("rank:O"),
        color=alt.Color("ranks_in:Q", scale=alt.Scale(domain=[0, p], scheme="blues"),
                        title="ranks in it"),
        tooltip=["label:N", "rank:O", "segment:O", "holds:N"],
        column=alt.Column("label:N", sort=alt.SortField("step"), title=None),
    ).properties(width=width, height=width)


def fit_is_physical(fitted) -> bool:
    """Whether a fit can describe a link: alpha >= 0 and beta > 0. On a busy CPU, timing
    noise larger than the bandwidth term can make the least-squares fit return time
    *falling* as bytes grow (beta < 0)."""
    return fitted.alpha >= 0 and fitted.beta > 0


def fit_summary(fitted, label: str) -> str:
    """One line for a fit: alpha, 1/beta and the relative rms error, or, for a fit that is
    not physical, that it describes noise, so no negative "bandwidth" is printed."""
    error = f"relative rms error {fitted.rel_rms:.2g}"
    if fit_is_physical(fitted):
        return f"fit ({label}): alpha = {fitted.alpha * 1e6:.3g} us, 1/beta = {fitted.bandwidth_gbps:.3g} GB/s, {error}"
    return (f"fit ({label}): alpha = {fitted.alpha * 1e6:.3g} us, beta = {fitted.beta:.2g} s/byte, {error}: "
            "not physical (a link's time cannot fall as bytes grow); these timings are noise to two numbers, "
            "so no model line is drawn")


def model_vs_measured(rows: list[dict], fitted) -> list[dict]:
    """Measured rows of the rungs the model knows, each with the fitted model's time (None
    when the fit is not physical: :func:`model_chart` then draws the points alone)."""
    physical = fit_is_physical(fitted)
    out = []
    for r in rows:
        if r["algorithm"] not in MODEL_ALGORITHM:
            continue
        c = cost(r["collective"], MODEL_ALGORITHM[r["algorithm"]], r["world"], r["bytes"])
        out.append(dict(collective=r["collective"], algorithm=r["algorithm"], bytes=r["bytes"],
                        measured_ms=r["seconds"] * 1e3,
                        model_ms=c.seconds(fitted.alpha, fitted.beta) * 1e3 if physical else None,
                        backend=r["backend"]))
    return out


def model_chart(compared: list[dict], title: str) -> alt.FacetChart:
    """Log-log time against bytes per collective: measured points, the model's line."""
    long = [dict(r, source=source, ms=r[f"{source}_ms"]) for r in compared
            for source in ("measured", "model") if r[f"{source}_ms"] is not None]
    base = alt.Chart().encode(
        x=alt.X("bytes:Q", scale=alt.Scale(type="log"), title="bytes per call"),
        y=alt.Y("ms:Q", scale=alt.Scale(type="log"), title="ms"),
        color=alt.Color("algorithm:N"), tooltip=["algorithm:N", "source:N", "bytes:Q", "ms:Q"])
    line = base.transform_filter(alt.datum.source == "model").mark_line(strokeDash=[4, 3])
    dots = base.transform_filter(alt.datum.source == "measured").mark_point(filled=True, size=60)
    return alt.layer(line, dots, data=alt.Data(values=long)).properties(
        width=300, height=240).facet(column=alt.Column("collective:N", title=None), title=title)


def volume_chart(rows: list[dict], title: str) -> alt.Chart:
    """Bytes one EP dispatch moves: bars per payload, naive against deduplicated."""
    return alt.Chart(alt.Data(values=rows), title=title).mark_bar().encode(
        x=alt.X("layout:N", title=None, sort=["naive", "dedup"]),
        y=alt.Y("MB:Q", title="MB one rank sends"),
        color=alt.Color("layout:N", legend=None), column=alt.Column("payload:N", title=None),
        tooltip=["payload:N", "layout:N", "MB:Q"]).properties(width=140, height=200)


def timeline_chart(events: list[dict], title: str) -> alt.Chart:
    """One lane per rank and phase, a bar per (chunk, phase) event, ms from the first start."""
    events = checked_events(events)
    t0 = min(e["start_s"] for e in events)
    rows = [dict(rank=f"rank {e['rank']}", lane=e["phase"], chunk=e["chunk"],
                 start_ms=(e["start_s"] - t0) * 1e3, end_ms=(e["end_s"] - t0) * 1e3)
            for e in events]
    return alt.Chart(alt.Data(values=rows), title=title).mark_bar(cornerRadius=2).encode(
        x=alt.X("start_ms:Q", title="ms since the first event"), x2="end_ms:Q",
        y=alt.Y("lane:N", sort=list(PHASES), title=None),
        row=alt.Row("rank:N", title=None),
        color=alt.Color("lane:N", sort=list(PHASES), title="phase"),
        opacity=alt.Opacity("chunk:O", legend=None),
        tooltip=["rank:N", "lane:N", "chunk:O", "start_ms:Q", "end_ms:Q"],
    ).properties(width=520, height=70)
