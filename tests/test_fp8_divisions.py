"""The FP8 scaling kernels divide with IEEE round-to-nearest on every GPU they target.

Their results are bit-identical to the PyTorch references on the CPU (the interpreter divides
with NumPy), and the docstrings promise the same on a GPU. That holds only if each division of
the scale (amax / fp8_max) and of the values (x / scale) is correctly rounded. Triton 3.9's
``/`` is on AMD (the v_div_scale/v_div_fmas/v_div_fixup sequence), but not on NVIDIA: there
it lowers to ``div.full.f32`` (up to 2 ulp off), and a division by a constexpr to
``div.approx.f32`` (Triton issue #10661). A quotient one ulp off moves a value across an FP8
rounding boundary, and MXFP8's round-up rule reads the quotient's bits, so an exact power of
two read one ulp high doubles the block's scale. So the kernels divide with ``tl.math.div_rn``,
which is ``div.rn.f32`` on NVIDIA and the same IEEE sequence as ``/`` on AMD. This file
compiles every such kernel for sm_90 (the H100/H200 the workbench runs on) and gfx942, and
checks that no other division is left.
"""
from __future__ import annotations

import pytest

from fresh_compiles import results

COMPILE = r'''
import re

import torch

from kernels.fp8 import history_ops
from kernels.gemm_fp8 import epilogue, quantize_kernel
from kernels.moe.grouped_gemm_fp8 import quantize_kernel as grouped_quantize
from kernels.triton_support import aot_launch, fp8_grid, pointer_type
from workbench.isa import compile as isa_compile

N = 8192


def launches(name, fp8):
    """The AotKernels of one kernel family, as a GPU runs them (8192-sized problems), casting to ``fp8``."""
    fmax = float(torch.finfo(fp8).max)
    if name.startswith("quantize "):
        granularity, *rest = name.split()[1:]
        options = dict(scale_rule="round_up") if "round_up" in rest else dict(given_scale="given" in rest)
        return [quantize_kernel.aot(granularity, fp8, **options)]
    if name == "row scales":
        settings = dict(quantize_kernel.ROW_SCALES_SETTINGS)   # as the launch sets them
        options = dict(num_warps=settings.pop("num_warps"))
        return [aot_launch(quantize_kernel._row_scales_kernel, torch.float32, options,
                           dict(M=N, K=N, TK=N // 128, TM=N // 128),
                           constexprs=dict(FMAX=fmax, COLS=True, **settings))]
    if name == "tensor scale":
        return [aot_launch(quantize_kernel._tensor_amax_kernel, torch.float32,
                           dict(num_warps=quantize_kernel._TENSOR_AMAX_WARPS), dict(count=quantize_kernel.PARTIALS),
                           constexprs=dict(FMAX=fmax, SCALE=True, PARTIALS=quantize_kernel.PARTIALS))]
    if name.startswith("grouped quantize"):   # "rows": with the row-wise quantization beside
        return list(grouped_quantize.aot(fp8, rows=name.endswith("rows")))
    if name == "history scale":
        return [aot_launch(history_ops._scale_kernel, torch.float32, dict(num_warps=1),
                           dict(H=16, count=quantize_kernel.PARTIALS),
                           constexprs=dict(FMAX=fmax, H_BLOCK=16, BLOCK=quantize_kernel.PARTIALS))]
    if name == "gemm to fp8":
        return [aot_launch(epilogue._gemm_amax_kernel, torch.bfloat16, dict(num_warps=8),
                           dict(M=N, N=N, K=N, stride_am=N, stride_ak=1, stride_bk=N, stride_bn=1,
                                stride_cm=N, stride_cn=1),
                           constexprs=dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, EVEN_K=True,
                                           TO_FP8=True, FP8_MAX=fmax, **fp8_grid(fp8), INTERP_BF16=False,
                                           INTERP_FP8=False),
                           pointers=dict(c_ptr=pointer_type(fp8), amax_ptr="*fp32", scale_ptr="*fp32"))]
    raise KeyError(name)


def result(job):
    name, target = job
    nvidia = target == "sm_90"
    gpu = ("cuda", 90, 32) if nvidia else ("hip", target, 64)
    out = []
    for aot in launches(name, torch.float8_e4m3fn if nvidia else torch.float8_e4m3fnuz):
        asm = isa_compile.compile_aot(aot, gpu)["asm"]
        pattern = r"\bdiv(?:\.\w+)*\.f32\b" if nvidia else r"\bv_div_\w+_f32\b"   # float divisions only
        found = {}
        for op in re.findall(pattern, asm):
            found[op] = found.get(op, 0) + 1
        out.append(dict(kernel=aot.jit_fn.__name__, divisions=found))
    return out
'''

FAMILIES = ("quantize tensor", "quantize tensor given", "quantize row", "quantize block1x128",
            "quantize block128x128", "quantize mx32 round_up", "row scales", "tensor scale", "grouped quantize",
            "grouped quantize rows",
            "history scale", "gemm to fp8")
TARGETS = ("sm_90", "gfx942")


def _compiled() -> dict:
    return results(COMPILE, tuple((family, target) for family in FAMILIES for target in TARGETS))


@pytest.mark.slow   # about thirty AOT compiles in one fresh process
@pytest.mark.parametrize("family", FAMILIES)
def test_every_division_is_ieee_round_to_nearest_on_nvidia(family):
    for kernel in _compiled()[family, "sm_90"]:
        divisions = kernel["divisions"]
        assert divisions, f"{kernel['kernel']}: no division found; the pattern or the kernel changed"
        assert set(divisions) == {"div.rn.f32"}, (kernel["kernel"], divisions)


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_every_division_is_the_ieee_sequence_on_amd(family):
    """Per division, two v_div_scale_f32, one v_div_fmas_f32 and one v_div_fixup_f32: the
    correctly rounded sequence, which ``tl.math.div_rn`` keeps (as ``/`` did here)."""
    for kernel in _compiled()[family, "gfx942"]:
        divisions = kernel["divisions"]
        fixups = divisions.get("v_div_fixup_f32", 0)
        assert fixups and divisions == {"v_div_scale_f32": 2 * fixups, "v_div_fmas_f32": fixups,
                                        "v_div_fixup_f32": fixups}, (kernel["kernel"], divisions)
