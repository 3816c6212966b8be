"""The MoE routing's kernels (:mod:`kernels.moe.routing_fused_kernels`) as gfx942 and gfx950 compile
them at its ``AOT_SHAPE`` (16K tokens, 128 experts, top 8; ahead of time, in a fresh subprocess,
as tests/test_cross_entropy_isa.py does). Backs what the module and its ``settings`` say of
spills, scratch, atomics, occupancy and the logits' 16-byte pieces; that these launches are the
ones a call runs: tests/test_aot_matches_calls.py."""
from __future__ import annotations

import pytest

from fresh_compiles import results
from kernels.moe.routing_fused_kernels import WAVES_PER_SIMD

ARCHS = ("gfx942", "gfx950")
COMPILE = """
from kernels.moe import routing_fused_kernels
from workbench.isa import compile as isa_compile, parse as isa_parse


def result(arch):
    compiled = []
    for aot in routing_fused_kernels.aot():
        kernel = isa_compile.compile_aot(aot, ("hip", arch, 64))
        lines = isa_parse.code_lines(kernel["asm"], "amdgcn")
        compiled.append(summary(kernel, name=aot.jit_fn.__name__,
                                atomics=sorted({op for op in map(isa_parse.mnemonic, lines) if op and "atomic" in op})))
    return compiled
"""


def compiled(arch: str) -> dict[str, dict]:
    """Per kernel name, its resources, op histograms and atomic instructions; both archs in one child."""
    return {kernel["name"]: kernel for kernel in results(COMPILE, ARCHS)[arch]}


def _nothing_spills(kernel: dict) -> None:
    res = kernel["resources"]
    assert (res["vgpr_spills"], res["sgpr_spills"], res["scratch_bytes"]) == (0, 0, 0), res


@pytest.mark.slow   # three AOT compiles per arch in a fresh process
@pytest.mark.parametrize("arch", ARCHS)
def test_no_kernel_spills_or_has_an_atomic(arch):
    """The sums over tokens are partials added in a fixed order, so a run's bits do not depend on
    which program finishes first: what the interpreter's runs, sequential, cannot show."""
    kernels = compiled(arch)
    assert {name: kernel["atomics"] for name, kernel in kernels.items()} == \
        {"_route_kernel": [], "_totals_kernel": [], "_backward_kernel": []}
    for kernel in kernels.values():
        _nothing_spills(kernel)


@pytest.mark.slow   # with the file's others
@pytest.mark.parametrize("arch", ARCHS)
def test_the_per_token_passes_read_the_logits_16_bytes_a_thread_at_8_waves(arch):
    """Each thread holds 4 fp32 logits of its tile, one 16-byte load (the only load of the
    forward without a bias); the backward writes dlogits the same way."""
    kernels = compiled(arch)
    route, backward = kernels["_route_kernel"], kernels["_backward_kernel"]
    for kernel in (route, backward):
        assert kernel["resources"]["occupancy"] == WAVES_PER_SIMD == 8, kernel["resources"]
    assert route["ops"]["global_load"] == {"buffer_load_dwordx4": 1}, route["ops"]
    assert backward["ops"]["global_store"] == {"buffer_store_dwordx4": 1}, backward["ops"]
