"""SwiGLU's elementwise kernels over sorted rows, forward and backward, as gfx942 and gfx950
compile them (ahead of time; not rungs, so a fresh subprocess compiles them, as
tests/test_fp8_quantize_isa.py does). Backs what kernels/moe/layer_ladder/swiglu_forward.py
and swiglu_backward.py say of their loads, stores, spills and occupancy; that these
launches are the ones a call runs: tests/test_aot_matches_calls.py."""
from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BACKWARD = (dict(weighted=True), dict(weighted=False), dict(fp8_owner=True))
"""v3's launch, the expert-parallel owner's (weight 1) and the FP8 expert-parallel owner's
(dg and du only, rows bounded by the capacity padding's start)."""
FORWARD = (dict(bounded=False), dict(bounded=True))
"""Float8MoE's launch and the FP8 expert-parallel owner's (rows bounded)."""
ARCHS = ("gfx942", "gfx950")
COMPILE = """
import importlib, json, torch
from workbench.isa import compile as isa_compile, parse as isa_parse
out = []
for module, arch, launches in {jobs!r}:
    aot, kernels = importlib.import_module("kernels.moe.layer_ladder." + module).aot, []
    for launch in launches:
        kernel = isa_compile.compile_aot(aot(torch.bfloat16, **launch), ("hip", arch, 64))
        lines = isa_parse.code_lines(kernel["asm"], "amdgcn")
        kernels.append(dict(resources=isa_parse.amdgpu_resources(kernel["asm"]),
                            ops={{c: dict(v) for c, v in isa_parse.histograms(lines, "amdgcn").items()}}))
    out.append(kernels)
print(json.dumps(out))
"""


def compile_all(launches: dict[str, tuple]) -> dict[tuple[str, str], list[dict]]:
    """Per (module, arch), for each module of :mod:`kernels.moe.layer_ladder` in ``launches``
    and each of :data:`ARCHS`: the resources and op histograms of the module's AOT launches
    (bf16, one per dict of ``launches[module]``). All in one fresh subprocess: importing torch
    and the kernels there costs seconds, each compile a fraction of one."""
    jobs = [(module, arch, list(kwargs)) for module, kwargs in launches.items() for arch in ARCHS]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    done = subprocess.run([sys.executable, "-c", COMPILE.format(jobs=jobs)],
                          capture_output=True, text=True, env=env, timeout=600, check=True)
    return {(module, arch): kernels for (module, arch, _), kernels in
            zip(jobs, json.loads(done.stdout.splitlines()[-1]), strict=True)}


@functools.cache
def _compiled_here() -> dict[tuple[str, str], list[dict]]:
    return compile_all({"swiglu_backward": BACKWARD, "swiglu_forward": FORWARD})


def compiled(module: str, arch: str) -> list[dict]:
    """The resources and op histograms of ``module``'s AOT launches (:data:`BACKWARD` or
    :data:`FORWARD`) for ``arch``, bf16; this file's four (module, arch) pairs compile together."""
    return _compiled_here()[module, arch]


WIDE = ("dwordx2", "dwordx3", "dwordx4", "b64", "b96", "b128")


def _accesses(kernel: dict) -> dict[str, int]:
    """16-byte and narrower global loads and stores, LDS writes and reads; asserts no spills,
    no scratch, 8 waves per SIMD and no matrix op."""
    res, ops = kernel["resources"], kernel["ops"]
    assert (res["vgpr_spills"], res["sgpr_spills"], res["scratch_bytes"]) == (0, 0, 0), res
    assert res["occupancy"] == 8, res
    assert not ops.get("matrix")
    loads, stores = ops["global_load"], ops["global_store"]
    return dict(wide_loads=sum(n for op, n in loads.items() if op.endswith(("dwordx4", "b128"))),
                wide_stores=sum(n for op, n in stores.items() if op.endswith(("dwordx4", "b128"))),
                narrow_loads=sum(n for op, n in loads.items() if not op.endswith(WIDE)),
                narrow_stores=sum(n for op, n in stores.items() if not op.endswith(WIDE)),
                lds_writes=sum(ops.get("lds_write", {}).values()), lds_reads=sum(ops.get("lds_read", {}).values()))


@pytest.mark.slow   # three AOT compiles in a fresh process (with the file's others)
@pytest.mark.parametrize("arch", ARCHS)
def test_backward_moves_bf16_rows_16_bytes_per_thread_and_nothing_spills(arch):
    """bf16, every output asked, with a routing weight and at weight 1 (the expert-parallel
    owner's launch): per column block a thread reads dh, g, u and h as one 16-byte load each
    and writes dg, du (and h·w) as one 16-byte store each; the only narrower accesses are
    the per-row routing weight's load and dw_rows' store (4 bytes, once per program). LDS
    only for the row sums' change of layout before that store (one 4-byte write and read).
    The FP8 owner's launch (dg and du, rows bounded): dh, g, u in and dg, du out 16 bytes
    each, nothing narrower (the bound is one scalar load), no LDS. No VGPR or SGPR spills,
    no scratch, 8 waves per SIMD."""
    for kernel, launch in zip(compiled("swiglu_backward", arch), BACKWARD):
        weighted, fp8_owner = launch.get("weighted", False), launch.get("fp8_owner", False)
        assert _accesses(kernel) == dict(
            wide_loads=3 if fp8_owner else 4, wide_stores=3 if weighted else 2,
            narrow_loads=1 if weighted else 0,                                   # w, one row per thread
            narrow_stores=0 if fp8_owner else 1,                                 # dw_rows
            lds_writes=0 if fp8_owner else 1, lds_reads=0 if fp8_owner else 1), kernel["ops"]


@pytest.mark.slow   # two AOT compiles in a fresh process (with the file's others)
@pytest.mark.parametrize("arch", ARCHS)
def test_forward_moves_bf16_rows_16_bytes_per_thread_and_nothing_spills(arch):
    """bf16, unbounded (Float8MoE's) and bounded (the FP8 expert-parallel owner's): per
    column block a thread reads g and u as one 16-byte load each and writes h as one 16-byte
    store; nothing narrower (the bound is one scalar load), no LDS, no VGPR or SGPR spills,
    no scratch, 8 waves per SIMD."""
    for kernel in compiled("swiglu_forward", arch):
        assert _accesses(kernel) == dict(wide_loads=2, wide_stores=1, narrow_loads=0, narrow_stores=0,
                                         lds_writes=0, lds_reads=0), kernel["ops"]
