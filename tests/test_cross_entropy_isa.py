"""The fused cross-entropy's kernels (:mod:`kernels.loss.cross_entropy_kernels`) as gfx942 and gfx950
compile them, bf16 logits at V = 32000 (ahead of time, in a fresh subprocess, as
tests/test_moe_swiglu_isa.py does: they are not rungs). Backs what the module and its
``settings`` say of the loops over V, spills and occupancy; that these launches are the ones a
call runs: tests/test_aot_matches_calls.py."""
from __future__ import annotations

import pytest
import torch

from fresh_compiles import results
from kernels.loss.cross_entropy_kernels import AOT_SHAPE, LANES, settings

ARCHS = ("gfx942", "gfx950")
COMPILE = """
import torch
from kernels.loss import cross_entropy_kernels
from workbench.isa import compile as isa_compile, parse as isa_parse


def result(arch):
    compiled = []
    for aot in cross_entropy_kernels.aot(torch.bfloat16):
        kernel = isa_compile.compile_aot(aot, ("hip", arch, 64))
        lines = isa_parse.code_lines(kernel["asm"], "amdgcn")
        loop = isa_parse.hot_loop(lines, "amdgcn")
        compiled.append(summary(kernel, name=aot.jit_fn.__name__,
                                atomics=sorted({op for op in map(isa_parse.mnemonic, lines) if op and "atomic" in op}),
                                loop={c: dict(v) for c, v in isa_parse.histograms(loop, "amdgcn").items()}))
    return compiled
"""


def compiled(arch: str) -> dict[str, dict]:
    """Per kernel name, its resources, op histograms, its loop's and its atomic instructions; both
    archs in one child."""
    return {kernel["name"]: kernel for kernel in results(COMPILE, ARCHS)[arch]}


def _pieces_per_thread() -> int:
    """16-byte pieces of a row a thread moves per iteration, from the launch's own settings."""
    chosen = settings(AOT_SHAPE[1], torch.bfloat16)
    return chosen["BLOCK_V"] * torch.bfloat16.itemsize // (16 * LANES * chosen["num_warps"])


def _no_spills_and_8_waves(kernel: dict) -> None:
    res = kernel["resources"]
    assert (res["vgpr_spills"], res["sgpr_spills"], res["scratch_bytes"]) == (0, 0, 0), res
    assert res["occupancy"] == 8, res


@pytest.mark.slow   # three AOT compiles per arch in a fresh process
@pytest.mark.parametrize("arch", ARCHS)
def test_the_row_pass_reads_logits_16_bytes_per_thread_and_nothing_spills(arch):
    """Per iteration over V a thread reads its two 16-byte pieces of the row (dwordx4) and nothing
    narrower, stores nothing; the row's max and sum cross the waves through LDS. 8 waves per SIMD."""
    kernel = compiled(arch)["_rows_kernel"]
    _no_spills_and_8_waves(kernel)
    loop = kernel["loop"]
    assert loop["global_load"] and set(loop["global_load"]) <= {"global_load_dwordx4", "buffer_load_dwordx4"}, loop
    assert sum(loop["global_load"].values()) == _pieces_per_thread() == 2
    assert not loop["global_store"], loop
    assert loop["lds_write"] and loop["lds_read"], loop


@pytest.mark.slow   # with the file's others
@pytest.mark.parametrize("arch", ARCHS)
def test_the_gradient_pass_reads_and_writes_16_bytes_per_thread_and_nothing_spills(arch):
    """Per iteration a thread reads two 16-byte pieces of logits and writes two of the gradient,
    nothing narrower, no LDS (nothing is reduced). 8 waves per SIMD."""
    kernel = compiled(arch)["_gradient_kernel"]
    _no_spills_and_8_waves(kernel)
    loop = kernel["loop"]
    assert set(loop["global_load"]) <= {"global_load_dwordx4", "buffer_load_dwordx4"}, loop
    assert set(loop["global_store"]) <= {"global_store_dwordx4", "buffer_store_dwordx4"}, loop
    assert sum(loop["global_load"].values()) == sum(loop["global_store"].values()) == _pieces_per_thread()
    assert not kernel["ops"].get("lds_read") and not kernel["ops"].get("lds_write"), kernel["ops"]
    assert all(op.endswith("dwordx4") for op in kernel["ops"]["global_store"]), kernel["ops"]


@pytest.mark.slow   # with the file's others
@pytest.mark.parametrize("arch", ARCHS)
def test_no_kernel_has_an_atomic(arch):
    """The mean is summed by one program in a fixed order, so a run's bits do not depend on which
    program finishes first: what the interpreter's runs, sequential, cannot show."""
    assert {name: kernel["atomics"] for name, kernel in compiled(arch).items()} == \
        {"_rows_kernel": [], "_mean_kernel": [], "_gradient_kernel": []}


@pytest.mark.slow   # with the file's others
@pytest.mark.parametrize("arch", ARCHS)
def test_the_mean_does_not_spill(arch):
    """One program; its registers matter only in that they do not spill."""
    res = compiled(arch)["_mean_kernel"]["resources"]
    assert (res["vgpr_spills"], res["sgpr_spills"], res["scratch_bytes"]) == (0, 0, 0), res
