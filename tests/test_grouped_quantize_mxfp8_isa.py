"""The grouped cast in its MX mode (MXFP8's transposed operands) as gfx942 and gfx950 compile
it (ahead of time; not a rung, so a fresh subprocess compiles it, as
tests/test_grouped_quantize_isa.py does for the other modes): the wgrad operand's launch and
the forward weight's. Backs what kernels/moe/grouped_gemm_fp8/quantize_kernel.py says of the
MX launch's loads, stores and registers."""
from __future__ import annotations

import pytest

from fresh_compiles import results

COMPILE = """
import re, torch
from kernels.moe.grouped_gemm_fp8 import quantize_kernel
from workbench.isa import compile as isa_compile


def result(job):
    arch, weight, rule = job
    kernel = isa_compile.compile_aot(quantize_kernel.mx_aot(torch.float8_e4m3fn, weight=weight, scale_rule=rule),
                                     ("hip", arch, 64))
    source, memory = None, []   # each global load or store with the source file of its .loc line
    for line in kernel["asm"].splitlines():
        where = re.search(r"\\.loc\\s.*;\\s*([\\w.]+):", line)
        source = where.group(1) if where else source
        if re.match(r"\\s*(global|buffer)_(load|store)", line):
            memory.append((line.split()[0], source))
    return summary(kernel, memory=memory)
"""
WEIGHTS = [False, True]
ARCH_RULES = [("gfx942", "ocp"), ("gfx950", "ocp"), ("gfx950", "round_up")]


def _compiled_here() -> dict[tuple, dict]:
    """Per (arch, weight, rule), every case of this file compiled in one fresh subprocess
    (importing torch and the kernels there costs seconds, each compile a fraction of one)."""
    return results(COMPILE, tuple((arch, weight, rule) for arch, rule in ARCH_RULES for weight in WEIGHTS))


def compiled(arch: str, weight: bool, rule: str) -> dict:
    return _compiled_here()[arch, weight, rule]


@pytest.mark.slow   # one AOT compile per case, all six in one fresh process
@pytest.mark.parametrize("weight", WEIGHTS, ids=["wgrad", "forward-weight"])
@pytest.mark.parametrize("arch, rule", ARCH_RULES)
def test_wide_reads_of_t_one_wide_fp8_store_and_no_spills(arch, weight, rule):
    """Per thread and 64 x 64 bf16 tile (256 threads), t read as exactly two 16-byte buffer
    loads (buffer_load_dwordx4), every other load one of the group offsets and ends (from
    ``clamped`` in schedule.py); the token-contiguous FP8 copy written as one 16-byte store
    (buffer_store_dwordx4) and the scale as one byte store, nothing else stored; no VGPR or
    SGPR spills, no scratch; 8 waves per SIMD; 4 KiB of LDS (the transpose's layout
    conversions). The round-up e8m0 rule (``scale_rule``) compiles to the same."""
    kernel = compiled(arch, weight, rule)
    loads = [(op, where) for op, where in kernel["memory"] if "_load" in op]
    assert [op for op, where in loads if where == "quantize_kernel.py"] == ["buffer_load_dwordx4"] * 2, loads
    assert {where for op, where in loads} == {"quantize_kernel.py", "schedule.py"}, loads
    res = kernel["resources"]
    assert (res["vgpr_spills"], res["sgpr_spills"], res["scratch_bytes"]) == (0, 0, 0), res
    assert res["occupancy"] >= 8, res
    assert kernel["ops"]["global_load"]["buffer_load_dwordx4"] == 2, kernel["ops"]
    assert kernel["ops"]["global_store"] == {"buffer_store_dwordx4": 1, "buffer_store_byte": 1}
    assert kernel["lds"] == 4096 and not kernel["ops"].get("matrix")
