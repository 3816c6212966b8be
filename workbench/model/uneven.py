"""A launch of programs that each walk their own number of iterations of one or more
compiled loops (attention's key loops): each loop weighed per round (:mod:`.combine`), each
program's time its prologue and epilogue plus its iterations x round times, the programs
dealt in launch order to the first of ``CUs x resident`` slots that frees up.

A causal launch's programs are uneven (query block ``i`` walks ``i + 1`` key blocks): the
slots idle at its end show in the breakdown as "idle slots". A tail of fewer resident
programs is timed at the full residency.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

from ..isa import parse as isa_parse
from ..isa.occupancy import SIMDS_PER_CU
from . import chip as chip_model
from . import combine, loop

IDLE = "idle slots (uneven programs, last wave)"


@dataclass(frozen=True)
class UnevenLaunch:
    seconds: float                  # when the last program ends
    bound: str                      # the binding resource of the loop that takes the most time
    breakdown: dict[str, float]     # seconds per resource, spread over the slots
    mixes: list[loop.LoopMix]       # the compiled loops, in text order
    resident: int                   # programs per CU


def loops(report, count: int, target: str, wave_size: int) -> list[loop.LoopMix]:
    """The ``count`` innermost loops with MFMAs of a compiled kernel, weighed, in text order."""
    found = isa_parse.matrix_loops(isa_parse.code_lines(report.asm, report.dialect), report.dialect)
    if len(found) != count:
        raise ValueError(f"{report.kernel_name} has {len(found)} loops with MFMAs, the model expects {count}")
    return [chip_model.weigh("\n".join(lines), target, wave_size) for lines in found]


def run(report, mixes: list[loop.LoopMix], per_block: list[tuple[int, ...]], copies: int,
        store_bytes: float, chip: combine.Chip) -> UnevenLaunch:
    """``per_block[i]``: iterations of each loop of the program of block ``i``; the grid holds
    ``copies`` programs of every block (heads, batches), block fastest; each program stores
    ``store_bytes`` at its end."""
    num_warps, stages = report.options["num_warps"], report.options.get("num_stages", 1)
    resident = chip_model.programs_per_cu(report)
    costs = [combine.round_costs(mix, num_warps, resident, chip) for mix in mixes]
    rounds = [combine.round_time(c, resident * num_warps / SIMDS_PER_CU, resident, stages, chip.latency_cycles,
                                 combine.overlapped(mix)) for c, mix in zip(costs, mixes)]
    ends = 2 * chip.latency_cycles + resident * store_bytes / chip.l1_bytes_per_clk
    cycles = [ends + sum(n * r[0] for n, r in zip(trips, rounds)) for trips in per_block]
    slots = chip.compute_units * resident
    last = makespan([c for _ in range(copies) for c in cycles], slots)
    breakdown: dict[str, float] = {}
    for k, (loop_costs, (_, _, floor)) in enumerate(zip(costs, rounds)):
        iters = copies * sum(t[k] for t in per_block) / slots / chip.clock_hz
        for name, value in {**loop_costs, "memory latency": floor}.items():
            breakdown[name] = breakdown.get(name, 0.0) + iters * value
    breakdown["prologue + epilogue"] = copies * len(per_block) * ends / slots / chip.clock_hz
    breakdown[IDLE] = (last - copies * sum(cycles) / slots) / chip.clock_hz
    by_loop = [sum(t[k] for t in per_block) * rounds[k][0] for k in range(len(mixes))]
    bound = rounds[max(range(len(mixes)), key=by_loop.__getitem__)][1]
    return UnevenLaunch(last / chip.clock_hz, bound, breakdown, mixes, resident)


def makespan(durations: list[float], slots: int) -> float:
    """When the last program ends, each program taken in order by the first free slot."""
    free = [0.0] * min(slots, len(durations))
    for duration in durations:
        heapq.heapreplace(free, free[0] + duration)
    return max(free)


def with_memory(launch: UnevenLaunch, traffic: dict[str, float], chip: combine.Chip) -> tuple[float, str, dict]:
    """(seconds, bound, breakdown) once each memory level's bytes over its bandwidth is
    weighed against the launch: the slower of the two sets the time."""
    memory = {combine.LEVEL_NAMES[level]: nbytes / chip.bandwidth[level]
              for level, nbytes in traffic.items() if level in chip.bandwidth}
    seconds, bound = launch.seconds, launch.bound
    slowest = max(memory, key=memory.get)
    if memory[slowest] > seconds:
        seconds, bound = memory[slowest], slowest
    return seconds, bound, {**launch.breakdown, **memory}
