"""The fused MoE rung's elementwise backward kernel as gfx942 and gfx950 compile it (ahead of
time; not a rung, so a fresh subprocess compiles it, as tests/test_fp8_quantize_isa.py does).
Backs what kernels/moe/layer_ladder/swiglu_backward.py says of its loads, stores and spills;
that these launches are the ones a call runs: tests/test_aot_matches_calls.py."""
from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAUNCHES = (dict(weighted=True), dict(weighted=False), dict(fp8_owner=True))
"""v3's launch, the expert-parallel owner's (weight 1) and the FP8 expert-parallel owner's
(dg and du only, rows bounded by the capacity padding's start)."""
COMPILE = """
import json, torch
from kernels.moe.layer_ladder import swiglu_backward
from workbench.isa import compile as isa_compile, parse as isa_parse
LAUNCHES = {launches!r}
out = []
for launch in LAUNCHES:
    kernel = isa_compile.compile_aot(swiglu_backward.aot(torch.bfloat16, **launch), ("hip", {arch!r}, 64))
    lines = isa_parse.code_lines(kernel["asm"], "amdgcn")
    out.append(dict(resources=isa_parse.amdgpu_resources(kernel["asm"]),
                    ops={{c: dict(v) for c, v in isa_parse.histograms(lines, "amdgcn").items()}}))
print(json.dumps(out))
"""


@functools.cache
def compiled(arch: str) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    done = subprocess.run([sys.executable, "-c", COMPILE.format(arch=arch, launches=LAUNCHES)],
                          capture_output=True, text=True, env=env, timeout=600, check=True)
    return json.loads(done.stdout.splitlines()[-1])


WIDE = ("dwordx2", "dwordx3", "dwordx4", "b64", "b96", "b128")


@pytest.mark.slow   # three AOT compiles in a fresh process
@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_bf16_rows_move_16_bytes_per_thread_and_nothing_spills(arch):
    """bf16, every output asked, with a routing weight and at weight 1 (the expert-parallel
    owner's launch): per column block a thread reads dh, g, u and h as one 16-byte load each
    and writes dg, du (and h·w) as one 16-byte store each; the only narrower accesses are
    the per-row routing weight's load and dw_rows' store (4 bytes, once per program). LDS
    only for the row sums' change of layout before that store (one 4-byte write and read).
    The FP8 owner's launch (dg and du, rows bounded): dh, g, u in and dg, du out 16 bytes
    each, nothing narrower (the bound is one scalar load), no LDS. No VGPR or SGPR spills,
    no scratch, 8 waves per SIMD."""
    for kernel, launch in zip(compiled(arch), LAUNCHES):
        weighted, fp8_owner = launch.get("weighted", False), launch.get("fp8_owner", False)
        res, ops = kernel["resources"], kernel["ops"]
        assert (res["vgpr_spills"], res["sgpr_spills"], res["scratch_bytes"]) == (0, 0, 0), res
        assert res["occupancy"] == 8, res
        loads, stores = ops["global_load"], ops["global_store"]
        wide_loads = sum(n for op, n in loads.items() if op.endswith("dwordx4") or op.endswith("b128"))
        wide_stores = sum(n for op, n in stores.items() if op.endswith("dwordx4") or op.endswith("b128"))
        assert wide_loads == (3 if fp8_owner else 4) and wide_stores == (3 if weighted else 2), ops
        narrow_loads = {op: n for op, n in loads.items() if not op.endswith(WIDE)}
        narrow_stores = {op: n for op, n in stores.items() if not op.endswith(WIDE)}
        assert sum(narrow_loads.values()) == (1 if weighted else 0), ops     # w, one row per thread
        assert sum(narrow_stores.values()) == (0 if fp8_owner else 1), ops  # dw_rows
        lds = (sum(ops.get("lds_write", {}).values()), sum(ops.get("lds_read", {}).values()))
        assert lds == ((0, 0) if fp8_owner else (1, 1)), ops
        assert not ops.get("matrix")
