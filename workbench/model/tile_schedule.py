"""What the grouped kernels' device-side tile schedule costs (:mod:`kernels.moe.grouped_gemm.schedule`),
weighed from the compiled code.

A program of grouped GEMM v2 (and of the FP8 grouped GEMM v0, its launch) loads the G
offsets, scans them (``group_tiles``) and locates its row tile (``locate``) before it can
address its first operands: one memory latency (the loads its operand addresses wait on)
and the scan's instructions, in every program. Its upper-bound grid adds programs past the
last tile that do the same and exit. v4's persistent programs load and scan once and locate
each tile they take. The instructions are those the compiled kernel's line table
(:func:`workbench.isa.parse.by_source_line`) puts on each function's lines of
``schedule.py``, issued by every wave of the program, ``num_warps / 4`` waves to a SIMD:
scalar ALU ones at the SALU rate, every other one (vector ALU, LDS) at the VALU rate
(``machine.yaml``), waits and branches free, as in :mod:`.loop`. Not charged: the LDS
round trips of the scan's reductions, and dispatching a surplus program.
"""
from __future__ import annotations

import inspect

from kernels.moe.grouped_gemm import schedule

from ..isa.occupancy import SIMDS_PER_CU
from ..isa.parse import by_source_line, category, code_lines
from .combine import Chip, Schedule
from .loop import NOT_SALU

FILE = "schedule.py"
SCAN = (schedule.clamped, schedule.group_tiles)   # the offsets' loads and the scan over them
LOCATE = (schedule.locate,)


def _lines(functions) -> set[int]:
    out = set()
    for f in functions:
        source, first = inspect.getsourcelines(f.fn)
        out.update(range(first, first + len(source)))
    return out


def instructions(report, functions) -> list[str]:
    """The mnemonics the compiled kernel issues on the lines of ``functions`` (of schedule.py)."""
    lines = _lines(functions)
    return [op for op, line in by_source_line(code_lines(report.asm, "amdgcn"), FILE) if line in lines]


def cycles(ops: list[str], num_warps: int, chip: Chip) -> float:
    """Issue cycles on one SIMD of a program's ``num_warps`` waves running ``ops``, plus a
    memory latency if they load from global memory."""
    per_wave = sum(0 if op.startswith(NOT_SALU) else chip.salu_cycles if op.startswith("s_") else chip.valu_cycles
                   for op in ops)
    loads = any(category(op, "amdgcn") == "global_load" or op.startswith(("s_load", "s_buffer_load")) for op in ops)
    return per_wave * num_warps / SIMDS_PER_CU + (chip.latency_cycles if loads else 0.0)


def cost(layout: str, report, num_warps: int, surplus: int, chip: Chip) -> Schedule | None:
    """The schedule of a grouped launch laid out as ``layout`` ("v2": every program scans;
    "v4": once per persistent program; "v1": none), ``surplus`` programs past the last tile."""
    if layout == "v1":
        return None
    scan = cycles(instructions(report, SCAN), num_warps, chip)
    locate = cycles(instructions(report, LOCATE), num_warps, chip)
    if layout == "v2":
        return Schedule(per_tile=scan + locate, once=0.0, surplus=surplus)
    return Schedule(per_tile=locate, once=scan, surplus=surplus)
