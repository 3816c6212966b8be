"""gemm_fp8 v2 and kernels.gemm_fp8.blockwise_matmul: scales per 128 along K, DeepSeek-V3 style.

Judged by the harness (workbench.check.judge: float64 reference of the dequantized operands,
poisoned output, the baseline's error as the bound) on shapes whose K is not a multiple of
128, with inputs whose K blocks carry magnitudes of their own, so scales taken from the
wrong K block fail. The ISA tests pin what the rung's docstring says of its hot loop.
"""
from __future__ import annotations

import collections
import dataclasses

import pytest
import torch

import kernels
from fresh_compiles import results
from kernels.gemm_fp8 import blockwise_matmul, quantize
from workbench import isa
from workbench.isa import parse as isa_parse
from workbench.check import compare, judge

E4M3FN, E4M3FNUZ = torch.float8_e4m3fn, torch.float8_e4m3fnuz
SPEC = kernels.spec("gemm_fp8")
V2 = kernels.get("gemm_fp8", "v2")
BLOCKS = ("block128x128", "block128x1")
SHAPES = [(37, 29, 259), (5, 131, 130), (1, 1, 129)]   # M, N, K: ragged last K block, N over one block


def judged(inputs, seed, out_dtype=torch.bfloat16):
    rung = V2 if out_dtype == torch.bfloat16 else _with_out_dtype(out_dtype)
    ((_, fields),) = judge(rung, SPEC, inputs, seed)
    return fields


def _with_out_dtype(out_dtype):
    """V2 and the baseline as the harness sees them, with another output dtype."""
    return dataclasses.replace(V2, fn=lambda *xs: V2.fn(*xs, out_dtype=out_dtype))


@pytest.mark.parametrize("fp8", [E4M3FN, E4M3FNUZ], ids=str)
@pytest.mark.parametrize("granularity", BLOCKS)
def test_v2_passes_the_harness_on_block_scales(granularity, fp8):
    for seed, (shape, layout) in enumerate(zip(SHAPES, ("row", "col", "row"))):
        inputs = SPEC.make_inputs(shape, fp8, seed=seed, layout=layout, granularity=granularity)
        m, n, k = shape
        assert inputs[2].shape == (m, -(-k // 128))
        assert inputs[3].shape == ((-(-k // 128), -(-n // 128)) if granularity == "block128x128"
                                   else (-(-k // 128), n))
        fields = judged(inputs, seed)
        assert fields["passed"], (shape, fields["error"], fields["allowed"])


@pytest.mark.parametrize("fp8", [E4M3FN, E4M3FNUZ], ids=str)
def test_v2_passes_the_harness_on_one_k_block_of_128x128_scales(fp8):
    """K <= 128 with B's 128 x 128 blocks: one scale block along K (scale strides 0 along K), run
    by the blockwise binary's loop (``SCALES_ALONG_K``, ``GROUP_N`` 128: the binary compiled with
    that ``GROUP_N``, tests/test_aot_matches_calls.py), B K- and N-contiguous (forward, dgrad)."""
    for seed, (shape, layout) in enumerate(zip([(37, 259, 100), (5, 131, 128), (64, 300, 1)], ("row", "col", "row"))):
        inputs = SPEC.make_inputs(shape, fp8, seed=seed, layout=layout, granularity="block128x128")
        assert inputs[3].shape == (1, -(-shape[1] // 128))
        fields = judged(inputs, seed)
        assert fields["passed"], (shape, fields["error"], fields["allowed"])


def test_v2_in_float32_out_is_judged_against_a_float32_baseline():
    inputs = SPEC.make_inputs((37, 29, 259), E4M3FN, seed=4, granularity="block128x128")
    with torch.no_grad():
        out = V2(*inputs, out_dtype=torch.float32)
    reference = SPEC.reference(*inputs)
    baseline = kernels.registry.reference_rung("gemm_fp8")(*inputs, out_dtype=torch.float32)
    fields = compare(out, reference, baseline, torch.float32)
    assert fields["passed"] and fields["error"] < 1e-5, fields["error"]


def test_block_inputs_catch_scales_from_the_wrong_k_block():
    """The check has teeth: a product with K block 0's scales everywhere (an epilogue
    scaling, v1's idea) is off by far more than the bound."""
    a, b, sa, sb = SPEC.make_inputs((37, 29, 259), E4M3FN, seed=5, granularity="block128x128")
    reference = SPEC.reference(a, b, sa, sb)
    baseline = kernels.registry.reference_rung("gemm_fp8")(a, b, sa, sb)
    epilogue = SPEC.reference(a, b, sa[:, :1].expand_as(sa), sb[:1].expand_as(sb)).to(torch.bfloat16)
    fields = compare(epilogue, reference, baseline, torch.bfloat16)
    assert not fields["passed"] and fields["error"] > 10 * fields["allowed"]


def test_forward_and_wgrad_orientations_from_the_fused_quantize():
    """What a DeepSeek-style Linear runs: y = x @ w.T with x per 1x128 and w per 128x128,
    and dW = dy.T @ x with both quantized along the tokens (the transposed copies)."""
    gen = torch.Generator().manual_seed(6)
    x, w, dy = (torch.randn(s, generator=gen) for s in ((150, 259), (29, 259), (150, 29)))
    xq, xs, xq_t, xs_t = quantize(x, "block1x128", E4M3FN, transpose=True)
    wq, ws = quantize(w, "block128x128", E4M3FN)
    y = blockwise_matmul(xq, xs, wq.t(), ws.t(), out_dtype=torch.float32)
    torch.testing.assert_close(y, SPEC.reference(xq, wq.t(), xs, ws.t()).float(), rtol=1e-5, atol=1e-4)
    _, _, dyq_t, dys_t = quantize(dy, "block1x128", E4M3FN, transpose=True)
    dw = blockwise_matmul(dyq_t, dys_t, xq_t.t(), xs_t.t(), out_dtype=torch.float32)   # (29, 259)
    expected = SPEC.reference(dyq_t, xq_t.t(), dys_t, xs_t.t())
    torch.testing.assert_close(dw, expected.float(), rtol=1e-5, atol=1e-4)
    assert (dw - dy.t() @ x).abs().max() < 0.1 * (dy.t() @ x).abs().max()   # and it is dW, roughly


@pytest.mark.parametrize("change,match", [
    (dict(a_scale=torch.ones(6, 2)), r"scale_a has shape \(6, 2\); expected .* \(6, 3\)"),
    (dict(b_scale=torch.ones(2, 5)), r"scale_b has shape \(2, 5\); expected .* \(3, 5\) .* \(3, 1\)"),
    (dict(b_scale=torch.ones(3, 2)), r"scale_b has shape \(3, 2\)"),
])
def test_bad_block_scales_are_refused_by_name(change, match):
    a, b, sa, sb = SPEC.make_inputs((6, 5, 259), E4M3FN, seed=7, granularity="block128x1")
    args = {**dict(a=a, a_scale=sa, b=b, b_scale=sb), **change}
    with pytest.raises(ValueError, match=match):
        blockwise_matmul(**args)
    with pytest.raises(ValueError, match=match):
        V2(args["a"], args["b"], args["a_scale"], args["b_scale"])


@pytest.mark.parametrize("shape", [(0, 5, 4), (6, 0, 4), (6, 5, 0)], ids=str)
def test_empty_operands_give_zeros(shape):
    m, n, k = shape
    kb = -(-k // 128)
    out = blockwise_matmul(torch.zeros(m, k, dtype=E4M3FN), torch.ones(m, kb),
                           torch.zeros(k, n, dtype=E4M3FN), torch.ones(kb, n))
    assert torch.equal(out, torch.zeros(m, n, dtype=torch.bfloat16))


def test_custom_op_and_compile():
    args = SPEC.make_inputs((9, 7, 150), E4M3FN, seed=8, granularity="block128x128")
    a, b, sa, sb = args
    torch.library.opcheck(torch.ops.kernels.blockwise_matmul_fp8.default, (a, sa, b, sb, torch.bfloat16),
                          test_utils=("test_autograd_registration", "test_faketensor",
                                      "test_aot_dispatch_dynamic"))
    compiled = torch.compile(lambda *xs: blockwise_matmul(*xs).float().relu(), fullgraph=True,
                             backend="aot_eager")
    assert torch.equal(compiled(a, sa, b, sb), blockwise_matmul(a, sa, b, sb).float().relu())


def _loop_ops(report):
    return collections.Counter(op for op in map(isa_parse.mnemonic, report.hot_loop.splitlines()) if op)


@pytest.mark.parametrize("target, mfma, mfmas, scaling", [
    ("gfx942", "v_mfma_f32_16x16x32_fp8_fp8", 64, {"v_mul_f32_e32": 16, "v_fma_f32": 16, "v_pk_fma_f32": 24}),
    ("gfx950", "v_mfma_f32_16x16x128_f8f6f4", 16, {"v_mul_f32_e32": 16, "v_fma_f32": 48, "v_pk_fma_f32": 8}),
])
def test_v2_hot_loop_is_fp8_mfma_plus_the_scaling_its_docstring_counts(target, mfma, mfmas, scaling):
    report = isa.inspect("gemm_fp8", "v2", target)
    assert set(report.matrix_instructions) == {mfma}, report.summary()
    assert (report.spills, report.sgpr_spills, report.scratch_bytes) == (0, 0, 0), report.summary()
    ops = _loop_ops(report)
    assert ops[mfma] == mfmas
    fp32_math = {op: n for op, n in ops.items() if op.startswith(("v_mul_f32", "v_fma_f32", "v_pk_fma_f32",
                                                                   "v_pk_mul_f32", "v_add_f32", "v_pk_add_f32"))}
    assert fp32_math == scaling
    if target == "gfx942":
        assert report.vgprs == 252 and report.occupancy.value == 2


@pytest.mark.parametrize("target, mfma, mfmas", [("gfx942", "v_mfma_f32_16x16x32_fp8_fp8", 64),
                                                  ("gfx950", "v_mfma_f32_16x16x128_f8f6f4", 16)])
def test_v2_with_scales_constant_along_k_runs_v1s_loop(target, mfma, mfmas):
    """v2's second ISA launch, the rowwise recipe's (scales per row and column, constant along K,
    ``SCALES_ALONG_K`` False): the same FP8 MFMAs per K step as the blockwise launch and none of
    its scaling in the loop (the scales go on the accumulator once, in the epilogue), no spills,
    and no more VGPRs than the blockwise launch, which keeps a partial product beside it."""
    blockwise, rowwise = isa.inspect_all("gemm_fp8", "v2", target)
    assert set(rowwise.matrix_instructions) == {mfma}, rowwise.summary()
    assert (rowwise.spills, rowwise.sgpr_spills, rowwise.scratch_bytes) == (0, 0, 0), rowwise.summary()
    ops = _loop_ops(rowwise)
    assert ops[mfma] == mfmas
    assert not [op for op in ops if op.startswith(("v_mul_f32", "v_fma_f32", "v_pk_fma_f32", "v_pk_mul_f32"))], ops
    assert rowwise.vgprs <= blockwise.vgprs and isa.inspect("gemm_fp8", "v2", target) is blockwise


def test_on_sm90_each_v2_launch_compiles_at_its_own_binarys_prior():
    """Hopper: the blockwise launch at its binary's prior, 128x128x128 (4 ``m64n128k32`` wgmmas
    per K step, no stack frame), the rowwise one at its own, 128x256x128 (4 ``m64n256k32``, 194
    registers, no stack frame), a tile whose blockwise compile does need one; the blockwise
    launch stays the main kernel (first of equal wgmma counts)."""
    blockwise, rowwise = isa.inspect_all("gemm_fp8", "v2", "sm90")
    assert blockwise.matrix_instructions == {"wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3": 4}
    assert rowwise.matrix_instructions == {"wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3": 4}
    assert (blockwise.scratch_bytes, rowwise.scratch_bytes, rowwise.vgprs) == (0, 0, 194)
    wide = dict(BLOCK_M=128, BLOCK_N=256, binary="v2_blockwise")
    assert isa.inspect("gemm_fp8", "v2", "sm90", overrides=wide).scratch_bytes > 0
    assert isa.inspect("gemm_fp8", "v2", "sm90") is blockwise


MIXED_COMPILE = """
import dataclasses, torch
from kernels.gemm_fp8 import launch, v2_triton_blockwise
from kernels.triton_support import pointer_type
from workbench.isa import compile as isa_compile, parse as isa_parse


def result(job):
    a, b, arch = job
    aot = launch.aot_blockwise(v2_triton_blockwise._gemm_fp8_blockwise_kernel, getattr(torch, a), "hip", arch)[0]
    aot = dataclasses.replace(aot, signature={**aot.signature, "b_ptr": pointer_type(getattr(torch, b))})
    kernel = isa_compile.compile_aot(aot, ("hip", arch, 64))
    lines = isa_parse.code_lines(kernel["asm"], "amdgcn")
    return summary(kernel, mfma=sorted({line.split(None, 1)[0] + ("/blgp:1" if "blgp:1" in line else "")
                                        for line in lines if "v_mfma" in line}))
"""
MIXED = [
    ("float8_e5m2fnuz", "float8_e4m3fnuz", "gfx942", "v_mfma_f32_16x16x32_fp8_bf8"),
    ("float8_e4m3fnuz", "float8_e5m2fnuz", "gfx942", "v_mfma_f32_16x16x32_bf8_fp8"),
    ("float8_e5m2", "float8_e4m3fn", "gfx950", "v_mfma_f32_16x16x128_f8f6f4/blgp:1"),
]


def _mixed_compiles() -> dict[tuple[str, str, str], dict]:
    """Per (a, b, arch) of :data:`MIXED`, the compile's resources and MFMAs, all three in one
    fresh process (importing torch and the kernels there costs seconds, a compile less)."""
    return results(MIXED_COMPILE, tuple((a, b, arch) for a, b, arch, _ in MIXED))


@pytest.mark.slow
@pytest.mark.parametrize("a, b, arch, mfma", MIXED)
def test_e5m2_times_e4m3_compiles_to_one_mixed_format_mfma(a, b, arch, mfma):
    """Triton 3.9's tl.dot takes e5m2 x e4m3 tiles (the dgrad/wgrad of the hybrid format) and
    emits one mixed-format MFMA, no conversion: on gfx942 the bf8/fp8 variant, whose name
    gives src0's format first (Triton feeds B's tile as src0: A = e5m2 reads ``fp8_bf8``); on
    gfx950 the f8f6f4 MFMA with ``blgp:1`` (its src1, A here, in bf8). v2's config, a fresh
    process (one that ran interpreted kernels cannot compile)."""
    result = _mixed_compiles()[a, b, arch]
    assert result["mfma"] == [mfma]
    res = result["resources"]
    assert (res["vgpr_spills"], res["sgpr_spills"], res["scratch_bytes"]) == (0, 0, 0), res
