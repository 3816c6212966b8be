"""Scaled FP8 GEMM: formats, quantization, scaling semantics, every rung, the public op.

Rungs are judged by the harness rule in the *output* dtype (bf16 by default): the
reference is the float64 product of the dequantized operands, the baseline is
torch._scaled_mm (it has a CPU kernel in torch >= 2.13).
"""
from __future__ import annotations

import random

import pytest
import torch

import kernels
from kernels.gemm_fp8 import FP8_DTYPES, fp8_dtype, quantize_fp8
from kernels.outputs import poisoned_outputs
from workbench.check import compare

E4M3FN, E4M3FNUZ = torch.float8_e4m3fn, torch.float8_e4m3fnuz
SPEC = kernels.spec("gemm_fp8")
RUNGS = [r for r in kernels.variants("gemm_fp8") if r.runs_here()]
OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
matmul_fp8 = kernels.matmul_fp8   # also registers torch.ops.kernels.matmul_fp8


def judge(rung, inputs, out_dtype=torch.bfloat16):
    reference = SPEC.reference(*inputs)
    baseline = kernels.registry.reference_rung("gemm_fp8")(*inputs, out_dtype=out_dtype)
    with poisoned_outputs():
        out = rung(*inputs, out_dtype=out_dtype)
    assert out.dtype == out_dtype and out.shape == reference.shape
    fields = compare(out, reference, baseline, out_dtype)
    assert fields["passed"], (f"{rung.title}: error {fields['error']:.2e} > allowed "
                              f"{fields['allowed']:.2e}, {fields['mismatches']} elements off")


@pytest.mark.parametrize("arch,expected", [("gfx942", E4M3FNUZ), ("gfx942:sramecc+:xnack-", E4M3FNUZ),
                                           ("gfx950", E4M3FN), ("sm_90", E4M3FN), ("cpu", E4M3FN)])
def test_fp8_dtype_per_arch(arch, expected):
    assert fp8_dtype(arch) == expected


def test_fp8_dtype_defaults_to_this_machine():
    assert fp8_dtype() == fp8_dtype(kernels.backend.current().arch)


@pytest.mark.parametrize("dtype", FP8_DTYPES, ids=str)
def test_quantize_saturates_instead_of_nan(dtype):
    fmax = torch.finfo(dtype).max
    x = torch.tensor([[-1e6, -3.0, 0.5, 2.0 * fmax, float("inf")]])
    q, scale = quantize_fp8(x, dtype, scale=torch.tensor(1.0))      # delayed scale: x overflows
    assert q.float().tolist() == [[-fmax, -3.0, 0.5, fmax, fmax]]
    assert scale.dtype == torch.float32


@pytest.mark.parametrize("dtype", FP8_DTYPES, ids=str)
@pytest.mark.parametrize("granularity,scale_shape", [("tensor", ()), ("row", (6, 1)), ("col", (1, 9))])
def test_quantize_amax_maps_each_slice_onto_the_format_range(dtype, granularity, scale_shape):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(6, 9, generator=gen) * torch.logspace(-3, 3, 9)
    x[2, :] = 0.0
    q, scale = quantize_fp8(x, dtype, granularity)
    assert q.dtype == dtype and scale.shape == scale_shape and scale.dtype == torch.float32
    assert not torch.isnan(q.float()).any()
    dims = {"tensor": None, "row": 1, "col": 0}[granularity]
    amax = q.float().abs().amax() if dims is None else q.float().abs().amax(dim=dims)
    nonzero = amax[amax > 0] if amax.dim() else amax
    assert torch.all(nonzero == torch.finfo(dtype).max)
    # round to nearest: half an ulp of 3 mantissa bits, or of the subnormal spacing (<= 2**-9)
    assert torch.all((q.float() * scale - x).abs() <= 2**-4 * x.abs() + 2**-10 * scale)


@pytest.mark.parametrize("granularity,shape,scale_shape", [
    ("tensor", (0,), ()), ("tensor", (0, 3), ()), ("row", (0, 3), (0, 1)), ("row", (4, 0), (4, 1)),
    ("col", (0, 3), (1, 3)), ("col", (4, 0), (1, 0))])
def test_quantize_takes_empty_tensors_and_slices(granularity, shape, scale_shape):
    """An empty slice gets scale 1, as an all-zero one does: amax of nothing is taken as 0."""
    q, scale = quantize_fp8(torch.empty(shape), torch.float8_e4m3fn, granularity)
    assert q.shape == shape and q.dtype == torch.float8_e4m3fn
    assert scale.shape == scale_shape and torch.equal(scale, torch.ones(scale_shape))


def test_fnuz_quantization_has_no_negative_zero_or_nan_bit_pattern():
    x = torch.tensor([-0.0, -1e-30, 1e-30, -5.0, 7.0, -1e9])
    q, _ = quantize_fp8(x, E4M3FNUZ, scale=torch.tensor(0.1))
    assert not (q.view(torch.uint8) == 0x80).any()     # 0x80 is fnuz's only NaN (the "-0" slot)
    assert torch.isfinite(q.float()).all()


def test_quantize_refuses_bad_arguments():
    with pytest.raises(TypeError, match="dtype"):
        quantize_fp8(torch.ones(2, 2), torch.float16)
    with pytest.raises(ValueError, match="granularity"):
        quantize_fp8(torch.ones(2, 2), E4M3FN, "block")
    with pytest.raises(ValueError, match="2-D"):
        quantize_fp8(torch.ones(2, 2, 2), E4M3FN, "row")


@pytest.mark.parametrize("dtype", FP8_DTYPES, ids=str)
@pytest.mark.parametrize("gran_a,gran_b", [("tensor", "tensor"), ("row", "col"), ("row", "tensor"),
                                           ("tensor", "col")])
def test_scaling_semantics_match_dequantized_product(dtype, gran_a, gran_b):
    gen = torch.Generator().manual_seed(1)
    a, scale_a = quantize_fp8(torch.randn(13, 40, generator=gen), dtype, gran_a)
    b, scale_b = quantize_fp8(torch.randn(40, 11, generator=gen), dtype, gran_b)
    expected = (a.float() * scale_a) @ (b.float() * scale_b)
    for rung in RUNGS:
        out = rung(a, b, scale_a, scale_b, out_dtype=torch.float32)
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())
    public = matmul_fp8(a, b, scale_a, scale_b, out_dtype=torch.float32)
    torch.testing.assert_close(public, expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())


@pytest.mark.parametrize("rung", RUNGS, ids=lambda r: r.title)
@pytest.mark.parametrize("dtype", FP8_DTYPES, ids=str)
def test_every_rung_passes_the_harness_at_smoke_shapes(rung, dtype):
    assert rung.supports(dtype)
    for shape in SPEC.smoke_shapes:
        for seed, layout in ((0, "row"), (1, "row"), (2, "col"), (3, "col")):   # even seed: per tensor
            judge(rung, SPEC.make_inputs(shape, dtype, seed=seed, layout=layout))


@pytest.mark.parametrize("rung", RUNGS, ids=lambda r: r.title)
@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=str)
def test_out_dtype_variants(rung, out_dtype):
    judge(rung, SPEC.make_inputs((37, 29, 53), fp8_dtype(), seed=5), out_dtype)


def test_make_inputs_granularity_follows_the_seed():
    _, _, sa0, sb0 = SPEC.make_inputs((7, 5, 3), E4M3FN, seed=0)
    _, _, sa1, sb1 = SPEC.make_inputs((7, 5, 3), E4M3FN, seed=1)
    assert sa0.numel() == sb0.numel() == 1
    assert sa1.shape == (7, 1) and sb1.shape == (1, 5)
    assert SPEC.bytes_moved((8, 4, 2), E4M3FN) == 8 * 2 + 2 * 4 + 8 * 4 * 2


def _operands(dtype=E4M3FN):
    a, b, sa, sb = SPEC.make_inputs((6, 5, 4), dtype, seed=1)
    return dict(a=a, b=b, scale_a=sa, scale_b=sb)


@pytest.mark.parametrize("change,error,match", [
    (dict(a=torch.randn(6, 4, dtype=torch.bfloat16)), TypeError, "a has dtype bfloat16"),
    (dict(b=torch.randn(4, 5).to(E4M3FNUZ)), TypeError, "different families"),
    (dict(b=torch.randn(4, 5).to(torch.float8_e5m2fnuz)), TypeError, "different families"),
    (dict(b=torch.randn(3, 5).to(E4M3FN)), ValueError, "inner dimensions"),
    (dict(scale_a=torch.ones(6, 1, dtype=torch.float16)), TypeError, "scale_a has dtype float16"),
    (dict(scale_a=torch.ones(1, 6)), ValueError, "scale_a has shape"),
    (dict(scale_a=torch.ones(6)), ValueError, "scale_a has shape"),
    (dict(scale_b=torch.ones(5, 1)), ValueError, "scale_b has shape"),
    (dict(scale_b=torch.ones(1, 5, device="meta")), ValueError, "scale_b is on meta"),
    (dict(scale_b=2.0), TypeError, "scale_b must be a torch.Tensor"),
    (dict(out_dtype=torch.int8), TypeError, "out_dtype"),
], ids=["a-bf16", "mixed-families", "ocp-with-fnuz-e5m2", "inner", "scale-fp16", "scale_a-row-shape", "scale_a-1d",
        "scale_b-col-shape", "device", "python-scale", "out-int8"])
def test_bad_inputs_are_refused_by_name(change, error, match):
    args = {**_operands(), **change}
    for fn in (*RUNGS, matmul_fp8):
        with pytest.raises(error, match=match):
            fn(**args)


@pytest.mark.parametrize("shape", [(0, 5, 4), (6, 0, 4), (6, 5, 0)], ids=str)
@pytest.mark.parametrize("granularity", ["tensor", "channel"])
def test_empty_operands_follow_scaled_mm(shape, granularity):
    (m, n, k), fp8 = shape, torch.float8_e4m3fn
    a, b = torch.zeros(m, k, dtype=fp8), torch.zeros(n, k, dtype=fp8).t()
    per_channel = granularity == "channel"
    sa = torch.ones(m, 1) if per_channel else torch.tensor(1.0)
    sb = torch.ones(1, n) if per_channel else torch.tensor(1.0)
    out = matmul_fp8(a, b, sa, sb)
    # The empty shapes of torch._scaled_mm; its values are not the reference: with K = 0
    # its CPU kernel returns uninitialized memory (torch 2.13) where the product is 0.
    library = torch._scaled_mm(a, b, torch.tensor(1.0), torch.tensor(1.0), out_dtype=torch.bfloat16)
    assert out.shape == library.shape and out.dtype == torch.bfloat16
    assert torch.equal(out, torch.zeros(m, n, dtype=torch.bfloat16))


def test_custom_op_and_compile():
    args = tuple(_operands(fp8_dtype()).values())
    # test_schema is left out: its mutation check calls torch.allclose, which has no
    # float8 CPU kernel in torch 2.13; the op declares mutates_args=() anyway.
    torch.library.opcheck(torch.ops.kernels.matmul_fp8.default, (*args, torch.bfloat16),
                          test_utils=("test_autograd_registration", "test_faketensor",
                                      "test_aot_dispatch_dynamic"))
    compiled = torch.compile(lambda *xs: matmul_fp8(*xs).float().relu(), fullgraph=True,
                             backend="aot_eager")
    expected = matmul_fp8(*args).float().relu()
    assert torch.equal(compiled(*args), expected)


@pytest.mark.parametrize("rung", [r for r in RUNGS if r.aot], ids=lambda r: r.title)
@pytest.mark.parametrize("dtype,backend,arch", [(E4M3FNUZ, "hip", "gfx942"), (E4M3FN, "hip", "gfx950"),
                                                (E4M3FN, "cuda", "sm_90")])
def test_aot_describes_every_kernel_argument(rung, dtype, backend, arch):
    """Every launch of the rung's ISA page (v2: the blockwise recipe's, then the rowwise one's)."""
    launches = rung.aot(dtype, backend, arch)
    assert len(launches) == (2 if rung.label == "v2" else 1), launches
    for launch in launches:
        assert list(launch.signature) == list(launch.jit_fn.arg_names)
        constexprs = {n for n, t in launch.signature.items() if t == "constexpr"}
        assert constexprs == set(launch.constexprs)
        assert launch.options["num_stages"] >= 2 and launch.constexprs["BLOCK_K"] >= 64
        assert all(launch.scalars[k] % 16 == 0 for k in ("M", "N", "K", "stride_am"))   # wide loads
        assert launch.constexprs["stride_ak"] == launch.constexprs["stride_bk"] == 1


FAMILIES = [(E4M3FN, torch.float8_e5m2), (E4M3FNUZ, torch.float8_e5m2fnuz)]


@pytest.mark.parametrize("e4m3,e5m2", FAMILIES, ids=["ocp", "fnuz"])
@pytest.mark.parametrize("e5m2_operand", ["a", "b"])
def test_e4m3_times_e5m2_matches_the_float64_product_of_the_dequantized_operands(e4m3, e5m2, e5m2_operand):
    """FP8 backward GEMMs take the gradient in e5m2 beside an e4m3 operand: every rung, the
    public op and blockwise_matmul (per-row/column and per-128 scales), fresh inputs, odd
    shapes, poisoned outputs, against float64 of the operands as stored (so only fp32
    accumulation separates them)."""
    seed = random.SystemRandom().randrange(2 ** 31)
    gen = torch.Generator().manual_seed(seed)
    for m, n, k in ((37, 29, 53), (1, 33, 131)):
        fmt_a, fmt_b = (e5m2, e4m3) if e5m2_operand == "a" else (e4m3, e5m2)
        a, sa = quantize_fp8(torch.randn(m, k, generator=gen) * 1e-3, fmt_a, "row")
        b, sb = quantize_fp8(torch.randn(k, n, generator=gen) * 30, fmt_b, "col")
        sa_k = torch.rand(m, -(-k // 128), generator=gen) * 1e-4      # per row and 128 of K
        sb_k = torch.rand(-(-k // 128), -(-n // 128), generator=gen) * 1e-2
        a_k = a.double() * sa_k.double().repeat_interleave(128, 1)[:, :k]
        b_k = b.double() * sb_k.double().repeat_interleave(128, 0)[:k].repeat_interleave(128, 1)[:, :n]
        with poisoned_outputs():
            runs = [(r.title, r(a, b, sa, sb, out_dtype=torch.float32), a.double() * sa, b.double() * sb)
                    for r in RUNGS]
            runs.append(("matmul_fp8", matmul_fp8(a, b, sa, sb, out_dtype=torch.float32),
                         a.double() * sa, b.double() * sb))
            runs.append(("blockwise_matmul", kernels.gemm_fp8.blockwise_matmul(a, sa_k, b, sb_k, torch.float32),
                         a_k, b_k))
        for name, got, a64, b64 in runs:
            err = (got.double() - a64 @ b64).abs().max().item()
            bound = 1e-5 * (a64.abs() @ b64.abs()).max().item()   # fp32 accumulation over k terms
            assert err <= bound, (name, (m, n, k), seed, err, bound)
