"""split-K beside v6: correct on the interpreter, off the ladder, deterministic; its compile
on gfx942 and the model's comparison with v6's stream-K (the notebook's claims).

Interpreter shapes stay tiny: the interpreter's config is a 32x32x32 tile and 4 "CUs".
"""
from __future__ import annotations

import dataclasses
import functools
import itertools

import pytest
import torch

import kernels
from kernels.gemm import split_k
from workbench.check import check_rung

SPLIT_K = kernels.get("gemm", "split_k")
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def pinned(**overrides):
    return dataclasses.replace(SPLIT_K, fn=functools.partial(SPLIT_K.fn, overrides=overrides))


def assert_passes(rung, shape, dtype, layout="row"):
    report = check_rung(rung, shape, dtype, layout=layout)
    assert report.passed, f"{rung.title} {shape} {dtype} {layout}: {report.message}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_odd_shapes_every_dtype(dtype):
    """Smoke shapes (1x1x1, N=1, K=3 ...) and ragged K in the last slice, poisoned outputs."""
    for shape in (*kernels.spec("gemm").smoke_shapes, (20, 50, 97), (5, 7, 200)):
        assert_passes(SPLIT_K, shape, dtype)


@pytest.mark.parametrize("slices", [1, 3, 7])
def test_pinned_slices_and_column_major(slices):
    assert_passes(pinned(SLICES=slices), (33, 40, 161), torch.float16, "col")
    assert_passes(pinned(SLICES=slices), (33, 40, 161), torch.bfloat16)


def test_every_slice_is_written():
    """The workspace starts poisoned under the harness, so a slice no program wrote would
    surface as NaN in C: the launch covers (tiles, S) exactly."""
    from kernels.outputs import poisoned_outputs

    a, b = kernels.spec("gemm").make_inputs((40, 70, 150), torch.float32, seed=2)
    cfg = split_k._settings(40, 70, 150, {"SLICES": 4}, kernels.backend.current())
    with poisoned_outputs():
        work = split_k.partials(a, b, cfg)
    # 5 K steps: 4 slices would leave one empty (2+2+1+0), so S = 3
    assert work.shape == (2 * 3, 3, 32, 32) and not work.isnan().any()


def test_off_the_ladder_but_found_by_name():
    assert SPLIT_K.beside and SPLIT_K.label == "split_k" and SPLIT_K.title == "split_k (beside v6)"
    assert "split_k" not in [r.label for r in kernels.variants("gemm")]
    assert kernels.get("gemm", 6).name == "persistent"
    assert SPLIT_K in kernels.registry.beside("gemm")


def test_a_second_variant_of_the_same_name_is_refused():
    with pytest.raises(ValueError, match="registered twice"):
        kernels.registry.rung(op="gemm", rung=6, name="split_k", backends=("interpreter",),
                              dtypes=DTYPES, interpreter=True, kind="triton", beside=True)(lambda a, b: a)


def test_slices_fill_the_cus_and_none_is_empty():
    assert split_k.slices(512, 1024, 16384, 128, 128, 64, 304) == 9      # 32 tiles x 9 <= 304
    assert split_k.slices(4096, 4096, 4096, 256, 128, 64, 304) == 1      # 512 tiles: no split
    assert split_k.slices(32, 32, 64, 32, 32, 32, 304) == 2              # at most one per K step
    for steps, wanted in itertools.product(range(1, 40), range(1, 45)):
        s = split_k.clamp_slices(wanted, steps * 32, 32)
        per = -(-steps // s)
        assert 1 <= s <= min(wanted, steps) and (s - 1) * per < steps, (steps, wanted, s)


def test_deterministic_and_why_not_atomics():
    """The reduce pass adds the slices in slice order: the same bits every run, and C equals
    that sum. Atomics would add them in arrival order; fp32 addition in other orders gives
    other bits for the same partials (shown on this launch's own workspace)."""
    a, b = kernels.spec("gemm").make_inputs((32, 32, 320), torch.float32, seed=5)
    c = SPLIT_K(a, b, overrides={"SLICES": 5})
    assert torch.equal(c, SPLIT_K(a, b, overrides={"SLICES": 5}))
    cfg = split_k._settings(32, 32, 320, {"SLICES": 5}, kernels.backend.current())
    work = split_k.partials(a, b, cfg)[0]          # one tile, 5 partial tiles

    def in_order(order):
        total = torch.zeros_like(work[0])
        for s in order:
            total = total + work[s]
        return total

    assert torch.equal(c, in_order(range(5)))
    others = [in_order(p) for p in itertools.permutations(range(5))]
    assert sum(not torch.equal(o, c) for o in others) > len(others) // 2


def test_compiled_for_gfx942_mfma_no_spills_fewer_vgprs_than_v6():
    """The notebook's compile evidence: the main kernel is v6's K loop (same MFMAs, same LDS),
    without v6's persistent unit loop and its second epilogue, in fewer VGPRs; the reduce
    pass is v6's fix-up kernel, no MFMA."""
    from workbench import isa

    main, reduce = isa.inspect_all("gemm", "split_k", "gfx942")
    v6_main = isa.inspect("gemm", "v6", "gfx942")
    assert main.matrix_instructions == v6_main.matrix_instructions and main.lds_bytes == v6_main.lds_bytes
    assert main.spills == 0 and main.sgpr_spills == 0
    assert main.vgprs < v6_main.vgprs
    assert reduce.kernel_name == "_streamk_fixup_kernel" and not reduce.matrix_instructions


@pytest.mark.slow
def test_model_split_k_matches_stream_k_below_the_cu_count_and_loses_above():
    """Fewer tiles than CUs: v6's schedule splits every tile, as split-K does, and both fill
    the chip where v5 leaves it mostly idle. 320 tiles (just over 304 CUs): split-K takes
    S = 1 and runs a second, nearly empty wave; stream-K splits only the 16-tile tail."""
    from workbench.model import predict

    def ms(rung, shape):
        return predict("gemm", rung, shape, "bf16", "MI300X").time_s

    skinny, over = (512, 1024, 16384), (2048, 5120, 8192)
    assert ms("split_k", skinny) == pytest.approx(ms("v6", skinny), rel=0.05)
    assert ms("split_k", skinny) < ms("v5", skinny) / 4
    assert ms("split_k", over) > 1.5 * ms("v6", over)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_on_this_gpu_skinny_and_ragged_shapes(dtype):
    """On the GPU's own CU count: a skinny long-K shape (split) and a ragged one."""
    for shape in ((256, 512, 8192), (1000, 777, 3001)):
        assert_passes(SPLIT_K, shape, dtype)
