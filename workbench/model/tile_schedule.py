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
(``machine.yaml``), waits and branches free, as in :mod:`.loop`; on sm_90 the PTX's
instructions by the same rule, ``num_warps / 4`` warps to an SM sub-partition, every one
at the ALU rate, loads included, but those of :data:`.ptx_loop.NOT_ALU` (moves, branches,
barriers, fences; PTX is not SASS).
Not charged: the LDS (shared memory) round trips of the scan's reductions, and dispatching
a surplus program.
"""
from __future__ import annotations

import inspect

from kernels.moe.grouped_gemm import schedule

from ..isa.occupancy import SIMDS_PER_CU
from ..isa.parse import by_source_line, category, code_lines
from .combine import Chip, Schedule
from .loop import NOT_SALU
from .ptx_loop import NOT_ALU

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
    return [op for op, line in by_source_line(code_lines(report.asm, report.dialect), FILE, report.dialect)
            if line in lines]


def cycles(ops: list[str], num_warps: int, chip: Chip, dialect: str = "amdgcn") -> float:
    """Issue cycles on one SIMD (SM sub-partition) of a program's ``num_warps`` waves (warps)
    running ``ops``, plus a memory latency if they load from global memory."""
    if dialect == "ptx":
        per_wave = sum(0 if op.startswith(NOT_ALU) else chip.valu_cycles for op in ops)
        loads = any(category(op, dialect) == "global_load" for op in ops)
    else:
        per_wave = sum(0 if op.startswith(NOT_SALU) else chip.salu_cycles if op.startswith("s_")
                       else chip.valu_cycles for op in ops)
        loads = any(category(op, dialect) == "global_load" or op.startswith(("s_load", "s_buffer_load"))
                    for op in ops)
    return per_wave * num_warps / SIMDS_PER_CU + (chip.latency_cycles if loads else 0.0)


def cost(layout: str, report, num_warps: int, surplus: int, chip: Chip) -> Schedule | None:
    """The schedule of a grouped launch laid out as ``layout`` ("v2": every program scans;
    "v4": once per persistent program; "v1": none), ``surplus`` programs past the last tile."""
    if layout == "v1":
        return None
    scan = cycles(instructions(report, SCAN), num_warps, chip, report.dialect)
    locate = cycles(instructions(report, LOCATE), num_warps, chip, report.dialect)
    if layout == "v2":
        return Schedule(per_tile=scan + locate, once=0.0, surplus=surplus)
    return Schedule(per_tile=locate, once=scan, surplus=surplus)
