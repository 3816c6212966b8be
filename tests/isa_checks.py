"""Questions about a compiled kernel's machine code (a :func:`workbench.isa.inspect` report) that
more than one test file asks: v6's fp32-C weight gradient (``tests/test_isa_claims.py``) and the
MoE experts' fp32 dW into master weights (``tests/test_moe_master_weights.py``). A module of its
own, not one test file importing another: that import runs the other file's top level wherever
it was not imported already, and couples the two files."""
from __future__ import annotations

from collections import Counter

from workbench.isa import parse as isa_parse
from workbench.model.loop import global_width


def stores(report) -> Counter:
    """Global stores per width in bytes (:func:`workbench.model.loop.global_width`), per thread,
    over the whole kernel."""
    widths = Counter()
    for op, n in isa_parse.histograms(isa_parse.code_lines(report.asm, "amdgcn"), "amdgcn")["global_store"].items():
        widths[global_width(op)] += n
    return widths


def converts_to_bf16(report) -> bool:
    """Whether the kernel converts fp32 to bf16 with an instruction for it: gfx950 has one
    (``v_cvt_pk_bf16_f32``); gfx942 rounds with integer ops, which this does not see."""
    return any(op and "bf16_f32" in op for op in map(isa_parse.mnemonic, report.asm.splitlines()))
