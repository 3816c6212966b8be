"""The MoE layer ladder's row kernels (:mod:`kernels.moe.layer_ladder`'s SwiGLU and combine
modules) as gfx942 and gfx950 compile them, ahead of time in one fresh subprocess per test
file (:mod:`fresh_compiles`), and the accesses their ISA tests count
(tests/test_moe_swiglu_isa.py, tests/test_moe_combine_isa.py)."""
from __future__ import annotations

from fresh_compiles import results

ARCHS = ("gfx942", "gfx950")
COMPILE = """
import importlib, torch
from workbench.isa import compile as isa_compile


def result(job):
    module, arch, launches = job
    aot = importlib.import_module("kernels.moe.layer_ladder." + module).aot
    return [summary(isa_compile.compile_aot(aot(torch.bfloat16, **dict(launch)), ("hip", arch, 64)))
            for launch in launches]
"""
WIDE = ("dwordx2", "dwordx3", "dwordx4", "b64", "b96", "b128")


def _items(launches: tuple) -> tuple:
    return tuple(tuple(sorted(kwargs.items())) for kwargs in launches)


def compiled(launches: dict[str, tuple], module: str, arch: str) -> list[dict]:
    """The resources, LDS bytes and op histograms of ``module``'s AOT launches (bf16, one per
    keyword dict of ``launches[module]``, in order) for ``arch``. Every module of ``launches``
    compiles for each of :data:`ARCHS` in the same fresh process, once per process: importing
    torch and the kernels there costs seconds, each compile a fraction of one."""
    jobs = tuple((name, target, _items(kwargs)) for name, kwargs in launches.items() for target in ARCHS)
    return results(COMPILE, jobs)[module, arch, _items(launches[module])]


def accesses(kernel: dict) -> dict[str, int]:
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
