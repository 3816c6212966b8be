"""What one wave issues in one iteration of a kernel's hot loop, read from the AMDGCN text.

The loop is the one :func:`workbench.isa.parse.hot_loop` finds (the innermost loop
with matrix instructions), compiled as the JIT compiles the rung. Each instruction is
charged to the unit that executes it: MFMAs to the SIMD's matrix core (cycles from
``machine.yaml``), other ``v_`` instructions to the VALU, ``s_`` arithmetic to the scalar
unit (transcendentals, ``v_exp``/``v_log``/``v_rcp``/``v_rsq``/``v_sqrt``/``v_sin``/``v_cos``,
at their own, slower rate: the softmax's exp against the MFMAs), ``ds_`` reads and writes to the CU's LDS (bytes per lane from the mnemonic's
width, with an access narrower than a bank charged a whole bank slot), global loads and
stores to the memory system (bytes per lane from the mnemonic; a gfx950 load straight
into LDS also to the LDS). Every lane is taken
as active: the loop of a tile kernel runs unmasked lanes except at ragged edges.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from ..isa import parse as isa_parse
from . import machine

_LDS = re.compile(r"ds_(?:read|write|load|store)(2st64|2)?_[bui](\d+)")
_GLOBAL_WIDTH = {"ubyte": 1, "sbyte": 1, "byte": 1, "ushort": 2, "sshort": 2, "short": 2, "dword": 4}
_GLOBAL = re.compile(r"(?:buffer|global|flat)_(?:load|store)(?:_lds)?_(dwordx(\d)|[a-z]+?)(?:_d16.*)?$")
# Scalar instructions that wait or steer rather than compute: they take no ALU time.
_TRANSCENDENTAL = re.compile(r"v_(?:exp|log|rcp|rsq|sqrt|sin|cos)_(?:f32|f16|legacy_f32)")
NOT_SALU = ("s_waitcnt", "s_barrier", "s_cbranch", "s_branch", "s_nop", "s_setprio", "s_sleep")


@dataclass(frozen=True)
class LoopMix:
    """Per wave and per iteration of the hot loop."""

    mfma: dict[str, int]     # mnemonic -> count
    mfma_cycles: int         # matrix-core cycles on the wave's SIMD
    mfma_flops: int
    valu: int                # VALU instructions (MFMAs excluded)
    transcendental: int      # of them, transcendentals (quarter rate)
    salu: int                # scalar ALU instructions
    lds_bytes: int           # bytes the LDS instructions move (lanes x width)
    lds_slot_bytes: int      # bytes the LDS is busy for: narrow accesses charged a whole bank
    lds_ops: dict[str, int]  # mnemonic -> count
    global_bytes: int        # bytes loaded from and stored to global memory
    lines: int               # instructions in the loop
    matrix_in_flight: int = 0  # sm90: wgmma groups the loop leaves running at its wait (0 on AMD)


def lds_access(op: str) -> tuple[int, int]:
    """(accesses per lane, bytes per access) of an LDS read or write mnemonic."""
    m = _LDS.match(op)
    if m is None:
        raise ValueError(f"{op!r} is not an LDS read or write this model knows")
    return (2 if m.group(1) else 1), int(m.group(2)) // 8


def global_width(op: str) -> int:
    """Bytes per lane of a global (buffer/global/flat) load or store mnemonic."""
    m = _GLOBAL.match(op)
    if m is None:
        raise ValueError(f"{op!r} is not a global load or store this model knows")
    if m.group(2):
        return 4 * int(m.group(2))
    if m.group(1) not in _GLOBAL_WIDTH:
        raise ValueError(f"{op!r}: unknown access width {m.group(1)!r}")
    return _GLOBAL_WIDTH[m.group(1)]


def mix(loop_text: str, arch: str, lanes: int = 64) -> LoopMix:
    """Count and weigh the hot loop of an AMDGCN kernel for target ``arch``."""
    lines = [(op, line) for line in loop_text.splitlines() if (op := isa_parse.mnemonic(line))]
    if not lines:
        raise ValueError("the kernel has no hot loop to model")
    mfma, lds_ops = Counter(), Counter()
    valu = transcendental = salu = lds_bytes = slot_bytes = global_bytes = 0
    bank = machine.constant("lds_bank_bytes").value
    for op, line in lines:
        kind = isa_parse.category(op, "amdgcn")
        if kind == "matrix":
            mfma[op] += 1
        elif kind in ("lds_read", "lds_write"):
            count, width = lds_access(op)
            lds_ops[op] += 1
            lds_bytes += lanes * count * width
            slot_bytes += lanes * count * max(width, bank)
        elif kind in ("global_load", "global_store"):
            global_bytes += lanes * global_width(op)
            if isa_parse.loads_into_lds(line):  # gfx950: the load writes LDS, not registers
                lds_bytes += lanes * global_width(op)
                slot_bytes += lanes * max(global_width(op), bank)
        elif op.startswith("v_"):
            valu += 1
            transcendental += bool(_TRANSCENDENTAL.match(op))
        elif op.startswith("s_") and not op.startswith(NOT_SALU):
            salu += 1
    return LoopMix(
        mfma=dict(mfma),
        mfma_cycles=sum(n * machine.mfma_cycles(op, arch) for op, n in mfma.items()),
        mfma_flops=sum(n * machine.mfma_flops(op) for op, n in mfma.items()),
        valu=valu, transcendental=transcendental, salu=salu, lds_bytes=lds_bytes, lds_slot_bytes=int(slot_bytes),
        lds_ops=dict(lds_ops), global_bytes=global_bytes, lines=len(lines))
