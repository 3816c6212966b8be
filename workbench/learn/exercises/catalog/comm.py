"""Collective exercises: the ring and all-to-all algorithms of kernels.comm.

These are not registry rungs, so each brings its own grade: the learner's module runs on
WORLD local gloo processes (:func:`kernels.comm.launch.run_local`), where
``kernels.comm``'s collectives are pointed at the learner's ``ring_pass`` / ``exchange``,
and every result is compared with torch.distributed's own collective on the same data,
at sizes that are not multiples of the world size. Three ranks, not two: with two, the
left and the right neighbour are the same rank and a wrong neighbour goes unnoticed.

What numbers cannot show is checked from a trace of the point-to-point calls: that a
chunked ring really sends near-equal pieces, that pairwise keeps one round in flight
and direct posts everything before it waits, that nothing is left unwaited. A send or
receive without its partner deadlocks: the process group's timeout (``GROUP_TIMEOUT_S``)
turns that into a failure that says so; a rank that gloo aborts (a receive of another
size than its send) is reported when its process dies; run_local's deadline catches the rest.
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist

from ..model import KernelExercise, Verdict
from ..source import variant

ALL_TO_ALL = "kernels.comm.all_to_all"

WORLD = 3
CHUNKS = 3              # ring_chunked's pieces per segment in the checks
GROUP_TIMEOUT_S = 8.0   # a receive that waits this long has no partner: a deadlock
DEADLINE_S = 60.0       # the whole run, spawning the ranks included (slow on a busy machine)
_ERROR = "error on "    # marks a rank's exception among its failures
# Sizes of the ring checks: all_reduce's are not multiples of WORLD (uneven segments), 4 and
# 5 do not divide by CHUNKS (uneven pieces), and 2 < CHUNKS (a chunked ring skips empty ones)
ALL_REDUCE_NUMELS = (WORLD + 1, 37)
REDUCE_SCATTER_PER_RANK = 4
ALL_GATHER_PER_RANK = (5, 2)

# ---- in each rank's process ------------------------------------------------------------

class _Traced:
    """A send's or receive's work handle that tells the trace when it is waited for."""

    def __init__(self, work, trace: "_Trace"):
        self._work, self._trace, self._waited = work, trace, False

    def wait(self, *args, **kwargs):
        if not self._waited:
            self._waited = True
            self._trace.in_flight -= 1
        return self._work.wait(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._work, name)


class _Trace:
    """This rank's isend/irecv calls during one collective: sizes sent, most in flight."""

    def __init__(self):
        self.reset()
        self._isend, self._irecv = dist.isend, dist.irecv
        dist.isend, dist.irecv = self._wrap(self._isend, sends=True), self._wrap(self._irecv, sends=False)

    def reset(self):
        self.sent, self.posted, self.in_flight, self.most_in_flight = [], 0, 0, 0

    def _wrap(self, post, sends: bool):
        def traced(tensor, *args, **kwargs):
            work = post(tensor, *args, **kwargs)
            if sends:
                self.sent.append(tensor.numel())
            self.posted += 1
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            return _Traced(work, self)
        return traced


def _data(n: int, rank: int, case: int) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(1000 * case + rank))


def _differs(what: str, rank: int, got: torch.Tensor, want: torch.Tensor, exact: bool) -> str | None:
    got, want = got.reshape(-1), want.reshape(-1)
    p = dist.get_world_size()
    bad = got != want if exact else ~torch.isclose(got, want, rtol=1e-5, atol=1e-5 * p)
    if not bad.any():
        return None
    i = int(bad.nonzero()[0])
    return (f"{what}: on rank {rank} element {i} is {got[i].item():.5g} where torch.distributed "
            f"gives {want[i].item():.5g} ({int(bad.sum())} of {got.numel()} elements differ)")


def _unwaited(what: str, rank: int, trace: _Trace) -> str | None:
    if trace.in_flight:
        return (f"{what}: rank {rank} returned with {trace.in_flight} send(s)/receive(s) never "
                f"waited for, so the output may not have arrived yet; wait for every one")
    return None


def _ring_cases(rank: int, p: int, algorithm: str, trace: _Trace):
    """This rank's failures (None where a check passed), as each case finishes."""
    from kernels import comm

    for case, n in enumerate(ALL_REDUCE_NUMELS):
        x = _data(n, rank, case)
        want, got = x.clone(), x.clone()
        comm.all_reduce(want, algorithm="library")
        trace.reset()
        comm.all_reduce(got, algorithm=algorithm, chunks=CHUNKS, validate=False)
        what = f"all_reduce (sum) of {n} elements on {p} ranks"
        yield from [_differs(what, rank, got, want, exact=False), _unwaited(what, rank, trace)]
    m = REDUCE_SCATTER_PER_RANK
    x = _data(p * m, rank, 10)
    want, got = torch.empty(m), torch.full((m,), float("nan"))
    comm.reduce_scatter_tensor(want, x, algorithm="library")
    trace.reset()
    comm.reduce_scatter_tensor(got, x, algorithm=algorithm, chunks=CHUNKS, validate=False)
    what = f"reduce_scatter (sum) of {m} elements per rank on {p} ranks"
    yield from [_differs(what, rank, got, want, exact=False), _unwaited(what, rank, trace)]
    for m in ALL_GATHER_PER_RANK:
        x = _data(m, rank, 20 + m)
        want, got = torch.empty(p * m), torch.full((p * m,), float("nan"))
        comm.all_gather_into_tensor(want, x, algorithm="library")
        trace.reset()
        comm.all_gather_into_tensor(got, x, algorithm=algorithm, chunks=CHUNKS, validate=False)
        what = f"all_gather of {m} elements per rank on {p} ranks"
        yield from [_differs(what, rank, got, want, exact=True), _unwaited(what, rank, trace)]
        if algorithm == "ring_chunked":
            yield _pieces_rule(what, rank, p, m, trace.sent)


def _pieces_rule(what: str, rank: int, p: int, m: int, sent: list[int]) -> str | None:
    """Each of the p-1 steps sends a segment of m elements as min(CHUNKS, m) non-empty
    pieces whose sizes differ by at most one."""
    pieces = min(CHUNKS, m)
    step = [m // pieces + (i < m % pieces) for i in range(pieces)]
    if sorted(sent) == sorted(step * (p - 1)):
        return None
    return (f"{what} with chunks={CHUNKS}: rank {rank} sent pieces of {sorted(sent)} elements; "
            f"each of the {p - 1} steps should send its {m}-element segment as {pieces} non-empty "
            f"pieces of near-equal size ({step})")


def _uneven_splits(rank: int, p: int) -> tuple[list[int], list[int]]:
    """Rank r sends (r + 2j + rj) % 3 rows to rank j: an empty block, and in most rounds a
    block sent of another size than the block received, so sizes cannot be confused."""
    return [(rank + 2 * j + rank * j) % 3 for j in range(p)], [(i + 2 * rank + i * rank) % 3 for i in range(p)]


def _all_to_all_cases(rank: int, p: int, algorithms: tuple[str, ...], trace: _Trace):
    """This rank's failures (None where a check passed), as each case finishes."""
    from kernels import comm

    ins, outs = _uneven_splits(rank, p)
    for case, (i_s, o_s) in enumerate(((ins, outs), (None, None))):
        rows_in, rows_out = (sum(i_s), sum(o_s)) if i_s else (2 * p, 2 * p)
        x = _data(rows_in * 4, rank, 30 + case).view(rows_in, 4)
        want = torch.empty(rows_out, 4)
        comm.all_to_all_single(want, x, o_s, i_s, algorithm="library")
        for algorithm in algorithms:
            got = torch.full_like(want, float("nan"))
            trace.reset()
            comm.all_to_all_single(got, x, o_s, i_s, algorithm=algorithm, validate=False)
            what = (f"all_to_all_single ({algorithm}, "
                    f"{'input splits ' + str(i_s) if i_s else 'even splits'}) on {p} ranks")
            yield from [_differs(what, rank, got, want, exact=True), _unwaited(what, rank, trace),
                         _schedule_rule(what, rank, algorithm, trace)]


def _schedule_rule(what: str, rank: int, algorithm: str, trace: _Trace) -> str | None:
    """pairwise: one round (a send and a receive) in flight at most; direct: all at once."""
    if algorithm == "pairwise" and trace.most_in_flight > 2:
        return (f"{what}: rank {rank} had {trace.most_in_flight} sends/receives in flight at once; "
                f"pairwise waits for each round (one send, one receive) before the next")
    if algorithm == "direct" and trace.most_in_flight < trace.posted:
        return (f"{what}: rank {rank} had at most {trace.most_in_flight} of its {trace.posted} "
                f"sends/receives in flight; direct posts every one before waiting for any")
    return None


def _rank(rank: int, world: int, path: str, kind: str, algorithms: tuple[str, ...]) -> list[str]:
    """One rank: import the learner's file, point kernels.comm at it, run the cases.

    Runs in a child process of run_local, so rebinding kernels.comm's algorithm functions
    and torch.distributed's isend/irecv there changes nothing in the parent."""
    from kernels.comm import collectives

    from .. import learner

    failures = []
    try:
        module, _ = learner.import_file(Path(path), None)
        for name in ("ring_pass", "exchange"):
            if hasattr(module, name):
                setattr(collectives, name, getattr(module, name))
        trace = _Trace()
        cases = (_ring_cases(rank, world, algorithms[0], trace) if kind == "ring"
                 else _all_to_all_cases(rank, world, algorithms, trace))
        for failure in cases:   # a loop, so the failures before an exception are kept
            if failure:
                failures.append(failure)
    except Exception as error:  # every rank reports, so the parent sees who timed out
        failures.append(f"{_ERROR}rank {rank}: {type(error).__name__}: {error}")
    return failures


# ---- in the grading process ------------------------------------------------------------

def _verdict(failures: list[str], checked: str) -> Verdict:
    """The first failure, told as a deadlock when a rank's receive timed out."""
    errors = [f for f in failures if f.startswith(_ERROR)]
    todo = [f for f in errors if "NotImplementedError" in f]
    if todo:
        return Verdict(False, "not done yet: " + todo[0].split("NotImplementedError: ", 1)[1])
    wrong = [f for f in failures if not f.startswith(_ERROR)]   # before any hang they caused
    stuck = [f for f in errors if "timed out" in f.lower() or "timeout" in f.lower()]
    if stuck and not wrong:
        return Verdict(False, f"deadlock: a send or receive waited {GROUP_TIMEOUT_S:.0f} s for its "
                              f"partner; does every send's peer post the matching receive? "
                              f"({stuck[0].removeprefix(_ERROR).splitlines()[0]})")
    found = wrong or [f for f in errors if "closed by peer" not in f] or errors  # the cause first
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        return Verdict(False, found[0].removeprefix(_ERROR) + more)
    return Verdict(True, f"{checked} on {WORLD} gloo ranks agree with torch.distributed")


def _on_ranks(kind: str, algorithms: tuple[str, ...], checked: str):
    """A grade that runs the learner's module on WORLD gloo ranks."""
    def grade(module, captured) -> Verdict:
        from kernels.comm.launch import run_local

        try:
            per_rank = run_local(_rank, WORLD, module.__file__, kind, algorithms,
                                 timeout=DEADLINE_S, group_timeout=GROUP_TIMEOUT_S)
        except TimeoutError as error:
            return Verdict(False, f"{error}: a rank is stuck, and not in a send or receive")
        except RuntimeError as error:   # a rank's process died: gloo aborts on a size mismatch
            return Verdict(False, f"{error}: does every receive expect the size of its send?")
        return _verdict([f for failures in per_rank for f in failures], checked)
    return grade


RING_CHECKS = (f"all_reduce {ALL_REDUCE_NUMELS} elements, reduce_scatter {REDUCE_SCATTER_PER_RANK} "
               f"per rank, all_gather {ALL_GATHER_PER_RANK} per rank")

EXERCISES = (
    KernelExercise(
        key="comm/ring", module="kernels.comm.ring",
        title="The ring: neighbours, the segment schedule, accumulate",
        task="ring_pass runs p-1 steps; at each, every rank sends one segment to its right "
             "neighbour and receives one from its left. Write who the neighbours are and which "
             "segment a rank sends at each step (segment(step); it receives segment(step + 1), "
             "the one its left neighbour sends). In the reduce-scatter pass (combine given) rank "
             "r must end holding segment r summed over all ranks; in the all-gather pass it "
             "starts owning segment r. Then combine each received piece into this rank's copy.",
        todo={"ring": 'raise NotImplementedError("TODO: left and right neighbours, and segment(step)")',
              "combine": "pass  # TODO: the reduce-scatter pass combines the received piece into buf"},
        hints=(
            "Rank r's right neighbour is (r + 1) % p and its left (r - 1) % p (_peer maps a group "
            "rank to a global one). A rank must receive from the rank that sends to it, or both "
            "wait for ever.",
            "All-gather: at step s rank r forwards the segment it got s steps ago, segment "
            "(r - s) % p. Reduce-scatter: start one segment earlier, (r - s - 1) % p, so that "
            "after p-1 steps the segment completing at rank r is segment r.",
            "shift = 0 if combine is None else 1; segment(step) returns segments[(rank - step - "
            "shift) % p]; combine: local = buf[piece[0]:piece[1]]; combine(target, local, "
            "out=local).",
        ),
        wrong={
            "sends to the left, receives from the left": {"ring": '''
left, right = _peer(group, (rank - 1) % p), _peer(group, (rank - 1) % p)
shift = 0 if combine is None else 1

def segment(step):
    return segments[(rank - step - shift) % p]
'''},
            "off-by-one segment in the reduce-scatter pass": {"ring": '''
left, right = _peer(group, (rank - 1) % p), _peer(group, (rank + 1) % p)

def segment(step):
    return segments[(rank - step) % p]
'''},
            "received piece copied, not accumulated": {"combine": '''
if combine is not None:
    buf[piece[0]:piece[1]].copy_(target)
'''},
        },
        grade=_on_ranks("ring", ("ring",), RING_CHECKS),
    ),
    KernelExercise(
        key="comm/ring_chunked", module="kernels.comm.ring",
        title="Pipelining the ring: cut each segment into pieces",
        task="With chunks > 1 the ring forwards a segment piece by piece: a piece goes on to "
             "the right as soon as it has arrived and been combined, so the combine of one piece "
             "overlaps the transfer of the next. Write _pieces: the non-empty sub-ranges "
             "(start, stop) of buf that cut `segment` into `chunks` near-equal pieces (fewer when "
             "the segment has fewer elements).",
        todo={"pieces": "return [segment]  # TODO: `chunks` near-equal, non-empty pieces of the segment"},
        hints=(
            "bounds(numel, parts) already cuts numel elements into near-equal (start, stop) "
            "ranges, the first numel % parts one longer; cut the segment's length with it.",
            "bounds counts from 0, the segment starts at `start` in buf: shift every range. A "
            "segment shorter than chunks gives empty ranges; drop them, both sides skip them "
            "alike.",
            "return [(start + a, start + b) for a, b in bounds(stop - start, chunks) if b > a]",
        ),
        wrong={
            "pieces not offset by the segment's start": {"pieces": '''
return [(a, b) for a, b in bounds(stop - start, chunks) if b > a]
'''},
            "chunks read as the piece length": {"pieces": '''
return [(a, min(a + chunks, stop)) for a in range(start, stop, chunks)]
'''},
            "empty pieces kept": {"pieces": '''
return [(start + a, start + b) for a, b in bounds(stop - start, chunks)]
'''},
        },
        grade=_on_ranks("ring", ("ring_chunked",), RING_CHECKS + f", chunks={CHUNKS}"),
    ),
    KernelExercise(
        key="comm/pairwise", module=ALL_TO_ALL,
        title="Pairwise all-to-all: whom to send to and receive from in each round",
        task="All-to-all moves block j of every rank's input to rank j. Pairwise exchange runs "
             "p-1 rounds; write round `step`'s calls in post(): the rank this one sends its block "
             "to and the rank it receives a block from, so that every send meets its receive in "
             "the same round. Blocks of size 0 are not sent, and not received either: both sides "
             "know the sizes.",
        todo={"peers": 'raise NotImplementedError("TODO: round step\'s irecv and isend")'},
        hints=(
            "In round s rank r sends to r + s and receives from r - s (mod p): then rank r + s, "
            "in the same round, receives from (r + s) - s = r.",
            "send[j] is the block for rank j, recv[i] the block from rank i; post a receive only "
            "if recv[frm] has elements and a send only if send[to] has: the other side decides "
            "from the same sizes.",
            "to, frm = (rank + step) % p, (rank - step) % p; if recv[frm].numel(): "
            "works.append(dist.irecv(recv[frm], peer(frm), group=group)); the isend likewise.",
        ),
        wrong={
            "receives from rank + step": {"peers": '''
to, frm = (rank + step) % p, (rank + step) % p
if recv[frm].numel():
    works.append(dist.irecv(recv[frm], peer(frm), group=group))
if send[to].numel():
    works.append(dist.isend(send[to], peer(to), group=group))
'''},
            "receive skipped on the size of the block sent": {"peers": '''
to, frm = (rank + step) % p, (rank - step) % p
if send[to].numel():
    works.append(dist.irecv(recv[frm], peer(frm), group=group))
    works.append(dist.isend(send[to], peer(to), group=group))
'''},
            "round s sends to r + s + 1": {"peers": '''
to, frm = (rank + step + 1) % p, (rank - step - 1) % p
if recv[frm].numel():
    works.append(dist.irecv(recv[frm], peer(frm), group=group))
if send[to].numel():
    works.append(dist.isend(send[to], peer(to), group=group))
'''},
        },
        grade=_on_ranks("all_to_all", ("pairwise",), "all_to_all_single (uneven and even splits, pairwise)"),
    ),
    KernelExercise(
        key="comm/direct", module=ALL_TO_ALL,
        title="Direct all-to-all: post everything, then wait",
        task="post(step) posts round step's receive and send and returns their work handles. "
             "Write the schedule of both algorithms: pairwise waits for each round before "
             "posting the next (one send and one receive in flight), direct posts every round "
             "at once and waits only at the end (one latency instead of p-1). Either way, "
             "nothing may be left unwaited when exchange returns.",
        todo={"schedule": 'raise NotImplementedError("TODO: post the rounds; wait per round (pairwise) '
                          'or once at the end (direct)")'},
        hints=(
            "A work handle's wait() blocks until that send or receive is complete; the data of a "
            "receive is only there after it.",
            "Collect the handles in `pending`; pairwise waits for them and empties the list "
            "after each round, direct lets them pile up.",
            "for step in range(1, p): pending += post(step); if pairwise: wait for all and "
            "pending = []. After the loop, wait for whatever is still pending.",
        ),
        wrong={
            "waits inside every round": variant(
                ALL_TO_ALL, "schedule", ("    if pairwise:\n        for work in pending:\n"
                                         "            work.wait()\n        pending = []",
                                         "    for work in pending:\n        work.wait()\n    pending = []")),
            "never waits inside a round": variant(
                ALL_TO_ALL, "schedule", ("    if pairwise:\n        for work in pending:\n"
                                         "            work.wait()\n        pending = []\n", "")),
            "no wait after the last round": variant(
                ALL_TO_ALL, "schedule", ("\nfor work in pending:\n    work.wait()", "")),
        },
        grade=_on_ranks("all_to_all", ("pairwise", "direct"),
                        "all_to_all_single (uneven and even splits, pairwise and direct)"),
    ),
)
