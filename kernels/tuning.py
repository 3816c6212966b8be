"""What every tuned rung shares: its config as a dict, pinned settings, the shipped
ahead-of-time table, and the one place a key's config is chosen (:func:`choice`).

Each tuned op writes down its candidates per ahead-of-time target and ships the
verdicts of compiling them at bf16 and at float32 (``<op>/tuned_space.json``, a section per
target and dtype class, :func:`section`; written by ``python -m workbench.isa.tune_space``):
a config that spills on its target at the launch's dtype is never timed, unless every config
of its group does (then those that can launch are, least spilling first). The rung then asks :func:`choice` for the config of its key among what the
table keeps and its own per-shape prune leaves.

Timing belongs in a tuning pass, never in a training step: a step that stops to time
a new key's candidates takes seconds instead of milliseconds and syncs the device. So
a key is timed (:func:`fastest`) only in mode "time" (the default, and what
``kernels.tune`` sets for its pass); once timed, its choice is kept for the process and
on disk (:mod:`.tuning_cache`). In mode "frozen" (the training benchmark's steps) and
during CUDA-graph capture a key nobody timed takes its first candidate untimed and is
noted "untuned" (:func:`recording`), so the benchmark can say its steps ran a prior.

A ranker (:func:`set_ranker`) may order a key's candidates by predicted time: the
workbench installs its performance model as one (``workbench.model.tuning``; kernels
never imports workbench). Then only the ranker's shortlist is timed, and a key that
cannot be timed (frozen mode, graph capture) takes the ranker's best, noted
"predicted", instead of the first candidate. Without a ranker, or where it cannot tell
(an op, a GPU or a config the model does not cover), every candidate is timed and an
untimed key takes the first: the prior.
"""
from __future__ import annotations

import contextlib
import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import torch
import triton
from triton.runtime.errors import OutOfResources

from . import plans, tuning_cache

MODES = ("time", "frozen")
_mode = "time"
_memo: dict[tuple, tuple] = {}  # (op, key) -> ("only" or "cached", config): no JSON on a launch's way
_record: dict | None = None     # while recording: (op, key) -> (how, config)
_predicted: dict[tuple, dict] = {}   # (op, key) -> the ranker's untimed pick, for untimed launches


@dataclass(frozen=True)
class Problem:
    """A tuned launch in its op's terms, which is what a ranker predicts: the registry's op
    and rung label, the shape in the op's shape order, the dtype; ``kernel``: which launch of
    a rung that tunes several (grouped GEMM v4's "forward", "dx", "dw"; MoE v3's "gate_up",
    "down"; attention v5's backward "dkdv", "dq"; the FP8 GEMM's binary at its operand layout, ``kernels.gemm_fp8.configs.part``),
    None for a rung's one tuned launch."""

    op: str
    rung: str
    shape: tuple
    dtype: torch.dtype
    kernel: str | None = None


Ranker = Callable[[Problem, list[dict]], "list[int] | None"]
"""``ranker(problem, candidates)`` -> the indices of the candidates worth timing, best first
(the first is the pick when nothing may be timed), or None when it cannot tell."""
_ranker: Ranker | None = None


def set_ranker(ranker: Ranker | None) -> Ranker | None:
    """Rank candidates with ``ranker`` from now on (None: the prior); returns the one before.
    Choices already made (this process, the cache file) stand."""
    global _ranker
    before, _ranker = _ranker, ranker
    _predicted.clear()
    return before


def shortlist(problem: Callable[[], Problem] | None, candidates: list[dict]) -> tuple[list[dict], bool]:
    """(the candidates to time, best first; whether a ranker chose them). Without a ranker,
    a ``problem()`` or an answer from it: every candidate, in candidate order."""
    if _ranker is None or problem is None or len(candidates) < 2:
        return candidates, False
    problem = problem()
    order = _ranker(problem, candidates)
    if order is None:
        return candidates, False
    if not order or len(set(order)) != len(order) or not all(0 <= i < len(candidates) for i in order):
        raise ValueError(f"a ranker must give distinct candidate indices below {len(candidates)}, "
                         f"best first; it gave {order!r} for {problem}")
    return [candidates[i] for i in order], True


def as_dict(c: triton.Config) -> dict:
    """A config as one flat dict (tile constexprs, num_warps, num_stages, AMD knobs)."""
    return {**c.kwargs, "num_warps": c.num_warps, "num_stages": c.num_stages}


def with_overrides(cfg: dict, overrides: dict | None) -> dict:
    """``cfg`` with some settings replaced; an unknown name is an error, not a no-op."""
    unknown = set(overrides or ()) - set(cfg)
    if unknown:
        raise ValueError(f"config overrides {sorted(unknown)} are not settings of this rung; "
                         f"known: {sorted(cfg)}")
    return {**cfg, **(overrides or {})}


@functools.lru_cache(maxsize=None)
def shipped(table: Path) -> dict:
    """An ahead-of-time table: per target, the configs kept and dropped, with their resources."""
    return json.loads(table.read_text())["targets"]


WIDE = ":fp32"   # the section of a target's verdicts compiled at float32 (:func:`section`)


def section(target_name: str, dtype: torch.dtype | None) -> str:
    """The table section of ``target_name``'s verdicts for operands of ``dtype``: float32 takes
    its own (``"gfx942:fp32"``: its tiles need twice the LDS and registers of a 2-byte dtype's,
    and a config that fits bf16 may not launch at all); bf16, fp16 and None take the target's
    (compiled at bf16, which on gfx942 rounds in software and needs no fewer registers than
    fp16: ``tests/test_gemm_tuning.py`` compiles a sample)."""
    return target_name + WIDE if dtype == torch.float32 else target_name


def target(table: Path, backend: str, arch: str, dtype: torch.dtype | None = None) -> str:
    """The table section a device reads for ``dtype``: its own arch on AMD (gfx942's for AMD
    archs not in the table, unchecked there); sm90's for every NVIDIA GPU (the only one compiled
    for); its float32 section (:func:`section`) where the table has one."""
    tables = shipped(table)
    name = "sm90" if backend == "cuda" else arch if arch in tables else "gfx942"
    wide = section(name, dtype)
    return wide if wide in tables else name


def kept(table: Path, name: str, candidates: list[triton.Config], binary: str | None = None) -> list[triton.Config]:
    """The ``candidates`` that table section ``name`` keeps, in its order: candidate order, then,
    where a group of configs kept none that fits, the group's least spilling first (entries marked
    "spilling", ``workbench.isa.tune_space.least_spilling``); in a table that orders its groups
    for their prior (attention's backward, ``workbench.isa.tune_space.prior_first``), no spills,
    then on AMD no 8/16-bit LDS ops and more waves/SIMD, on sm90 ``wgmma``-only configs, first
    within each group. ``binary``: in a table
    split per binary (the FP8 GEMM's, ``workbench.isa.tune_space``'s ``per_binary``: per binary
    and operand layout), the part of the section that binary's own compiles keep."""
    verdicts = shipped(table)[name]
    if binary is not None:
        if binary not in verdicts:
            raise ValueError(f"{table.name} has no binary {binary!r} in section {name!r}; it has {sorted(verdicts)}")
        verdicts = verdicts[binary]
    by_config = {json.dumps(as_dict(c), sort_keys=True): c for c in candidates}
    found = (json.dumps(entry["config"], sort_keys=True) for entry in verdicts["kept"])
    return [by_config[text] for text in found if text in by_config]


@functools.lru_cache(maxsize=None)
def kept_space(table: Path, name: str, candidates: Callable[[str], list[triton.Config]],
               binary: str | None = None) -> tuple[triton.Config, ...]:
    """``kept(table, name, candidates(target), binary)`` (``target``: the section's target,
    ``name`` without :data:`WIDE`), worked out once per process: it builds every candidate and
    compares it with every verdict (2 ms for attention's gfx942 space on a busy two-core AMD EPYC,
    2026-12-02), and the rungs ask for their space on every call. Keyed by the ``candidates``
    function itself, so a replaced one is asked again."""
    return tuple(kept(table, name, candidates(name.removesuffix(WIDE)), binary))


def space(table: Path, backend: str, arch: str, candidates: Callable[[str], list[triton.Config]],
          interpreter: list[triton.Config], dtype: torch.dtype | None = None,
          binary: str | None = None) -> list[triton.Config]:
    """What a tuned rung may time here for operands of ``dtype``: ``interpreter`` on the
    interpreter, else the ``candidates`` of the device's target that ``table``'s section for
    ``dtype`` keeps (:func:`target`; ``binary``: for that binary, in a table split per binary),
    in the section's order (:func:`kept`)."""
    if backend == "interpreter":
        return interpreter
    if backend not in ("hip", "cuda"):
        raise ValueError(f"no tuned config space for backend {backend!r}")
    return list(kept_space(table, target(table, backend, arch, dtype), candidates, binary))


def tile(c: triton.Config) -> tuple[int, int]:
    return c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]


def fits(c: triton.Config, m: int, n: int) -> bool:
    """The tile is at most the next power of two (at least 16) of the rows and columns it covers."""
    return c.kwargs["BLOCK_M"] <= max(16, triton.next_power_of_2(m)) and \
        c.kwargs["BLOCK_N"] <= max(16, triton.next_power_of_2(n))


def per_tile(configs: list[triton.Config], sizes: list[tuple[int, int]], most: int) -> list[triton.Config]:
    """The first ``most`` configs of each tile size in ``sizes``, tile by tile, in config order."""
    return [c for size in sizes for c in [c for c in configs if tile(c) == size][:most]]


def _settings(c: triton.Config) -> set[tuple[str, object]]:
    return {("tile", tile(c)), *((k, v) for k, v in as_dict(c).items() if k not in ("BLOCK_M", "BLOCK_N"))}


def distinct(configs: list[triton.Config], most: int) -> list[triton.Config]:
    """Up to ``most`` configs, the first one first, each next one the config that brings the
    most settings (a tile, a warp count, a stage count, a knob's value) not yet chosen, then
    the one farthest from every chosen config in settings changed; ties go to the earlier.

    Near-copies of one point (the same tile and warps, a knob apart) tell a tuner little;
    points that differ in every setting cover the space with few timings."""
    chosen, rest = configs[:1], configs[1:]
    while rest and len(chosen) < most:
        seen = set().union(*map(_settings, chosen))
        score = [(len(_settings(c) - seen), min(len(_settings(c) - _settings(o)) for o in chosen))
                 for c in rest]
        chosen.append(rest.pop(score.index(max(score))))
    return chosen


def time_ms(fn: Callable[[], object]) -> float:
    """How a tuner times one candidate launch on a GPU (tests replace it with a fake clock)."""
    return triton.testing.do_bench(fn)


def fastest(candidates: list[dict], run: Callable[[dict], object]) -> dict:
    """The candidate whose ``run`` :func:`time_ms` measures fastest; a single one untimed
    (always, on the interpreter, whose space has one config). A candidate the device cannot
    launch (Triton's ``OutOfResources``: more LDS / shared memory or registers than it has, on
    a device or dtype its table section was not compiled for) is skipped, as Triton's own
    autotuner skips it; if none can launch, the last refusal is raised."""
    if len(candidates) == 1:
        return candidates[0]
    times, refused = [], None
    for cfg in candidates:
        try:
            times.append(time_ms(lambda cfg=cfg: run(cfg)))
        except OutOfResources as error:
            times.append(float("inf"))
            refused = error
    if refused is not None and min(times) == float("inf"):
        raise refused
    return candidates[times.index(min(times))]


@contextlib.contextmanager
def mode(name: str) -> Iterator[None]:
    """Within the block, a key without a choice is timed ("time") or is not ("frozen")."""
    global _mode
    if name not in MODES:
        raise ValueError(f"tuning mode must be one of {MODES}, got {name!r}")
    before, _mode = _mode, name
    try:
        yield
    finally:
        _mode = before


@contextlib.contextmanager
def recording() -> Iterator[dict]:
    """A dict that fills, within the block, with ``(op, key text) -> (how, config)`` for each
    key chosen: "timed", "cached" (an earlier choice), "only" (a single candidate),
    "predicted" (the ranker's best, untimed) or "untuned" (first candidate, untimed: frozen
    mode or graph capture). Keys are texts
    as :func:`kernels.tuning_cache.key_text` writes them."""
    global _record
    before, _record = _record, {}
    seen: dict = {}
    try:
        with plans.paused():   # every call decides again, so its keys are recorded
            yield seen
    finally:
        seen.update({(op, tuning_cache.key_text(key)): v for (op, key), v in _record.items()})
        if before is not None:   # an enclosing recording sees these keys too
            for k, v in _record.items():
                before.setdefault(k, v)
        _record = before


def _capturing() -> bool:
    try:
        return torch.cuda.is_current_stream_capturing()
    except RuntimeError:   # a CPU build of torch has no CUDA graphs
        return False


def _noted(op: str, key: tuple, how: str, cfg: dict) -> dict:
    if _record is not None:
        _record.setdefault((op, key), (how, cfg))
    return cfg


def choice(op: str, key: tuple, candidates: Callable[[], list[dict]],
           run: Callable[[dict], object], problem: Callable[[], Problem] | None = None) -> dict:
    """The config ``op`` launches for ``key`` (a tuple of str, int, float, bool, None or
    ``torch.dtype``) among ``candidates()``: the one chosen before (this process, or the
    cache file) if it is still a candidate, else, in mode "time" and outside graph capture,
    the :func:`fastest` by ``run`` of the :func:`shortlist` (every candidate unless a
    ranker is installed and knows ``problem()``), kept for the process and saved; else the
    shortlist's first, untimed and not saved ("predicted" where a ranker chose it, kept for
    the process, as is a shortlist of one in mode "time"; "untuned", the first candidate,
    otherwise). ``candidates`` and ``problem``
    are only called on a key's first lookup: a launch of a known key costs one dict lookup."""
    hit = _memo.get((op, key))
    if hit is not None:
        return _noted(op, key, *hit)
    untimed = _mode == "frozen" or _capturing()
    if untimed and (op, key) in _predicted:
        plans.unsettled()   # a later timed lookup may choose otherwise: a plan on it is used once
        return _noted(op, key, "predicted", _predicted[op, key])
    candidates = candidates()
    if len(candidates) == 1:
        how, cfg = "only", candidates[0]
    else:
        text = tuning_cache.key_text(key)
        stored = tuning_cache.store().get(op, text)
        if stored in candidates:
            how, cfg = "cached", candidates[candidates.index(stored)]
        else:
            ranked, by_ranker = shortlist(problem, candidates)
            if untimed:
                plans.unsettled()   # not kept: a launch plan built on it is used once
                if by_ranker:
                    _predicted[op, key] = ranked[0]
                return _noted(op, key, "predicted" if by_ranker else "untuned", ranked[0])
            if by_ranker and len(ranked) == 1:   # nothing to time against: kept, not saved
                how, cfg = "predicted", ranked[0]
            else:
                how, cfg = "timed", fastest(ranked, run)
                tuning_cache.store().put({op: {text: cfg}})
    _memo[(op, key)] = (how if how in ("only", "predicted") else "cached", cfg)
    return _noted(op, key, how, cfg)


def adopt(choices: dict[str, dict[str, dict]]) -> None:
    """Take ``choices`` (``{op: {key text: config}}``, e.g. rank 0's) over this process's."""
    tuning_cache.store().put(choices)
    _memo.clear()
    plans.invalidate()
    _predicted.clear()


def forget() -> None:
    """Forget every choice of this process; the next lookup reads the cache file again (tests)."""
    _memo.clear()
    _predicted.clear()
    tuning_cache.forget()
    plans.invalidate()
