"""What each ``s_waitcnt`` in an AMD hot loop waits for, read from the AOT assembly.

A CDNA wave counts its outstanding memory instructions on counters and stalls at
``s_waitcnt`` until a counter is at most the given value: ``vmcnt`` counts vector memory
instructions (buffer/global/flat), ``lgkmcnt`` LDS, GDS, scalar ("constant") memory and
messages (LLVM's AMDGPU operand syntax, ``waitcnt`` for gfx90a/gfx940; AMD's CDNA3 ISA guide,
"Data dependency resolution"). Vector memory and LDS operations complete in order,
so ``lgkmcnt(4)`` means "all but the 4 most recent LDS operations are done". Replaying the loop
body twice against two FIFOs names the instructions each wait retires in the steady state,
including those issued in the previous iteration: the register prefetch a pipeline relies on.
Scalar loads may return out of order; the model assumes none is pending at a non-zero wait.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from .parse import mnemonic

# Which counter an instruction increments (FLAT counts on both).
_COUNTED = {"vmcnt": ("buffer_", "global_", "flat_"),
            "lgkmcnt": ("ds_", "s_load", "s_buffer_load", "s_sendmsg", "flat_")}
_WAIT = re.compile(r"\b(vmcnt|lgkmcnt)\((\d+)\)")


@dataclass(frozen=True)
class Wait:
    """One ``s_waitcnt`` of the loop and the instructions it retires in the steady state."""

    line: str
    retires: tuple[tuple[str, bool], ...]   # (instruction, issued in the previous iteration)

    def summary(self) -> str:
        """The retired instructions by mnemonic, this iteration's and the previous one's."""
        counts = Counter((mnemonic(text), previous) for text, previous in self.retires)
        parts = [f"{n} x {op}" + (" (previous iteration)" if previous else "")
                 for (op, previous), n in counts.items()]
        return ", ".join(parts) or "nothing outstanding"


def waits(loop: str) -> list[Wait]:
    """Every ``s_waitcnt`` of a hot loop, in order, with what it retires (steady state)."""
    body = [line.strip() for line in loop.splitlines() if mnemonic(line)]
    pending = {counter: [] for counter in _COUNTED}
    found = []
    for iteration in (0, 1):
        for queue in pending.values():
            queue[:] = [(text, True) for text, _ in queue]
        for text in body:
            op = mnemonic(text)
            if op == "s_waitcnt":
                retired = []
                for counter, limit in _WAIT.findall(text):
                    queue, keep = pending[counter], int(limit)
                    cut = max(len(queue) - keep, 0)
                    retired += queue[:cut]
                    del queue[:cut]
                if iteration:
                    found.append(Wait(text, tuple(retired)))
                continue
            for counter, prefixes in _COUNTED.items():
                if op.startswith(prefixes):
                    pending[counter].append((text, False))
    return found


def table(loop: str) -> list[dict]:
    """Rows for a notebook: each wait, its position among the loop's instructions, what it retires."""
    body = [line.strip() for line in loop.splitlines() if mnemonic(line)]
    positions = [i for i, text in enumerate(body) if mnemonic(text) == "s_waitcnt"]
    return [{"#": pos, "wait": w.line, "retires": w.summary(), "next": body[pos + 1] if pos + 1 < len(body) else ""}
            for pos, w in zip(positions, waits(loop))]
