"""The GEMM ladder on the CPU interpreter: every registered rung, every dtype it claims.

Rungs come from the registry (``kernels.variants("gemm")``), so a new rung is covered
without editing this file; rung-specific tests (v3 XCD remap, v5 chosen config, v6
stream-K) look their rung up by number and skip if it is not registered. Shapes stay
<= 96 per dim: each interpreted program instance costs ~1 ms.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect

import pytest
import torch

import kernels
from workbench.check import check_rung

RUNGS = [r for r in kernels.variants("gemm") if r.runs_here()]
TRITON_RUNGS = [r for r in RUNGS if r.kind == "triton"]
ODD_SHAPES = [(1, 17, 9), (23, 1, 5), (7, 11, 1), (31, 37, 41), (67, 3, 71)]
SIMT_TAILS = ((1, 1, 1), (37, 29, 53))   # smoke shapes with a tail in every dimension


def rung_params(rungs):
    return [pytest.param(r, id=r.label) for r in rungs]


def rung_dtype_params(rungs):
    return [pytest.param(r, d, id=f"{r.label}-{str(d).replace('torch.', '')}")
            for r in rungs for d in r.dtypes if r.supports(d)]


def assert_passes(rung, shape, dtype, layout="row"):
    report = check_rung(rung, shape, dtype, layout=layout)
    assert report.passed, f"{rung.title} {shape} {dtype} {layout}: {report.message}"


def numbered(n: int):
    try:
        return kernels.get("gemm", n)
    except KeyError:
        pytest.skip(f"gemm rung v{n} is not registered")


def with_overrides(rung, **overrides):
    """The same rung with some settings replaced (e.g. NUM_XCDS=8 on a CPU)."""
    return dataclasses.replace(rung, fn=functools.partial(rung.fn, overrides=overrides))


# -- every rung --------------------------------------------------------------------

@pytest.mark.parametrize("layout", ["row", "col"])
@pytest.mark.parametrize("rung,dtype", rung_dtype_params(RUNGS))
def test_smoke_shapes(rung, dtype, layout):
    for shape in smoke_shapes(rung, dtype, layout):
        assert_passes(rung, shape, dtype, layout)


def smoke_shapes(rung, dtype, layout) -> tuple:
    """Every smoke shape, except for a SIMT rung outside its first dtype in row-major: Numba's
    CUDA simulator runs a Python thread per GPU thread (the slowest tests of the ladder), and
    another dtype or layout changes the rung's loads, not its tiling, so the shapes
    with a tail in every dimension, one tile and several, stand for the set."""
    shapes = kernels.spec("gemm").smoke_shapes
    if rung.kind != "simt" or (dtype, layout) == (rung.dtypes[0], "row"):
        return shapes
    assert set(SIMT_TAILS) <= set(shapes), "SIMT_TAILS should name smoke shapes"
    return SIMT_TAILS


@pytest.mark.parametrize("rung,dtype", rung_dtype_params(TRITON_RUNGS))
def test_odd_shapes(rung, dtype):
    for shape in ODD_SHAPES:
        assert_passes(rung, shape, dtype)


@pytest.mark.parametrize("rung", RUNGS, ids=lambda r: r.label)
def test_non_contiguous_inputs(rung):
    gen = torch.Generator().manual_seed(1)
    a_big = torch.randn(21, 40, generator=gen)
    b_big = torch.randn(30, 50, generator=gen)
    a, b = a_big[:, 3:33], b_big[:, 5:22]  # row strides 40 and 50 > widths 30 and 17
    assert a.stride(0) > a.shape[1] and not a.is_contiguous()
    out = rung(a, b)
    torch.testing.assert_close(out, a @ b, rtol=1e-5, atol=1e-5)


BAD_INPUTS = [
    (lambda: (torch.randn(2, 3, 4), torch.randn(4, 5)), ValueError, "a must be 2-D"),
    (lambda: (torch.randn(3, 4), torch.randn(4)), ValueError, "b must be 2-D"),
    (lambda: (torch.randn(3, 4), torch.randn(5, 6)), ValueError, "inner dimensions"),
    (lambda: (torch.randn(3, 4), torch.randn(4, 5, dtype=torch.float16)), TypeError, "a: float32"),
    (lambda: (torch.ones(3, 4, dtype=torch.int32), torch.ones(4, 5, dtype=torch.int32)),
     TypeError, "a has dtype int32"),
    (lambda: (torch.randn(0, 4), torch.randn(4, 5)), ValueError, "a is empty"),
    (lambda: (torch.randn(3, 4), torch.empty(2, 2, device="meta")), ValueError, "b is on meta"),
    (lambda: ([[1.0]], torch.randn(1, 1)), TypeError, "a must be a torch.Tensor"),
]


@pytest.mark.parametrize("make,error,match", BAD_INPUTS, ids=[m for _, _, m in BAD_INPUTS])
@pytest.mark.parametrize("rung", rung_params(RUNGS))
def test_bad_inputs_are_refused_by_name(rung, make, error, match):
    with pytest.raises(error, match=match):
        rung(*make())


# -- rungs with settings (v3+): unknown overrides are refused, XCD remap under the interpreter

OVERRIDABLE = [r for r in TRITON_RUNGS if "overrides" in inspect.signature(r.fn).parameters]


@pytest.mark.parametrize("rung", rung_params(OVERRIDABLE))
def test_unknown_override_is_refused(rung):
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    with pytest.raises(ValueError, match="NOT_A_SETTING"):
        rung(a, b, overrides={"NOT_A_SETTING": 1})


@pytest.mark.parametrize("rung", rung_params(OVERRIDABLE))
def test_xcd_remap_writes_every_tile_once(rung):
    """NUM_XCDS forced to 8 on tile counts that are not multiples of 8.

    The harness poisons C with NaN, so a tile that the remap skips (or maps twice
    while skipping another) fails the check.
    """
    remapped = with_overrides(rung, NUM_XCDS=8)
    for shape in [(96, 80, 40), (65, 97, 33), (33, 32, 8)]:  # 3x3=9, 3x4=12, 2x1=2 tiles of 32
        assert_passes(remapped, shape, torch.float32)
    assert_passes(remapped, (96, 80, 40), torch.bfloat16, layout="col")


def test_xcd_remap_is_a_bijection_for_every_grid_size():
    v3 = importlib.import_module(numbered(3).module)
    for num_xcds in (1, 2, 8):
        for num_pids in range(1, 200):
            mapped = [v3.xcd_remap(p, num_pids, num_xcds) for p in range(num_pids)]
            assert sorted(mapped) == list(range(num_pids)), (num_pids, num_xcds)


def test_xcd_remap_gives_each_xcd_a_contiguous_range():
    v3 = importlib.import_module(numbered(3).module)
    num_pids, num_xcds = 21, 8
    for xcd in range(num_xcds):
        mine = sorted(v3.xcd_remap(p, num_pids, num_xcds) for p in range(xcd, num_pids, num_xcds))
        assert mine == list(range(mine[0], mine[0] + len(mine)))


# -- v5: autotune --------------------------------------------------------------------

def test_v5_records_the_config_it_launched():
    rung = numbered(5)
    module = importlib.import_module(rung.module)
    shape = (45, 23, 29)
    a, b = kernels.spec("gemm").make_inputs(shape, torch.float16)
    rung(a, b)
    chosen = module.chosen_config(shape, torch.float16)
    assert chosen is not None and {"BLOCK_M", "BLOCK_N", "BLOCK_K", "num_warps", "num_stages"} <= set(chosen)
    assert module.chosen_config((45, 23, 29), torch.float64) is None
    assert module.chosen_config((4096, 4096, 4096), torch.float16) is None  # another bucket


def test_v5_pinned_config_is_the_one_reported():
    rung = numbered(5)
    module = importlib.import_module(rung.module)
    assert_passes(with_overrides(rung, BLOCK_M=16, BLOCK_K=16), (37, 29, 53), torch.float32)
    assert module.chosen_config((37, 29, 53), torch.float32)["BLOCK_M"] == 16


def test_config_spaces_prune_by_shape():
    configs = importlib.import_module("kernels.gemm.configs")
    interp = configs.space("interpreter")
    assert len(interp) == 1  # nothing is timed on a CPU
    for backend in ("hip", "cuda"):
        space = configs.space(backend)
        big = configs.prune(space, 8192, 8192, 8192)
        assert big and all(c.kwargs["BLOCK_M"] > configs.SKINNY_BLOCK_M for c in big)
        decode = configs.prune(space, 16, 14336, 4096)
        assert decode and all(c.kwargs["BLOCK_M"] <= 16 for c in decode)
        assert len(configs.prune(space, 1, 1, 1)) == 1
        assert all(c.num_stages >= 2 for c in space)
    assert all(c.kwargs["kpack"] == 1 for c in configs.space("hip", "gfx950"))


# -- v6: persistent + stream-K -----------------------------------------------------

def _v6():
    rung = numbered(6)
    return rung, importlib.import_module(rung.module)


@pytest.mark.parametrize("shape,sk_expected", [
    ((96, 96, 64), True),    # 9 tiles on 4 programs: 2 full waves + 1 tile split in K
    ((96, 96, 96), True),
    ((64, 64, 64), False),   # 4 tiles: exactly one wave, nothing to split
    ((32, 40, 96), True),    # 2 tiles < 4 programs: both split in K
    ((20, 50, 97), True),    # ragged K in the last split
    ((5, 7, 200), True),     # 1 tile, 7 K steps, 4 splits
    ((1, 1, 1), False),
    ((53, 67, 47), True),    # primes: 6 tiles, 2 split
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_v6_stream_k_schedules(shape, sk_expected, dtype):
    rung, v6 = _v6()
    cfg = v6.config(kernels.backend.current(), *shape)
    plan = v6.schedule(*shape, cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"], cfg["NUM_PROGS"])
    assert (plan.sk_tiles > 0) == sk_expected, plan
    assert_passes(rung, shape, dtype)


def test_v6_schedule_arithmetic():
    _, v6 = _v6()
    assert v6.schedule(96, 96, 64, 32, 32, 32, 4) == v6.Schedule(8, 1, 2, 32)
    assert v6.schedule(32, 32, 256, 32, 32, 32, 4) == v6.Schedule(0, 1, 4, 64)
    assert v6.schedule(32, 32, 96, 32, 32, 32, 4) == v6.Schedule(0, 1, 3, 32)   # 3 steps, 3 splits
    assert v6.schedule(32, 32, 160, 32, 32, 32, 3) == v6.Schedule(0, 1, 3, 64)  # 5 steps: 2+2+1
    assert v6.schedule(4096, 4096, 4096, 256, 128, 64, 304) == v6.Schedule(512, 0, 1, 4096)
    assert v6.schedule(8192, 8192, 8192, 256, 256, 64, 304) == v6.Schedule(912, 112, 2, 4096)


def test_v6_more_programs_than_tiles_and_many_tiles_per_program():
    rung, _ = _v6()
    assert_passes(with_overrides(rung, NUM_PROGS=7), (96, 64, 75), torch.float16)  # 6 tiles, 1 idle
    assert_passes(with_overrides(rung, NUM_PROGS=2), (96, 96, 40), torch.float32, "col")
    assert_passes(with_overrides(rung, NUM_PROGS=3, NUM_XCDS=8), (65, 65, 65), torch.bfloat16)


def test_v6_without_the_combine_pass_fails_the_harness():
    """The deliberately broken variant: split tiles never combined stay poisoned."""
    rung, _ = _v6()
    broken = with_overrides(rung, FIXUP=False)
    report = check_rung(broken, (96, 96, 64), torch.float32)
    assert not report.passed and report.mismatches == 32 * 32, report.message
    assert check_rung(broken, (64, 64, 64), torch.float32).passed  # no split tile: no combine needed


def test_v6_is_deterministic():
    rung, _ = _v6()
    a, b = kernels.spec("gemm").make_inputs((32, 40, 96), torch.float32, seed=3)
    assert torch.equal(rung(a, b), rung(a, b))
