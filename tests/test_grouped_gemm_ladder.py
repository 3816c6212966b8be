"""The grouped GEMM ladder on the CPU interpreter: every rung, every dtype, the output
and (every rung has a backward) dx and dw through the harness, against float64.

Rungs come from the registry, so a new rung is covered without editing this file.
Edge cases are offsets written out by hand: empty groups first, last and in between,
one group, all rows in one group, one row, very uneven groups, T not a multiple of any
block, and more groups than a BLOCK_G of 32. Shapes stay tiny: each interpreted program
instance costs ~1 ms.
"""
from __future__ import annotations

import pytest
import torch

import kernels
from kernels.moe.grouped_gemm import spec, v2_one_launch
from kernels.moe.grouped_gemm.launch import config
from workbench.check import check_rung, judge

RUNGS = [r for r in kernels.variants("grouped_gemm") if r.runs_here()]
TRITON_RUNGS = [r for r in RUNGS if r.kind == "triton"]
SPEC = kernels.spec("grouped_gemm")


def rung_params(rungs):
    return [pytest.param(r, id=r.label) for r in rungs]


def rung_dtype_params(rungs):
    return [pytest.param(r, d, id=f"{r.label}-{str(d).replace('torch.', '')}")
            for r in rungs for d in r.dtypes if r.supports(d)]


def operands(sizes, k=24, n=40, dtype=torch.float32, layout="row", seed=0):
    """x, w and offsets for rows per group ``sizes``, random values in any layout."""
    x, w, _ = spec.make_inputs((sum(sizes), k, n, len(sizes), 0), dtype, seed=seed, layout=layout)
    return x, w, spec.offsets_from_sizes(torch.tensor(sizes))


def assert_judged(rung, inputs, seed=0):
    for name, fields in judge(rung, SPEC, inputs, seed):
        assert fields["passed"], (f"{rung.title} {name}: error {fields['error']:.2e} > "
                                  f"{fields['allowed']:.2e}, {fields['mismatches']} elements off")


@pytest.mark.parametrize("rung,dtype", rung_dtype_params(RUNGS))
def test_smoke_shapes(rung, dtype):
    for shape in SPEC.smoke_shapes:
        report = check_rung(rung, shape, dtype)
        assert report.passed, f"{rung.title} {shape} {dtype}: {report.message}"
        assert all(f"{t} " in report.message for t in ("out", "dx", "dw")), report.message


@pytest.mark.parametrize("rung", rung_params(TRITON_RUNGS))
def test_column_major_operands(rung):
    """x column-major and w stored (G, N, K), as ``nn.Linear``-style expert weights."""
    for shape in ((37, 24, 40, 4, 1), (70, 40, 24, 6, 3)):
        report = check_rung(rung, shape, torch.bfloat16, layout="col")
        assert report.passed, f"{rung.title} {shape}: {report.message}"


EDGES = {
    "empty first, last and middle": [0, 5, 0, 33, 0],
    "one group": [45],
    "all rows in one group": [0, 0, 70, 0],
    "one row": [1],
    "very uneven": [1, 66, 2, 0, 1],
    "forty groups": [0, 3, 0, 1] * 10,          # BLOCK_G 64, most groups empty
}


@pytest.mark.parametrize("sizes", EDGES.values(), ids=EDGES.keys())
@pytest.mark.parametrize("rung", rung_params(TRITON_RUNGS))
def test_edge_offsets(rung, sizes):
    assert_judged(rung, operands(sizes))
    assert_judged(rung, operands(sizes, k=33, n=17, dtype=torch.bfloat16, seed=1), seed=1)


@pytest.mark.parametrize("rung", rung_params(TRITON_RUNGS))
def test_stride_zero_output_gradient(rung):
    """``y.sum().backward()`` hands the backward an expanded gradient (strides 0, 0)."""
    x, w, offsets = operands([7, 0, 30])
    x.requires_grad_()
    w.requires_grad_()
    rung(x, w, offsets).sum().backward()
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    spec.reference(x64, w64, offsets).sum().backward()
    torch.testing.assert_close(x.grad.double(), x64.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(w.grad.double(), w64.grad, rtol=1e-5, atol=1e-5)
    assert torch.equal(w.grad[1], torch.zeros_like(w.grad[1]))   # the empty group's dw


def test_every_rung_has_a_backward():
    assert all(r.backward for r in kernels.variants("grouped_gemm"))


def test_the_upper_bound_grid_covers_every_row_tile():
    """Each group adds at most one partial tile, so cdiv(T, BLOCK_M) + G row programs
    suffice for any split of T rows, with no offsets read."""
    cfg = config("hip")
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        g = int(torch.randint(1, 40, (), generator=gen))
        sizes = torch.randint(0, 400, (g,), generator=gen) * torch.randint(0, 2, (g,), generator=gen)
        needed = int((-(-sizes // cfg["BLOCK_M"])).sum())
        rows, _ = v2_one_launch.grid(int(sizes.sum()), 1, g, cfg)
        assert needed <= rows <= needed + g


def _forward_backward(fn, x, w, offsets):
    x, w = x.requires_grad_(), w.requires_grad_()
    fn(x, w, offsets, check_offsets=False).sum().backward()
    return x.grad, w.grad


@pytest.mark.parametrize("label", ["v2", "v4"])
def test_one_launch_rungs_never_sync_with_the_host(no_host_sync, label):
    x, w, offsets = operands([5, 0, 40, 3])
    dx, dw = _forward_backward(kernels.get("grouped_gemm", label), x, w, offsets)
    assert dx.shape == x.shape and dw.shape == w.shape


def test_v1_reads_the_offsets_on_the_host(no_host_sync):
    """The control: the same trap catches v1's host read of the offsets."""
    with pytest.raises(AssertionError, match="host sync"):
        _forward_backward(kernels.get("grouped_gemm", "v1"), *operands([5, 0, 40, 3]))


def _with(**change):
    x, w, offsets = operands([3, 0, 4])
    args = dict(x=x, w=w, offsets=offsets)
    args.update(change)
    return args


BAD_INPUTS = [
    (_with(offsets=torch.tensor([3, 3, 7])), TypeError, "offsets must be int32"),
    (_with(offsets=torch.tensor([3, 2, 7], dtype=torch.int32)), ValueError, "non-decreasing"),
    (_with(offsets=torch.tensor([3, 3, 6], dtype=torch.int32)), ValueError, r"offsets\[-1\] must equal"),
    (_with(offsets=torch.tensor([3, 7], dtype=torch.int32)), ValueError, "offsets has 2 entries"),
    (_with(w=torch.randn(3, 24, 40, dtype=torch.float16)), TypeError, "dtypes differ"),
    (_with(w=torch.randn(3, 20, 40)), ValueError, "inner dimensions"),
    (_with(x=torch.randn(7, 24, dtype=torch.float64), w=torch.randn(3, 24, 40, dtype=torch.float64)),
     TypeError, "x has dtype float64"),
    (_with(offsets=torch.empty(3, dtype=torch.int32, device="meta")), ValueError, "offsets is on meta"),
    (_with(w=torch.randn(24, 40)), ValueError, "w must be 3-D"),
    (_with(x=torch.randn(0, 24), offsets=torch.zeros(3, dtype=torch.int32)), ValueError, "x is empty"),
]


@pytest.mark.parametrize("args,error,match", BAD_INPUTS, ids=[m for _, _, m in BAD_INPUTS])
@pytest.mark.parametrize("rung", rung_params(RUNGS))
def test_bad_inputs_are_refused_by_name(rung, args, error, match):
    with pytest.raises(error, match=match):
        rung(**args)
