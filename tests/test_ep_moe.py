"""kernels.MoE(ep_group=...) against the single-process layer on 2 and 4 local gloo processes.

Every rank builds the same full layer (same seed), feeds its own tokens to its
expert-parallel share, and also runs the full layer on the concatenation of all ranks'
tokens: outputs, input gradients and the local experts' weight gradients must agree to
a few fp32 ulps (``reassociation_bound``: on the CPU a row's bits depend on the BLAS
kernel and on its neighbours, see :mod:`kernels.moe.ep_layer`), the expert counts
exactly; the replicated parameters' gradients, summed over ranks, to rounding. One spawn per world size runs every case;
a rank returns its failures and the parent asserts there are none.
"""
from __future__ import annotations

import contextlib

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import kernels
from kernels.comm.launch import run_local
from kernels.comm import overlap
from kernels.comm.overlap import PHASES, Timeline, overlap_efficiency, phase_seconds
from kernels.moe import ExpertParallelMoE, aux_loss, route
from kernels.moe.layer_ladder import v3_fused
from kernels.moe.layer_ladder.v2_grouped import routed_experts
from kernels.moe.reference import swiglu
from workbench.comm.ep_overlap import measure
from workbench.harness.tolerances import reassociation_bound

from ep_gradients import differs, grads_of
from grouped_launches import grouped_launches
from host_sync import READS, counted_host_reads, no_host_sync

pytestmark = pytest.mark.timeout(600)   # a loaded 2-core machine runs these 4x slower

DIM, HIDDEN, TOP_K = 24, 20, 2


def _full_layer(num_experts, shared, seed=0):
    torch.manual_seed(seed)
    return kernels.MoE(DIM, HIDDEN, num_experts, TOP_K, shared)


def _tokens(counts, seed, constant_feature=False):
    """Each rank's tokens and output gradients; every rank draws all of them alike."""
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(n, DIM, generator=g) for n in counts]
    if constant_feature:
        for x in xs:
            x[:, -1] = 1.0
    return xs, [torch.randn(n, DIM, generator=g) for n in counts]


def _compare(rank, full, reference, xs, grads_out, failures, name, chunks=1, capacity=None):
    """EP share of ``full`` on this rank's tokens against ``reference``, ``full`` on all tokens.
    With a ``capacity`` (large enough to drop nothing), forward and backward run under the
    host-sync trap."""
    group = dist.group.WORLD
    out_all, dx_all, g_all = reference
    ep = kernels.MoE.from_full(full, group, ep_chunks=chunks)
    ep.ep_capacity = capacity
    with contextlib.nullcontext() if capacity is None else no_host_sync():
        out, dx, g = grads_of(ep, xs[rank], grads_out[rank])
    if ep.ep_dropped != 0:
        failures.append(f"{name}: {int(ep.ep_dropped)} slots dropped")
    rows = slice(sum(x.shape[0] for x in xs[:rank]), sum(x.shape[0] for x in xs[:rank + 1]))
    experts = slice(ep.local_experts.start, ep.local_experts.stop)
    counts = ep.expert_counts.clone()             # this rank's: summed, the whole batch's
    dist.all_reduce(counts, group=group)
    checks = {"out": (out, out_all[rows]), "dx": (dx, dx_all[rows]),
              "expert_counts": (counts, full.expert_counts)}
    checks |= {f"d{n}": (g[n], g_all[n][experts]) for n in ("gate", "up", "down")}
    logits = F.linear(torch.cat(xs), full.router.weight)[rows]   # aux_loss: this rank's tokens
    checks["aux_loss"] = (ep.aux_loss.detach(), aux_loss(logits, route(logits, TOP_K)[1]))
    for key, (got, want) in checks.items():
        if why := differs(got, want):
            failures.append(f"{name}: {key} differs from the single-process layer: {why}")
    replicated = ep.replicated_parameters()
    for p in replicated:
        dist.all_reduce(p.grad, group=group)
    for n, p in ep.named_parameters():
        if any(p is q for q in replicated):
            try:
                torch.testing.assert_close(p.grad, g_all[n], rtol=1e-5, atol=1e-6)
            except AssertionError as err:
                failures.append(f"{name}: summed d{n}: {err}")
    return ep, out


def _cases(rank, full, xs, gs, failures, name, chunks):
    """Unchunked and chunked against one single-process run; the two outputs alike."""
    reference = grads_of(full, torch.cat(xs), torch.cat(gs))
    ep, out = _compare(rank, full, reference, xs, gs, failures, name)
    _, chunked = _compare(rank, full, reference, xs, gs, failures, f"{name} chunks {chunks}", chunks)
    if why := differs(chunked, out):
        failures.append(f"{name}: {chunks} chunks differ from 1: {why}")
    return ep


def _cases_on(rank, world):
    """Uneven token counts (a rank with 1 token, a rank with none), with and without shared
    experts, 1 and 3 chunks (more chunks than a rank has tokens: empty chunks), and a
    router that never picks rank 1's experts."""
    failures = []
    experts = 2 * world
    cases = {2: [((6, 11), 0), ((9, 1), 1)], 4: [((5, 0, 9, 4), 1)]}[world]
    for case, (tokens, shared) in enumerate(cases):
        full = _full_layer(experts, shared, seed=case)
        xs, gs = _tokens(tokens, seed=10 + case)
        _cases(rank, full, xs, gs, failures, f"tokens {tokens} shared {shared}", chunks=3)
    # rank 1 owns experts 2 and 3, and the router never picks them
    full = _full_layer(experts, 1, seed=7)
    with torch.no_grad():
        full.router.weight[2:4] = 0.0
        full.router.weight[:2, -1] = 10.0
        full.router.weight[4:, -1] = 10.0
    xs, gs = _tokens([8] * world, seed=20, constant_feature=True)
    ep = _cases(rank, full, xs, gs, failures, "rank 1 receives nothing", chunks=2)
    if ep.expert_counts[2:4].any() or not ep.expert_counts.sum() == 8 * TOP_K:
        failures.append(f"experts 2, 3 got token-slots: {ep.expert_counts.tolist()}")
    if world == 2:
        _capacity_cases(rank, failures)
        _bf16_case(rank, failures)
        _autocast_case(rank, failures)
    return failures


def _kept(ids, num_experts, world, capacity):
    """The slots a sender keeps under ``capacity``: per destination rank, its first
    ``capacity`` slots in (expert, token, slot) order; (T, k) bool."""
    flat = ids.reshape(-1).tolist()
    kept, used = torch.zeros(len(flat), dtype=torch.bool), [0] * world
    for slot in sorted(range(len(flat)), key=lambda s: (flat[s], s)):
        owner = flat[slot] // (num_experts // world)
        if used[owner] < capacity:
            kept[slot], used[owner] = True, used[owner] + 1
    return kept.view(ids.shape)


def _capacity_cases(rank, failures):
    """The fixed-capacity exchange, with no host read in forward and backward: with room
    for every slot it is the dropless layer (chunked too); with too little room the output
    and input gradient are the single-process layer's on this rank's tokens with the dropped
    slots' routing weights zeroed, and ``ep_dropped`` counts those slots."""
    full = _full_layer(4, 1, seed=6)
    xs, gs = _tokens((9, 1), seed=60)           # 3 chunks of rank 1's 1 token: 2 are empty
    reference = grads_of(full, torch.cat(xs), torch.cat(gs))
    for chunks in (1, 3):
        _compare(rank, full, reference, xs, gs, failures, f"capacity, chunks {chunks}", chunks,
                 capacity=9 * TOP_K)
    capacity, (xs, gs) = 3, _tokens((9, 5), seed=61)
    ep = kernels.MoE.from_full(full, dist.group.WORLD)
    ep.ep_capacity = capacity
    with no_host_sync():
        out, dx, _ = grads_of(ep, xs[rank], gs[rank])
    x = xs[rank].clone().requires_grad_()
    logits = F.linear(x, full.router.weight)
    weights, ids = route(logits, TOP_K)
    kept = _kept(ids, 4, 2, capacity)
    want = routed_experts(x, weights * kept, ids, full.gate, full.up, full.down) \
        + swiglu(x, full.shared_gate, full.shared_up, full.shared_down)
    want.backward(gs[rank])
    if kept.all() or int(ep.ep_dropped) != int((~kept).sum()):
        failures.append(f"capacity {capacity}: {int(ep.ep_dropped)} dropped, "
                        f"{int((~kept).sum())} expected")
    for key, got, expected in (("out", out, want.detach()), ("dx", dx, x.grad)):
        if why := differs(got, expected):
            failures.append(f"capacity {capacity}: {key} differs from the dropped slots' layer: {why}")


def _traffic_case(rank, world):
    """Elements of float rows this rank's all-to-alls sent in one forward and one backward
    (2 chunks), the other collectives the forward called, and the host reads of each."""
    full = _full_layer(4, 0, seed=5)
    xs, gs = _tokens((7, 4), seed=50)
    ep = kernels.MoE.from_full(full, dist.group.WORLD, ep_chunks=2)
    sent, others = [], []
    all_to_all, all_reduce = dist.all_to_all_single, dist.all_reduce

    def counting(output, input, *args, **kwargs):
        if input.is_floating_point():
            sent.append(input.numel())
        return all_to_all(output, input, *args, **kwargs)

    def reduce(*args, **kwargs):
        others.append("all_reduce")
        return all_reduce(*args, **kwargs)

    x = xs[rank].clone().requires_grad_()
    dist.all_to_all_single, dist.all_reduce = counting, reduce
    try:
        with counted_host_reads() as forward_reads:
            out = ep(x)
        forward, sent[:] = sum(sent), []
        with counted_host_reads() as backward_reads:
            out.backward(gs[rank])
    finally:
        dist.all_to_all_single, dist.all_reduce = all_to_all, all_reduce
    return forward, sum(sent), others, forward_reads, backward_reads


def test_forward_and_backward_each_move_two_times_t_k_dim_and_nothing_else():
    """Summed over the ranks, each direction carries every token-slot's row once: T·k·dim
    out and T·k·dim back, in the backward too (the output gradient out, the input gradient
    back: the forward's rows are not sent again); the forward calls no all_reduce, and
    reads the host once (the split sizes, dropless), the backward not at all."""
    per_rank = run_local(_traffic_case, 2, timeout=300, group_timeout=200)
    rows = (7 + 4) * TOP_K * DIM
    assert sum(r[0] for r in per_rank) == 2 * rows
    assert sum(r[1] for r in per_rank) == 2 * rows
    assert [r[2:] for r in per_rank] == [([], ["tolist"], [])] * 2


def _counted_backward(ep, x, grad_out):
    """Forward and backward of ``ep``: (the grouped GEMM launches of the backward by kind, "dx"
    for a "forward" launch on a transposed local expert weight, the v3 forward kernels it
    ran, the elements the experts' autograd node saved, parameters aside)."""
    out = ep(x)
    node, params = out.grad_fn, {p.data_ptr() for p in ep.parameters()}
    while type(node).__name__ != "_ExpertsBackward":
        node = node.next_functions[0][0]
    saved = sum(t.numel() for t in node.saved_tensors if t.data_ptr() not in params)
    forward_kernels = []
    fused = v3_fused._launch
    weights = [w.data_ptr() for w in (ep.gate, ep.up, ep.down)]

    def forward_kernel(kernel, *args):
        forward_kernels.append(kernel)
        return fused(kernel, *args)

    v3_fused._launch = forward_kernel
    try:
        with grouped_launches() as grouped:
            out.backward(grad_out)
    finally:
        v3_fused._launch = fused
    launches = ["dx" if kind == "forward" and b.stride(2) != 1 and b.data_ptr() in weights else kind
                for kind, b in grouped]
    return sorted(launches), forward_kernels, saved


def _backward_case(rank, world):
    """One backward of 3 chunks counted (:func:`_counted_backward`), with the saved elements
    the module docstring states, T·k·(dim + 1) on the sender and R·(dim + 3·hidden) at the
    owner, R its received rows; then one with the gate frozen: its launches, and whether the
    other gradients are the same bits."""
    full = _full_layer(4, 0, seed=5)
    xs, gs = _tokens((7, 4), seed=50)
    ep = kernels.MoE.from_full(full, dist.group.WORLD, ep_chunks=3)
    x = xs[rank].clone().requires_grad_()
    launches, forward_kernels, saved = _counted_backward(ep, x, gs[rank])
    counts = ep.expert_counts.clone()
    dist.all_reduce(counts)
    received = int(counts[ep.local_experts.start:ep.local_experts.stop].sum())
    expected = x.shape[0] * TOP_K * (DIM + 1) + received * (DIM + 3 * HIDDEN)
    grads = [t.grad.clone() for t in (x, ep.up, ep.down)]
    x.grad, ep.gate.grad, ep.up.grad, ep.down.grad = None, None, None, None
    ep.gate.requires_grad_(False)
    frozen, _, _ = _counted_backward(ep, x, gs[rank])
    same = all(torch.equal(t.grad, g) for t, g in zip((x, ep.up, ep.down), grads))
    return launches, forward_kernels, saved, expected, frozen, same and ep.gate.grad is None


def test_backward_runs_dx_and_dw_per_expert_gemm_on_saved_activations():
    """Each owner's backward: one dX and one dW grouped GEMM launch per expert GEMM over all
    chunks' rows (6, not 6 per chunk), no forward GEMM and no v3 forward kernel (the
    forward saved g, u and h instead); no dW for a frozen expert weight."""
    for launches, forward_kernels, saved, expected, frozen, same in run_local(
            _backward_case, 2, timeout=300, group_timeout=200):
        assert launches == ["dw"] * 3 + ["dx"] * 3 and forward_kernels == []
        assert saved == expected
        assert frozen == ["dw"] * 2 + ["dx"] * 3 and same


def test_host_sync_trap_catches_every_read_and_restores():
    t = torch.ones(1)
    reads = {"item": lambda: t.item(), "tolist": lambda: t.tolist(), "cpu": lambda: t.cpu(),
             "numpy": lambda: t.numpy(),
             "__int__": lambda: int(t), "__index__": lambda: [0, 1][t.long()],
             "__bool__": lambda: bool(t), "__float__": lambda: float(t)}
    assert sorted(reads) == sorted(READS)
    with no_host_sync():
        for name, read in reads.items():
            with pytest.raises(AssertionError, match=f"host sync: Tensor.{name}"):
                read()
    assert t.item() == 1.0 and bool(t) and "item" not in vars(torch.Tensor)


def _autocast_case(rank, failures):
    """Under autocast the EP layer returns what the single-process layer returns: x's dtype."""
    full = _full_layer(4, 1, seed=4)
    xs, _ = _tokens((3, 4), seed=40)
    ep = kernels.MoE.from_full(full, dist.group.WORLD)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want, got = full(torch.cat(xs)), ep(xs[rank])
    if got.dtype != want.dtype:
        failures.append(f"autocast: the EP layer returns {got.dtype}, the layer {want.dtype}")


def _bf16_case(rank, failures):
    """bf16: the routing weight is applied after the down kernel's rounding instead of
    before it (two roundings, not one), so close to the single-process layer at bf16's
    resolution."""
    full = _full_layer(4, 1, seed=3).to(torch.bfloat16)
    xs, gs = _tokens((7, 5), seed=30)
    xs, gs = [x.bfloat16() for x in xs], [g.bfloat16() for g in gs]
    out_all, dx_all, g_all = grads_of(full, torch.cat(xs), torch.cat(gs))
    ep = kernels.MoE.from_full(full, dist.group.WORLD, ep_chunks=2)
    out, dx, g = grads_of(ep, xs[rank], gs[rank])
    rows = slice(0, 7) if rank == 0 else slice(7, 12)
    experts = slice(ep.local_experts.start, ep.local_experts.stop)
    pairs = {"out": (out, out_all[rows]), "dx": (dx, dx_all[rows])}
    pairs |= {f"d{n}": (g[n], g_all[n][experts]) for n in ("gate", "up", "down")}
    for key, (got, want) in pairs.items():
        try:
            assert got.dtype == torch.bfloat16
            torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)
        except AssertionError as err:
            failures.append(f"bf16 {key}: {err}")


def _construction_case(rank, world):
    """The errors of bad arguments, and whether a fresh EP layer seeded like a full layer
    holds that layer's weights for its experts (as ExpertParallelMoE's docstring says)."""
    messages = []
    for kwargs in (dict(num_experts=6), dict(num_experts=8, ep_chunks=0),
                   dict(num_experts=8, ep_capacity=0)):
        try:
            kernels.MoE(DIM, HIDDEN, top_k=1, ep_group=dist.group.WORLD, **kwargs)
        except ValueError as err:
            messages.append(str(err))
    full = _full_layer(2 * world, 1)
    torch.manual_seed(0)
    fresh = kernels.MoE(DIM, HIDDEN, 2 * world, TOP_K, 1, ep_group=dist.group.WORLD)
    share = kernels.MoE.from_full(full, dist.group.WORLD).state_dict()
    same = isinstance(fresh, ExpertParallelMoE) and all(
        torch.equal(v, share[k]) for k, v in fresh.state_dict().items())
    return messages, same


@pytest.mark.parametrize("world", [2, 4])
def test_ep_layer_matches_the_single_process_layer(world):
    failures = run_local(_cases_on, world, timeout=540, group_timeout=400)
    assert failures == [[]] * world


def test_events_are_well_formed_and_efficiency_is_a_fraction():
    rows = measure(world=2, chunk_counts=(1, 3), tokens=10, dim=DIM, hidden=HIDDEN, experts=4,
                   top_k=TOP_K, timeout=300)
    assert [row["chunks"] for row in rows] == [1, 3]
    assert all(row["clock"] == "host" and {e["clock"] for e in row["events"]} == {"host"}
               for row in rows)
    assert all(row["output_difference"] <= reassociation_bound(torch.float32) for row in rows)
    for row in rows:
        chunks = row["chunks"]
        for rank in range(2):
            events = [e for e in row["events"] if e["rank"] == rank]
            assert sorted((e["chunk"], e["phase"]) for e in events) == sorted(
                (c, p) for c in range(chunks) for p in PHASES)
            assert all(0 <= e["start_s"] <= e["end_s"] for e in events)
            at = {(e["chunk"], e["phase"]): e for e in events}
            for c in range(chunks):   # a chunk computes after its dispatch, is combined after
                assert at[c, "dispatch"]["end_s"] <= at[c, "compute"]["start_s"]
                assert at[c, "compute"]["end_s"] <= at[c, "combine"]["start_s"]
            assert 0 < row["efficiency_per_rank"][rank] <= 1
            assert row["seconds_per_rank"][rank] > 0
        assert 0 < row["efficiency"] <= 1


class _StubCuda:
    """``torch.cuda``'s event and stream calls over a device clock ``now`` that the test
    sets: an event records ``now`` and its stream; a stream remembers what it waited for."""

    def __init__(self):
        self.now, self.synchronized = 0.0, 0
        self._current = _StubStream("compute")

    def Event(self, enable_timing=False):
        assert enable_timing
        return _StubEvent(self)

    def Stream(self):
        return _StubStream("comm")

    def current_stream(self):
        return self._current

    @contextlib.contextmanager
    def stream(self, stream):
        previous, self._current = self._current, stream
        yield
        self._current = previous

    def synchronize(self):
        self.synchronized += 1


class _StubEvent:
    def __init__(self, cuda):
        self.cuda = cuda

    def record(self):
        self.at, self.stream = self.cuda.now, self.cuda.current_stream().name

    def elapsed_time(self, end):
        assert self.cuda.synchronized, "elapsed_time before a synchronize"
        return (end.at - self.at) * 1e3


class _StubStream:
    def __init__(self, name):
        self.name, self.waited = name, []

    def wait_stream(self, other):
        self.waited.append(other.name)

    def wait_event(self, event):
        self.waited.append(event)


class _StubTensor:
    def __init__(self):
        self.streams = []

    def record_stream(self, stream):
        self.streams.append(stream.name)


def test_device_timeline_times_comm_on_its_stream_and_compute_on_the_current_one(monkeypatch):
    """The device clock's arithmetic with stub events (a GPU would be needed to show that
    the end event really waits for the transfer): a collective is issued from the
    communication stream between two events there, the compute stream waits for the end
    event, and the times are elapsed_time from the start event, read after one synchronize."""
    monkeypatch.setattr(overlap.dist, "barrier", lambda group=None: None)
    monkeypatch.setattr(overlap.dist, "get_rank", lambda group=None: 1)
    cuda = _StubCuda()
    cuda.now = 5.0
    timeline = Timeline(cuda=cuda)
    assert timeline.clock == "device"
    rows, out, issued_on = _StubTensor(), _StubTensor(), []

    class Work:
        def wait(self):           # the communication stream reaches its end event 2 s later
            cuda.now += 2.0

    def issue():
        issued_on.append(cuda.current_stream().name)
        return out, Work()

    cuda.now = 5.5
    got, handle = timeline.comm(0, "dispatch", issue, (rows,))
    assert got is out and issued_on == ["comm"] and cuda.current_stream().name == "compute"
    assert rows.streams == ["comm"] and out.streams == ["compute"]
    cuda.now = 6.0                # the compute stream runs chunk 0 from 6 to 9 meanwhile
    with timeline.compute(0):
        cuda.now = 9.0
    handle.wait()
    end = cuda.current_stream().waited[-1]
    assert end.stream == "comm" and end.at == 7.5
    with timeline.compute(1):
        cuda.now = 10.0
    assert cuda.synchronized == 0
    events = timeline.events
    assert cuda.synchronized == 1 and timeline.events is events and cuda.synchronized == 1
    assert [(e["chunk"], e["phase"]) for e in events] == [(0, "dispatch"), (0, "compute"),
                                                          (1, "compute")]
    assert [t for e in events for t in (e["start_s"], e["end_s"])] == pytest.approx(
        [0.5, 2.5, 1.0, 4.0, 4.0, 5.0])
    assert {e["clock"] for e in events} == {"device"} and {e["rank"] for e in events} == {1}
    assert overlap_efficiency(events) == pytest.approx(4.0 / 4.5)  # compute 1..5 hides 0.5..2.5 partly


def test_overlap_efficiency_on_known_timelines():
    def ev(phase, start, end, rank=0, chunk=0):
        return {"rank": rank, "chunk": chunk, "phase": phase, "start_s": start, "end_s": end}
    serial = [ev("dispatch", 0, 1), ev("compute", 1, 2), ev("combine", 2, 3)]
    assert overlap_efficiency(serial) == pytest.approx(2 / 3)
    hidden = [ev("dispatch", 0, 1), ev("compute", 0, 3), ev("combine", 2, 3)]
    assert overlap_efficiency(hidden) == 1.0
    both = serial + [ev("compute", 0, 4, rank=1), ev("dispatch", 1, 2, rank=1)]
    assert overlap_efficiency(both) == pytest.approx((2 + 4) / (3 + 4))
    assert overlap_efficiency(both, rank=1) == 1.0
    # some all-to-all in flight all the time (a lagging peer can do that): summed piece by
    # piece, the union of these two came out one ulp longer than the span
    filled = [ev("dispatch", 0.0020263565044021468, 0.011288795332926708),
              ev("dispatch", 0.00914376365866459, 0.08998426672313603, chunk=1),
              ev("compute", 0.005, 0.05)]
    assert overlap_efficiency(filled) == 1.0
    assert phase_seconds(filled)[0] == filled[1]["end_s"] - filled[0]["start_s"]
    assert phase_seconds([ev("compute", 1, 3)]) == (0.0, 2.0)   # no communication at all
    with pytest.raises(ValueError, match="empty"):
        overlap_efficiency([])
    with pytest.raises(ValueError, match="phase"):
        overlap_efficiency([ev("wait", 0, 1)])
    with pytest.raises(ValueError, match="no events of rank 3"):
        overlap_efficiency(serial, rank=3)


def test_bad_world_size_and_chunks_are_refused_by_name_and_fresh_layers_are_slices():
    for messages, same in run_local(_construction_case, 4, timeout=300, group_timeout=200):
        assert len(messages) == 3
        assert "num_experts=6" in messages[0] and "world size 4" in messages[0]
        assert "ep_chunks" in messages[1] and "ep_capacity" in messages[2]
        assert same


def test_ep_group_must_be_a_process_group():
    with pytest.raises(TypeError, match="ep_group must be a torch.distributed ProcessGroup"):
        kernels.MoE(DIM, HIDDEN, 4, TOP_K, ep_group="world")
    with pytest.raises(ValueError, match="ep_chunks needs ep_group"):
        kernels.MoE(DIM, HIDDEN, 4, TOP_K, ep_chunks=2)


def test_v3_rows_do_not_depend_on_their_tile_mates():
    """What chunking rests on: a row's output from v3's kernels is the same, to the
    reassociation bound, whichever rows share its tiles and wherever in the tile it sits.
    Not bitwise on the CPU: the interpreter's tile dots go through NumPy's BLAS, whose
    summation order depends on the CPU's kernel (OpenBLAS Haswell changed bits here)."""
    g = torch.Generator().manual_seed(3)
    rows = torch.randn(70, DIM, generator=g)
    gate, up = torch.randn(2, DIM, HIDDEN, generator=g), torch.randn(2, DIM, HIDDEN, generator=g)
    down = torch.randn(2, HIDDEN, DIM, generator=g)
    cfg1, cfg2 = v3_fused.config("interpreter")

    def run(x, split):
        identity = torch.arange(x.shape[0])
        offsets = torch.tensor([split, x.shape[0]], dtype=torch.int32)
        h = v3_fused.gate_up(x, gate, up, identity, offsets, 1, cfg1)
        return v3_fused.down_scatter(h, down, identity, torch.ones(x.shape[0]), offsets, cfg2)

    whole = run(rows, 40)
    # drop 5 rows from the front of each expert: every row moves within its tile and
    # gets new neighbours (tiles are 32 rows in the interpreter)
    kept = torch.cat([torch.arange(5, 40), torch.arange(45, 70)])
    assert differs(run(rows[kept], 35), whole[kept]) is None
    # the reverse order inside each expert
    flipped = torch.cat([torch.arange(39, -1, -1), torch.arange(69, 39, -1)])
    assert differs(run(rows[flipped], 40), whole[flipped]) is None
