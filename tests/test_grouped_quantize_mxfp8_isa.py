"""The grouped cast in its MX mode (MXFP8's transposed operands) as gfx942 and gfx950 compile
it (ahead of time; not a rung, so a fresh subprocess compiles it, as
tests/test_grouped_quantize_isa.py does for the other modes): the wgrad operand's launch and
the forward weight's. Backs what kernels/moe/grouped_gemm_fp8/quantize_kernel.py says of the
MX launch's loads, stores and registers."""
from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
COMPILE = """
import json, torch
from kernels.moe.grouped_gemm_fp8 import quantize_kernel
from workbench.isa import compile as isa_compile, parse as isa_parse
kernel = isa_compile.compile_aot(quantize_kernel.mx_aot(torch.float8_e4m3fn, weight={weight}), ("hip", {arch!r}, 64))
lines = isa_parse.code_lines(kernel["asm"], "amdgcn")
print(json.dumps(dict(resources=isa_parse.amdgpu_resources(kernel["asm"]), lds=kernel["shared"],
                      ops={{c: dict(v) for c, v in isa_parse.histograms(lines, "amdgcn").items()}})))
"""


@functools.cache
def compiled(arch: str, weight: bool) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    done = subprocess.run([sys.executable, "-c", COMPILE.format(arch=arch, weight=weight)],
                          capture_output=True, text=True, env=env, timeout=600, check=True)
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.slow   # one AOT compile per case in a fresh process: a few seconds each
@pytest.mark.parametrize("weight", [False, True], ids=["wgrad", "forward-weight"])
@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_wide_reads_of_t_one_wide_fp8_store_and_no_spills(arch, weight):
    """Per thread and 64 x 64 bf16 tile (256 threads), t read as exactly two 16-byte buffer
    loads (buffer_load_dwordx4; the group offsets and ends are the only other loads), the
    token-contiguous FP8 copy written as one 16-byte store (buffer_store_dwordx4) and the
    scale as one byte store, nothing else stored; no VGPR or SGPR spills, no scratch; 8 waves
    per SIMD; 4 KiB of LDS (the layout conversions of the transpose)."""
    kernel = compiled(arch, weight)
    res = kernel["resources"]
    assert (res["vgpr_spills"], res["sgpr_spills"], res["scratch_bytes"]) == (0, 0, 0), res
    assert res["occupancy"] >= 8, res
    assert kernel["ops"]["global_load"]["buffer_load_dwordx4"] == 2, kernel["ops"]
    assert kernel["ops"]["global_store"] == {"buffer_store_dwordx4": 1, "buffer_store_byte": 1}
    assert kernel["lds"] == 4096 and not kernel["ops"].get("matrix")
