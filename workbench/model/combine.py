"""The combination rule: per-iteration costs of the hot loop -> the time of a whole launch.

A *round* is one hot-loop iteration of every program resident on a CU (``R`` programs of
``num_warps`` waves, so ``W = R x num_warps / 4`` waves per SIMD). Its resources, in cycles:

* per SIMD: matrix cores ``W x`` MFMA cycles, VALU ``W x`` instructions x 4 (a
  transcendental x 16), SALU ``W x``
  instructions x 4 (``machine.yaml``);
* per CU: LDS ``R x num_warps x`` bank-slot bytes / the target's LDS bytes per clock
  (``machine.yaml``: 128 on gfx942 and sm_90, 256 on gfx950), L1 requests ``R x
  num_warps x`` global bytes / the spec's L1 rate per CU.

Overlap: the busiest resource runs all round; of the others' time a fraction ``1 - 1/W``
hides behind it (another wave issues while one waits on its own MFMA or LDS result), so
one wave per SIMD serializes everything and many waves approach the plain maximum.
On sm90 a loop that leaves a ``wgmma`` group in flight (:mod:`.ptx_loop`) feeds the tensor
cores, the shared memory and the L1 asynchronously (``wgmma``, ``cp.async``): those three
(:data:`ASYNCHRONOUS`) then hide wholly behind the busiest resource, the ALU only
``1 - 1/W`` of it (an assumption: the engines' own contention is not modelled).
Latency: a global load issued ``d = num_stages - 1`` iterations ahead needs ``d`` rounds
to cover the memory latency ``L`` (``round >= L / d``); without prefetch (``d = 0``) a
program waits ``L`` and then computes its share (``round >= L + round_issue / R``).

A program takes ``L`` to start (its first loads), ``trips`` rounds, and ``L`` plus the
store of its C tile at the CU's L1 rate to finish. A launch with a device-side tile
schedule (:class:`Schedule`, grouped GEMM) adds its cycles before each tile's first loads
(and once before a persistent program's first tile); its surplus programs, which run only
the schedule, take their cycles from the slots of the whole chip. A wave of programs (:mod:`.tiles`)
takes the longer of that and each memory level's bytes over its bandwidth (a level the
GPU's spec gives no bandwidth for is left out: MI355X's Infinity Cache); the launch is
the sum of its waves.

Limits, known and left: one clock (the spec's peak engine clock; a GPU under a full
MFMA load may clock lower), no launch overhead, no L2/MALL capacity limit (a wave's
shared operands always hit), all lanes active, LDS accesses of 8 bytes and more taken
as free of bank conflicts, the K tail charged as a whole iteration, v6's fixup kernel
charged its traffic and one program's start and end (with the main kernel's occupancy),
the prefetch distance taken from ``num_stages``, not from where the compiled loop waits
(GEMM v4's gfx942 register prefetch is waited on in the iteration that issues it,
``tests/test_isa_waits.py``: the latency rule is generous to such loops).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..isa.occupancy import SIMDS_PER_CU
from .loop import LoopMix
from .tiles import Wave

LEVEL_NAMES = {"l2": "L2", "llc": "Infinity Cache", "hbm": "HBM"}
ASYNCHRONOUS = ("matrix cores", "LDS", "L1 requests")


@dataclass(frozen=True)
class Chip:
    """The numbers of one GPU the rule needs, already in per-clock units where it can."""

    clock_hz: float
    compute_units: int
    xcds: int
    l1_bytes_per_clk: float        # per CU
    lds_bytes_per_clk: float       # per CU
    valu_cycles: float
    transcendental_cycles: float
    salu_cycles: float
    latency_cycles: float
    bandwidth: dict[str, float]    # memory level -> bytes/s


@dataclass(frozen=True)
class Schedule:
    """A device-side tile schedule, in cycles (:mod:`.tile_schedule`)."""

    per_tile: float   # each program, before each tile's first loads
    once: float       # each program, once before its first tile (a persistent program's scan)
    surplus: int      # programs that run ``once + per_tile`` only and exit


def round_costs(mix: LoopMix, num_warps: int, resident: int, chip: Chip) -> dict[str, float]:
    """Cycles each resource needs for one round of ``resident`` programs on a CU."""
    per_simd = resident * num_warps / SIMDS_PER_CU
    waves = resident * num_warps
    return {"matrix cores": per_simd * mix.mfma_cycles,
            "VALU": per_simd * ((mix.valu - mix.transcendental) * chip.valu_cycles
                                + mix.transcendental * chip.transcendental_cycles),
            "SALU": per_simd * mix.salu * chip.salu_cycles,
            "LDS": waves * mix.lds_slot_bytes / chip.lds_bytes_per_clk,
            "L1 requests": waves * mix.global_bytes / chip.l1_bytes_per_clk}


def overlapped(mix: LoopMix) -> tuple[str, ...]:
    """The resources that hide wholly behind the busiest one in ``mix``'s loop (see above)."""
    return ASYNCHRONOUS if mix.matrix_in_flight else ()


def round_time(costs: dict[str, float], waves_per_simd: float, resident: int, stages: int,
               latency: float, hide: tuple[str, ...] = ()) -> tuple[float, str, float]:
    """(cycles, what binds, the latency floor) of one round under the rules above; ``hide``:
    :func:`overlapped`'s resources."""
    busiest = max(costs, key=costs.get)
    hidden = 1 - 1 / max(waves_per_simd, 1.0)
    exposed = sum(cost for name, cost in costs.items() if name != busiest and name not in hide)
    issue = costs[busiest] + (1 - hidden) * exposed
    ahead = stages - 1
    floor = latency / ahead if ahead >= 1 else latency + issue / resident
    return (floor, "memory latency", floor) if floor > issue else (issue, busiest, floor)


def launch(mix: LoopMix, num_warps: int, stages: int, max_resident: int, waves: list[Wave],
           trips_of, c_tile_bytes: float, traffic_of, chip: Chip,
           schedule: Schedule | None = None) -> tuple[float, str, dict[str, float]]:
    """(seconds, bound, seconds per resource) of a launch given as waves of programs.

    ``trips_of(k)`` gives a program's loop iterations over a K extent; ``traffic_of(wave)``
    the bytes per memory level of one wave; ``schedule``: the launch's tile schedule, if any."""
    breakdown: dict[str, float] = {}
    time_by_bound: dict[str, float] = {}
    total = 0.0

    def add(name: str, seconds: float) -> None:
        breakdown[name] = breakdown.get(name, 0.0) + seconds

    for index, wave in enumerate(waves):
        resident = min(max_resident, -(-len(wave.placed) // chip.compute_units))
        costs = round_costs(mix, num_warps, resident, chip)
        cycles, binds, floor = round_time(costs, resident * num_warps / SIMDS_PER_CU, resident, stages,
                                          chip.latency_cycles, overlapped(mix))
        trips = trips_of(wave.k)
        ends = 2 * chip.latency_cycles + resident * c_tile_bytes / chip.l1_bytes_per_clk
        start = 0.0 if schedule is None else schedule.per_tile + (schedule.once if index == 0 else 0.0)
        compute = (ends + start + trips * cycles) / chip.clock_hz
        if schedule is not None:
            add("tile schedule", start / chip.clock_hz)
        for name, cost in costs.items():
            add(name, trips * cost / chip.clock_hz)
        add("memory latency", trips * floor / chip.clock_hz)
        add("prologue + epilogue", ends / chip.clock_hz)
        memory = {LEVEL_NAMES[level]: nbytes / chip.bandwidth[level]
                  for level, nbytes in traffic_of(wave).items() if level in chip.bandwidth}
        for name, seconds in memory.items():
            add(name, seconds)
        slowest = max(memory, key=memory.get, default=None)
        if slowest is not None and memory[slowest] > compute:
            binds, compute = slowest, memory[slowest]
        time_by_bound[binds] = time_by_bound.get(binds, 0.0) + compute
        total += compute
    if schedule is not None and schedule.surplus:
        surplus = schedule.surplus * (schedule.per_tile + schedule.once) / (chip.compute_units * max_resident)
        add("tile schedule", surplus / chip.clock_hz)
        time_by_bound["tile schedule"] = time_by_bound.get("tile schedule", 0.0) + surplus / chip.clock_hz
        total += surplus / chip.clock_hz
    return total, max(time_by_bound, key=time_by_bound.get), breakdown
