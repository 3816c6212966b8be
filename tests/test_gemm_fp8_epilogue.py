"""The fused amax / FP8-cast GEMM epilogue (kernels.gemm_fp8.epilogue) on the interpreter.

C is judged by the harness (float64 reference, poisoned output, odd shapes, every dtype);
amax must equal torch's amax of what was stored, bit for bit; FP8 C must be within one
FP8 step of the float64 product's own quantization. Shapes stay tiny (32x32 tiles).
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

import kernels
from kernels.gemm_fp8 import epilogue
from kernels.outputs import poisoned_outputs
from workbench.check import check_rung

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
FP8 = [torch.float8_e4m3fn, torch.float8_e4m3fnuz]
SHAPES = [(1, 1, 1), (37, 29, 53), (5, 67, 3), (70, 65, 33), (19, 1, 131)]   # (70, 65): 3x3 tiles


def make(shape, dtype, seed=0, layout="row"):
    return kernels.spec("gemm").make_inputs(shape, dtype, seed=seed, layout=layout)


def fp8_steps(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """How many FP8 values lie between x and y (same format): sign-magnitude codes as a line."""
    def line(t):
        bits = t.view(torch.uint8).to(torch.int32)
        return torch.where(bits >= 128, -(bits - 128), bits)
    return (line(x) - line(y)).abs()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", ["row", "col"])
def test_c_passes_the_harness(dtype, layout):
    rung = dataclasses.replace(kernels.get("gemm", "ref"), name="matmul_amax", rung=None, kind="triton",
                               fn=lambda a, b: epilogue.matmul_amax(a, b)[0])
    for shape in SHAPES:
        report = check_rung(rung, shape, dtype, layout=layout)
        assert report.passed, f"{shape} {dtype} {layout}: {report.message}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_amax_is_torchs_amax_of_c_exactly(dtype):
    for seed, shape in enumerate(SHAPES):
        a, b = make(shape, dtype, seed)
        with poisoned_outputs():
            c, amax = epilogue.matmul_amax(a, b)
        assert amax.dtype == torch.float32 and amax.shape == ()
        assert torch.equal(amax, c.abs().amax().float()), (shape, amax, c.abs().amax())


def test_amax_combines_programs():
    """The largest |C| in the last tile: the atomic max, not the first program, decides."""
    a, b = make((70, 65, 33), torch.float32, seed=4)
    a[69] *= 100
    c, amax = epilogue.matmul_amax(a, b)
    assert amax == c.abs().amax() and c.abs().argmax() // 65 == 69


@pytest.mark.parametrize("fp8", FP8, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fp8_c_is_the_float64_products_quantization_within_one_step(dtype, fp8):
    fmax = torch.finfo(fp8).max
    for seed, shape in enumerate(SHAPES):
        a, b = make(shape, dtype, seed, layout="col" if seed % 2 else "row")
        exact = a.double() @ b.double()
        for headroom in (0.5, 2.0):   # 0.5: |C| / scale reaches 4 x max, so many values saturate
            scale = torch.tensor(max(exact.abs().max().item(), 1e-3) / fmax * headroom / 2)
            with poisoned_outputs():
                c8, amax = epilogue.matmul_to_fp8(a, b, scale, fp8)
            assert c8.dtype == fp8 and not c8.float().isnan().any()
            expected = (exact / scale.double()).clamp(-fmax, fmax).to(fp8)
            assert fp8_steps(c8, expected).max() <= 1, (shape, dtype, headroom)
            assert amax.item() == pytest.approx(exact.abs().max().item(), rel=1e-5 if dtype == torch.float32 else 2e-2)


def test_fp8_amax_is_the_fp32_accumulators():
    """With fp32 operands the FP8 kernel's accumulator is matmul_amax's C: same amax, bit for bit."""
    a, b = make((37, 70, 61), torch.float32, seed=7)
    c32, amax32 = epilogue.matmul_amax(a, b)
    _, amax = epilogue.matmul_to_fp8(a, b, 0.05, torch.float8_e4m3fnuz)
    assert torch.equal(amax, amax32)


def test_default_format_is_the_machines():
    from kernels.gemm_fp8 import fp8_dtype

    a, b = make((8, 8, 8), torch.bfloat16)
    assert epilogue.matmul_to_fp8(a, b, 1.0)[0].dtype == fp8_dtype()


def test_empty_and_k_zero_do_what_torch_does():
    c, amax = epilogue.matmul_amax(torch.randn(0, 3), torch.randn(3, 4))
    assert c.shape == (0, 4) and amax == 0
    c, amax = epilogue.matmul_amax(torch.randn(2, 0), torch.randn(0, 4))
    assert torch.equal(c, torch.zeros(2, 4)) and amax == 0
    c8, amax = epilogue.matmul_to_fp8(torch.randn(2, 0), torch.randn(0, 4), 1.0, torch.float8_e4m3fn)
    assert torch.equal(c8.float(), torch.zeros(2, 4)) and amax == 0


@pytest.mark.parametrize("call,error,match", [
    (lambda a, b: epilogue.matmul_to_fp8(a, b, torch.ones(2)), ValueError, "one float32 number"),
    (lambda a, b: epilogue.matmul_to_fp8(a, b, torch.tensor(1.0, dtype=torch.float64)), ValueError, "float32"),
    (lambda a, b: epilogue.matmul_to_fp8(a, b, 1.0, torch.float16), TypeError, "fp8_dtype must be"),
    (lambda a, b: epilogue.matmul_to_fp8(a, b, torch.ones((), device="meta")), ValueError, "meta"),
    (lambda a, b: epilogue.matmul_amax(a, b.t()), ValueError, "inner dimensions"),
    (lambda a, b: epilogue.matmul_amax(a.int(), b.int()), TypeError, "int32"),
])
def test_bad_inputs_are_refused_by_name(call, error, match):
    a, b = make((4, 6, 5), torch.float32)
    with pytest.raises(error, match=match):
        call(a, b)


def test_traffic_arithmetic():
    """bf16 C at 8192 x 8192: delayed scaling saves 4 bytes per element (store C 2, read it
    back 2; FP8 C written either way), current scaling the 2 of the amax pass."""
    mn = 8192 * 8192
    delayed, current = epilogue.traffic(8192, 8192, torch.bfloat16)
    assert (delayed["unfused bytes"], delayed["fused bytes"]) == (5 * mn + 4, mn + 4)
    assert delayed["saved bytes"] == 4 * mn and current["saved bytes"] == 2 * mn


def test_a_gpu_takes_only_its_own_format(fake_gpu):
    fake_gpu("hip", "gfx942")
    a, b = make((4, 6, 5), torch.bfloat16)
    with pytest.raises(TypeError, match="not this GPU's FP8 format"):
        epilogue.matmul_to_fp8(a, b, 1.0, torch.float8_e4m3fn)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_on_this_gpu_amax_exact_and_fp8_within_one_step(dtype):
    """The same two rules on the GPU's own converter and atomics, at a shape of many tiles."""
    from kernels.gemm_fp8 import fp8_dtype

    fp8 = fp8_dtype()
    a, b = (t.to(kernels.backend.current().device) for t in make((1000, 777, 3001), dtype, seed=9))
    c, amax = epilogue.matmul_amax(a, b)
    assert torch.equal(amax, c.abs().amax().float())
    exact = a.double().cpu() @ b.double().cpu()
    scale = torch.tensor(exact.abs().max().item() / torch.finfo(fp8).max, device=a.device)
    c8, amax8 = epilogue.matmul_to_fp8(a, b, scale, fp8)
    expected = (exact / scale.double().cpu()).clamp(-torch.finfo(fp8).max, torch.finfo(fp8).max).to(fp8)
    assert fp8_steps(c8.cpu(), expected).max() <= 1
    assert amax8.item() == pytest.approx(exact.abs().max().item(), rel=1e-5 if dtype == torch.float32 else 2e-2)
