"""What every tuned rung shares: its config as a dict, pinned settings, the shipped
ahead-of-time table, and the timing of the candidates on the first call of a key.

Each tuned op writes down its candidates per ahead-of-time target and ships the
verdicts of compiling them (``<op>/tuned_space.json``, written by
``python -m workbench.tune_space``): a config that spills on its target is never
timed. The rung then times what the table keeps and its own per-shape prune
leaves, once per key and process (:func:`fastest`).
"""
from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Callable

import triton


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


def target(table: Path, backend: str, arch: str) -> str:
    """The table a device reads: its own arch on AMD (gfx942's for AMD archs not in the
    table, unchecked there); sm90's for every NVIDIA GPU (the only one compiled for)."""
    if backend == "cuda":
        return "sm90"
    return arch if arch in shipped(table) else "gfx942"


def kept(table: Path, name: str, candidates: list[triton.Config]) -> list[triton.Config]:
    """The ``candidates`` that target ``name``'s table keeps, in candidate order."""
    verdicts = [entry["config"] for entry in shipped(table)[name]["kept"]]
    return [c for c in candidates if as_dict(c) in verdicts]


def space(table: Path, backend: str, arch: str, candidates: Callable[[str], list[triton.Config]],
          interpreter: list[triton.Config]) -> list[triton.Config]:
    """What a tuned rung may time here: ``interpreter`` on the interpreter, else the
    ``candidates`` of the device's target that ``table`` keeps, in candidate order."""
    if backend == "interpreter":
        return interpreter
    if backend not in ("hip", "cuda"):
        raise ValueError(f"no tuned config space for backend {backend!r}")
    name = target(table, backend, arch)
    return kept(table, name, candidates(name))


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
    (always, on the interpreter, whose space has one config)."""
    if len(candidates) == 1:
        return candidates[0]
    times = [time_ms(lambda cfg=cfg: run(cfg)) for cfg in candidates]
    return candidates[times.index(min(times))]
