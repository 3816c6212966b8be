"""The FP8 baseline: operands prepared before the clock, and outputs it cannot give refused.

The GPU path (library operand form: aligned, B column-major) is run here on CPU tensors
under a pretended GPU backend; the CPU ``torch._scaled_mm`` computes it.
"""
from __future__ import annotations

import contextlib

import pytest
import torch

import kernels
from kernels.gemm_fp8 import ref as ref_module
from kernels.gemm_fp8 import spec

CASES = [((37, 29, 53), "row", "tensor"), ((37, 29, 53), "col", "channel"),
         ((32, 48, 64), "row", "channel"), ((32, 48, 64), "col", "tensor")]


def _inputs(shape, layout, granularity):
    return spec.make_inputs(shape, torch.float8_e4m3fn, layout=layout, granularity=granularity)


@pytest.mark.parametrize("gpu", [False, True], ids=["interpreter", "gpu-path"])
@pytest.mark.parametrize("shape, layout, granularity", CASES)
def test_prepared_call_gives_the_unprepared_result_bitwise(fake_gpu, gpu, shape, layout,
                                                           granularity):
    if gpu:
        fake_gpu("cuda", "sm_90")
    ref = kernels.registry.reference_rung("gemm_fp8")
    inputs = _inputs(shape, layout, granularity)
    out = ref.bind(*inputs)()
    assert torch.equal(out, ref(*inputs)) and out.shape == (shape[0], shape[1])
    expected = spec.reference(*inputs)   # and it is the product, padding cut off again
    assert torch.allclose(out.double(), expected, rtol=1e-2, atol=1e-2 * expected.abs().max())


def _counting(fn, counts, name):
    def spy(*args, **kwargs):
        counts[name] = counts.get(name, 0) + 1
        return fn(*args, **kwargs)
    return spy


@pytest.fixture
def counted(monkeypatch):
    """Counts calls of every helper with which the baseline copies operands."""
    counts = {}
    for owner, name in ((ref_module, "_padded"), (ref_module, "_library_scales"),
                        (torch.nn.functional, "pad")):
        monkeypatch.setattr(owner, name, _counting(getattr(owner, name), counts, name))
    return counts


def test_the_bound_call_makes_no_copies(fake_gpu, counted, monkeypatch):
    fake_gpu("cuda", "sm_90")
    a, b, scale_a, scale_b = _inputs((37, 29, 53), "row", "channel")   # unaligned, B row-major
    seen = []
    real = torch._scaled_mm
    monkeypatch.setattr(torch, "_scaled_mm", lambda *args, **kw: seen.append(args) or real(*args, **kw))
    call = kernels.registry.reference_rung("gemm_fp8").bind(a, b, scale_a, scale_b)
    assert counted == {"_padded": 2, "_library_scales": 1, "pad": 2} and not seen
    counted.clear()
    call(), call()
    assert counted == {} and len(seen) == 2
    assert all(x is y for x, y in zip(*seen))                 # the same prepared operands
    a_lib, b_lib = seen[0][:2]
    assert a_lib.shape == (48, 64) and b_lib.shape == (64, 32) and b_lib.t().is_contiguous()


def test_operands_already_in_library_form_are_not_copied(fake_gpu, monkeypatch):
    fake_gpu("cuda", "sm_90")
    a, b, scale_a, scale_b = _inputs((32, 48, 64), "row", "tensor")
    b = b.t().contiguous().t()                                 # column-major, as cuBLASLt wants
    seen = []
    monkeypatch.setattr(torch, "_scaled_mm", lambda *args, **kw: seen.append(args) or
                        torch.empty(32, 48, dtype=torch.bfloat16))
    kernels.registry.reference_rung("gemm_fp8").bind(a, b, scale_a, scale_b)()
    assert seen[0][0].data_ptr() == a.data_ptr() and seen[0][1].data_ptr() == b.data_ptr()


@pytest.mark.parametrize("out_dtype", [torch.float16, torch.float32])
def test_per_channel_scales_with_a_non_bf16_output_are_refused_on_a_gpu(fake_gpu, monkeypatch,
                                                                        out_dtype):
    fake_gpu("hip", "gfx942")
    inputs = spec.make_inputs((32, 48, 64), torch.float8_e4m3fnuz, granularity="channel")

    def never(*args, **kwargs):
        raise AssertionError("torch._scaled_mm must not be reached")
    monkeypatch.setattr(torch, "_scaled_mm", never)
    ref = kernels.registry.reference_rung("gemm_fp8")
    with pytest.raises(ValueError, match="row-wise scaling produces bfloat16 only"):
        ref(*inputs, out_dtype=out_dtype)
    with pytest.raises(ValueError, match="per-row/column scales need out_dtype=torch.bfloat16"):
        ref.bind(*inputs, out_dtype=out_dtype)


def test_per_tensor_scales_keep_every_output_dtype_on_a_gpu(fake_gpu):
    fake_gpu("cuda", "sm_90")
    inputs = _inputs((32, 48, 64), "row", "tensor")
    out = kernels.registry.reference_rung("gemm_fp8")(*inputs, out_dtype=torch.float16)
    assert out.dtype == torch.float16 and out.shape == (32, 48)


def test_the_interpreter_keeps_per_channel_scales_with_any_output():
    inputs = _inputs((37, 29, 53), "row", "channel")
    out = kernels.registry.reference_rung("gemm_fp8")(*inputs, out_dtype=torch.float32)
    assert out.dtype == torch.float32


@pytest.mark.gpu
@pytest.mark.parametrize("shape, layout, granularity", CASES)
def test_on_this_gpu_the_prepared_call_gives_the_same_bits(shape, layout, granularity):
    from kernels.gemm_fp8 import fp8_dtype

    ref = kernels.registry.reference_rung("gemm_fp8")
    inputs = spec.make_inputs(shape, fp8_dtype(), device="cuda", layout=layout,
                              granularity=granularity)
    assert torch.equal(ref.bind(*inputs)(), ref(*inputs))
    with pytest.raises(ValueError, match="bfloat16 only") if granularity == "channel" else \
            contextlib.nullcontext():
        assert ref(*inputs, out_dtype=torch.float16).dtype == torch.float16
