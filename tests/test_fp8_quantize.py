"""The fused FP8 quantize kernel: bit-exact against its torch reference, every granularity and format.

The kernel runs under the interpreter here with the launch a GPU gets (128 x 128 tiles), on
shapes that are not multiples of the groups (ragged last tiles), into poisoned outputs, so
an element or scale the kernel does not write fails the comparison.
"""
from __future__ import annotations

import pytest
import torch

import kernels
from kernels.gemm_fp8 import quantize, quantize_fp8
from kernels.gemm_fp8 import quantize_kernel
from kernels.gemm_fp8.quantize_kernel import bytes_moved
from kernels.gemm_fp8.quantize_ref import (GRANULARITIES, MX_DTYPES, QUANT_DTYPES, dequantize, quantize_one,
                                           quantize_reference, scale_shape)
from kernels.gemm_mxfp4.formats import quantize_mxfp4
from kernels.microscaling import round_up_exponent, shared_exponent
from kernels.outputs import poisoned_outputs
from e8m0_cases import adversarial_groups
from quantize_checks import activations, assert_same

E4M3FN, E4M3FNUZ, E5M2 = torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.float8_e5m2
CASES = ([(g, d, "ocp") for g in GRANULARITIES for d in (MX_DTYPES if g == "mx32" else QUANT_DTYPES)]
         + [("mx32", d, "round_up") for d in MX_DTYPES])   # (granularity, fp8, mx32's e8m0 rule)


@pytest.mark.parametrize("granularity,fp8,rule", CASES, ids=lambda v: str(v).removeprefix("torch.float8_"))
def test_quantize_is_bit_exact_with_its_transposed_copy(granularity, fp8, rule):
    x = activations((130, 259))
    with poisoned_outputs():
        got = quantize(x, granularity, fp8, transpose=True, scale_rule=rule)
    want = quantize_reference(x, granularity, fp8, transpose=True, scale_rule=rule)
    assert_same(got, want)
    assert got[1].shape == scale_shape(granularity, 130, 259)
    assert got[3].shape == scale_shape(granularity, 259, 130)


def test_row_scales_of_more_tile_columns_than_one_read_of_the_scale_launch():
    """_row_scales_kernel reads a row's tile maxima _ROW_SCALES_BT at a time: K > 32 tiles of 128
    takes a second read, and each row's largest value sits in it, so a skipped or misplaced second
    read changes every scale."""
    k = 128 * quantize_kernel._ROW_SCALES_BT + 204
    x = activations((3, k), seed=9)
    x[:, -100] = 50.0 * torch.arange(1, 4)   # every row's amax, in the second read's tiles
    with poisoned_outputs():
        got = quantize(x, "row", E4M3FNUZ, transpose=True)
    assert_same(got, quantize_reference(x, "row", E4M3FNUZ, transpose=True))


@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("granularity,fp8,rule", [("row", E4M3FNUZ, "ocp"), ("block1x128", E4M3FNUZ, "ocp"),
                                                  ("mx32", E4M3FN, "round_up"), ("mx32", E5M2, "round_up")],
                         ids=lambda v: str(v).removeprefix("torch.float8_"))
def test_16_bit_inputs_without_transpose(x_dtype, granularity, fp8, rule):
    x = activations((67, 200), seed=1, dtype=x_dtype)
    with poisoned_outputs():
        got = quantize(x, granularity, fp8, scale_rule=rule)
    assert_same(got, quantize_reference(x, granularity, fp8, scale_rule=rule))


@pytest.mark.parametrize("fp8", QUANT_DTYPES, ids=str)
def test_rounding_matches_torch_on_ties_carries_and_subnormals(fp8):
    """Every representable value, every midpoint between neighbours (ties go to even) and
    its two fp32 neighbours, and the tops of binades (a round-up carries into the exponent):
    with the format's max in the tensor the scale is exactly 1, so q is the cast of x."""
    grid = torch.arange(256, dtype=torch.uint8).view(fp8).float()
    grid = grid[torch.isfinite(grid)].unique()
    mids = (grid[1:] + grid[:-1]) / 2
    near = torch.cat([mids, mids.nextafter(torch.tensor(float("inf"))),
                      mids.nextafter(torch.tensor(-float("inf")))])
    x = torch.cat([grid, near, torch.tensor([-0.0, 1e-30, -1e-30])]).reshape(1, -1)
    (q, scale) = quantize(x, "tensor", fp8)
    assert scale.item() == 1.0
    assert torch.equal(q.view(torch.uint8), x.to(fp8).view(torch.uint8))


def test_fp32_scales_map_each_group_amax_onto_the_format_max():
    x = activations((130, 259), seed=2)
    q, scale = quantize(x, "block1x128", E4M3FN)
    fmax = torch.finfo(E4M3FN).max
    q_groups = torch.nn.functional.pad(q.float().abs(), (0, 3 * 128 - 259)).reshape(130, 3, 128).amax(-1)
    assert torch.equal(q_groups[scale != 1], torch.full_like(q_groups[scale != 1], fmax))
    assert torch.equal(scale[3], torch.ones(3))            # the zero row: amax 0 -> scale 1
    back = q.float() * scale.repeat_interleave(128, 1)[:, :259]
    assert torch.all((back - x).abs() <= 2**-4 * x.abs() + 2**-9 * scale.repeat_interleave(128, 1)[:, :259])


def test_mx32_shares_the_mxfp4_scale_rule():
    """Per 32 along K, the byte is floor(log2 amax) - emax + 127, as the MXFP4 quantizer's
    (emax 8 for e4m3: the block's amax lands in [256, 512), above 448 it saturates)."""
    x = activations((5, 96), seed=3)
    q, scale = quantize(x, "mx32", E4M3FN)
    amax = x.abs().reshape(5, 3, 32).amax(-1)
    assert torch.equal(scale.long(), shared_exponent(amax, 8) + 127)
    _, fp4_scales = quantize_mxfp4(x)
    live = amax > 0            # an all-zero block gets byte 0 in both
    assert torch.equal(scale.long()[live] + 6, fp4_scales.long()[live])   # e2m1's emax is 2, e4m3's 8
    assert torch.equal(scale[~live], fp4_scales[~live]) and (~live).sum() == 3
    scaled_top = amax[live] / torch.exp2(scale[live].float() - 127)
    assert torch.all((scaled_top >= 256) & (scaled_top < 512))
    assert q.float().abs().max() <= 448


@pytest.mark.parametrize("shape", [(0, 5), (4, 0), (1, 1), (1, 300), (300, 1)], ids=str)
@pytest.mark.parametrize("granularity,rule", [("tensor", "ocp"), ("row", "ocp"), ("block128x128", "ocp"),
                                              ("mx32", "ocp"), ("mx32", "round_up")])
def test_edge_shapes(shape, granularity, rule):
    x = torch.randn(shape)
    got = quantize(x, granularity, E4M3FN, transpose=True, scale_rule=rule)
    assert_same(got, quantize_reference(x, granularity, E4M3FN, transpose=True, scale_rule=rule))


@pytest.mark.parametrize("fp8", MX_DTYPES, ids=str)
@pytest.mark.parametrize("rule", ["ocp", "round_up"])
def test_e8m0_rules_near_powers_of_two_and_the_clamp_are_bit_exact(fp8, rule):
    """The kernel against the reference on :func:`adversarial_groups`, both orientations (the
    transposed copy's groups are columns: one element of each adversarial row); the
    reference's round-up exponent against its definition in exact arithmetic: the smallest e
    in [-127, 127] with amax <= fmax 2^e (float64 holds each fmax 2^e exactly)."""
    x = adversarial_groups(fp8)
    with poisoned_outputs():
        got = quantize(x, "mx32", fp8, transpose=True, scale_rule=rule)
    assert_same(got, quantize_reference(x, "mx32", fp8, transpose=True, scale_rule=rule))
    amax = x.abs().amax(dim=1)
    fmax = torch.finfo(fp8).max
    candidates = torch.arange(-127, 128, dtype=torch.float64)
    fits = amax.double()[:, None] <= fmax * torch.exp2(candidates)[None, :]
    smallest = torch.where(fits.any(dim=1), candidates[fits.int().argmax(dim=1)], 127).int()
    assert torch.equal(round_up_exponent(amax, fmax), smallest)


@pytest.mark.parametrize("fp8", MX_DTYPES, ids=str)
def test_round_up_saturates_nothing_where_the_ocp_rule_does(fp8):
    """Every element over its group's power-of-two scale is at most fmax (exact in float64),
    on the nine-decade activations and on :func:`adversarial_groups`, along both axes; the
    OCP rule's groups whose amax is fmax 2^k's next float exceed it. A group whose amax is
    exactly fmax 2^k takes scale 2^k (the max itself), the next float up 2^(k+1); an all-zero
    group byte 0."""
    fmax = torch.finfo(fp8).max
    for x in (activations((130, 259), seed=12), adversarial_groups(fp8)):
        for rule in ("ocp", "round_up"):
            q, scale, q_t, scale_t = quantize(x, "mx32", fp8, transpose=True, scale_rule=rule)
            worst = max(float((t.double().abs() / dequantize(torch.ones_like(t), s, "mx32", torch.float64)).max())
                        for t, s in ((x, scale), (x.t(), scale_t)))
            assert (worst <= fmax) == (rule == "round_up"), (rule, worst)
    one = torch.zeros(3, 32)
    one[0, 3], one[1, 3] = fmax * 2.0 ** -20, torch.tensor(fmax * 2.0 ** -20).nextafter(torch.tensor(1.0))
    _, scale = quantize(one, "mx32", fp8, scale_rule="round_up")
    assert scale[:, 0].tolist() == [127 - 20, 127 - 19, 0]


def test_round_up_is_for_mx32_and_names_its_rules():
    with pytest.raises(ValueError, match="scale_rule must be one of"):
        quantize(torch.ones(2, 32), "mx32", E4M3FN, scale_rule="ceil")
    with pytest.raises(ValueError, match="chooses mx32's e8m0 scales"):
        quantize(torch.ones(2, 32), "row", E4M3FN, scale_rule="round_up")
    with pytest.raises(ValueError, match="scale_rule must be one of"):
        quantize_one(torch.ones(2, 32), "mx32", E4M3FN, "floor")


@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_dequantize_gives_the_values_within_the_format_rounding(granularity):
    """Each element within half an e4m3 ulp of x (2^-4 relative) or, below the normal range,
    half the subnormal spacing of its group's scale s (2^-10 s), of x saturated at 448 s
    (mx32's rule may saturate): groups nine decades apart, so an element scaled by another
    group's scale fails. Flattened row scales are taken."""
    x = activations((130, 300), seed=5).double()
    q, scale = quantize_one(x, granularity, E4M3FN)
    if granularity == "row":
        scale = scale.reshape(-1)
    got = dequantize(q, scale, granularity, torch.float64)
    per_element = dequantize(torch.ones_like(q), scale, granularity, torch.float64)
    saturated = torch.minimum(x.abs(), 448 * per_element) * x.sign()
    assert got.dtype == torch.float64 and got.shape == x.shape
    assert torch.all((got - saturated).abs() <= 2 ** -4 * x.abs() + 2 ** -10 * per_element)
    assert torch.equal(dequantize(q, scale, granularity, torch.bfloat16), got.float().to(torch.bfloat16))
    with pytest.raises(ValueError, match="granularity must be one of"):
        dequantize(q, scale, "col")


def test_strided_and_broadcast_inputs():
    x = activations((40, 300), seed=4)
    for view in (x.t().contiguous().t(), x[:, ::2], torch.randn(300).expand(40, 300)):
        assert_same(quantize(view, "block1x128", E4M3FN, transpose=True),
                    quantize_reference(view, "block1x128", E4M3FN, transpose=True))


@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("fp8", QUANT_DTYPES, ids=str)
def test_a_given_scale_casts_without_the_amax_launch_as_quantize_fp8(x_dtype, fp8, monkeypatch):
    """Delayed scaling's pass: a scale from history, a quarter of this x's amax / fp8_max,
    so the outliers saturate; the transposed copy takes the same scale; no amax launch."""
    x = activations((67, 130), seed=6, dtype=x_dtype)
    scale = (x.float().abs().amax() / torch.finfo(fp8).max / 4).reshape(1)
    monkeypatch.setattr(quantize_kernel._AmaxPass, "__call__", None)    # the amax pass: calling it would fail
    with poisoned_outputs():
        got = quantize(x, "tensor", fp8, transpose=True, scale=scale)
    want, want_scale = quantize_fp8(x, fp8, "tensor", scale=scale.reshape(()))
    assert_same(got, (want, want_scale, want.t().contiguous(), want_scale))
    assert (want.float().abs() == torch.finfo(fp8).max).sum() > 10
    assert_same(quantize(x[:0], "tensor", fp8, scale=scale), (want[:0], want_scale))


@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_the_cast_with_a_given_scale_returns_the_amax_the_torch_pass_gives(x_dtype):
    """Delayed scaling's record: ``amax=True`` appends max |x| from the cast's tile maxima,
    bitwise the torch pass's, on ragged tiles (three by three of 128, the last ones partial),
    with one outlier (the largest finite value of the dtype, negative) in a middle tile, a
    strided view, and an empty x (0); the cast's bytes are those without ``amax``."""
    x = activations((259, 300), seed=7, dtype=x_dtype)
    x[140, 200] = -torch.finfo(x_dtype).max
    scale = torch.rand((), generator=torch.Generator().manual_seed(8)) + 0.5
    for view in (x, x[1::2, ::3], x.t(), x[:0]):
        with poisoned_outputs():
            q, _, q_t, _, amax = quantize(view, "tensor", E4M3FN, transpose=True, scale=scale, amax=True)
        want = view.abs().amax().float() if view.numel() else torch.zeros(())
        assert amax.dtype == torch.float32 and amax.shape == () and amax.view(torch.int32) == want.view(torch.int32)
        assert_same((q, q_t), quantize(view, "tensor", E4M3FN, transpose=True, scale=scale)[::2])


@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16], ids=str)
def test_the_amax_launch_reads_x_only_unless_told_not_to(x_dtype):
    """``amax(x)`` is the torch pass bitwise; ``unless`` > 0 (a non-empty amax history) makes
    its launch read nothing: an x of 5s then gives 0, which no read of it could (tensor's amax
    pass takes the max elementwise, which ignores a NaN: an x of NaN could)."""
    from kernels.gemm_fp8.quantize import amax
    x = activations((131, 257), seed=9, dtype=x_dtype)
    assert amax(x).view(torch.int32) == x.abs().amax().float().view(torch.int32)
    assert amax(x, unless=torch.zeros(1)).view(torch.int32) == x.abs().amax().float().view(torch.int32)
    assert amax(torch.full_like(x, 5.0), unless=torch.tensor(3.0)) == 0
    assert amax(x[:, :0]) == 0
    with pytest.raises(ValueError, match="unless must hold one number"):
        amax(x, unless=torch.ones(2))
    with pytest.raises(ValueError, match="amax=True comes with a given scale"):
        quantize(x, "tensor", E4M3FN, amax=True)


@pytest.mark.parametrize("args,error,match", [
    ((torch.ones(2, 2), "row", E4M3FN, torch.ones(())), ValueError, "granularity 'tensor'"),
    ((torch.ones(2, 2), "tensor", E4M3FN, torch.ones(2)), ValueError, "scale must hold one number"),
    ((torch.ones(2, 2), "tensor", E4M3FN, torch.ones((), dtype=torch.float64)), TypeError, "scale has dtype"),
], ids=["row", "two-numbers", "float64"])
def test_bad_given_scales_are_refused_by_name(args, error, match):
    *rest, scale = args
    with pytest.raises(error, match=match):
        quantize(*rest, scale=scale)


@pytest.mark.parametrize("args,error,match", [
    ((torch.ones(2, 2, 2), "row", E4M3FN), ValueError, "x must be 2-D"),
    ((torch.ones(2, 2, dtype=torch.int32), "row", E4M3FN), TypeError, "x has dtype int32"),
    ((torch.ones(2, 2), "block", E4M3FN), ValueError, "granularity must be one of"),
    ((torch.ones(2, 2), "row", torch.bfloat16), TypeError, "fp8_dtype for granularity 'row'"),
    ((torch.ones(2, 2), "mx32", E4M3FNUZ), TypeError, "OCP formats"),
    ((torch.ones(2, 2, device="meta"), "row", E4M3FN), ValueError, "x is on meta"),
    ((torch.ones(2, 2), "block1x128", E4M3FN, dict(preshuffled=True)), ValueError, "preshuffled .* 'mx32'"),
    ((torch.ones(2, 2), "mx32", E4M3FN, dict(preshuffled=1)), TypeError, "preshuffled must be a bool"),
], ids=["3d", "int", "granularity", "not-fp8", "mx-fnuz", "device", "preshuffled-not-mx", "preshuffled-int"])
def test_bad_inputs_are_refused_by_name(args, error, match):
    *args, options = args if isinstance(args[-1], dict) else (*args, {})
    with pytest.raises(error, match=match):
        quantize(*args, **options)


def test_custom_op_and_compile():
    x = activations((20, 150), seed=5)
    torch.library.opcheck(torch.ops.kernels.quantize_fp8.default, (x, "block1x128", E4M3FN, True),
                          test_utils=("test_faketensor", "test_aot_dispatch_dynamic"))
    torch.library.opcheck(torch.ops.kernels.quantize_fp8.default, (x, "tensor", E4M3FN, True, torch.tensor(0.5)),
                          test_utils=("test_faketensor",))
    torch.library.opcheck(torch.ops.kernels.quantize_fp8.default,   # the fake's tile maxima (delayed's record)
                          (x, "tensor", E4M3FN, False, torch.tensor(0.5), True), test_utils=("test_faketensor",))
    torch.library.opcheck(torch.ops.kernels.quantize_fp8.default,
                          (x, "mx32", E4M3FN, True, None, False, "round_up"), test_utils=("test_faketensor",))
    torch.library.opcheck(torch.ops.kernels.quantize_fp8.default,   # the fake's pre-shuffled shapes
                          (x, "mx32", E4M3FN, True, None, False, "round_up", True), test_utils=("test_faketensor",))
    for rule in ("ocp", "round_up"):
        compiled = torch.compile(lambda t: [o.float().sum() for o in quantize(t, "mx32", E4M3FN, transpose=True,
                                                                                scale_rule=rule)],
                                 fullgraph=True, backend="aot_eager")
        expected = [o.float().sum() for o in quantize(x, "mx32", E4M3FN, transpose=True, scale_rule=rule)]
        assert all(torch.equal(a, b) for a, b in zip(compiled(x), expected))


def test_bytes_moved_is_read_once_write_once():
    m, k = 4096, 8192
    assert bytes_moved((m, k), torch.bfloat16, "block1x128") == m * k * 3 + m * (k // 128) * 4
    assert bytes_moved((m, k), torch.bfloat16, "block1x128", transpose=True) == (
        m * k * 4 + (m * (k // 128) + k * (m // 128)) * 4)
    assert bytes_moved((m, k), torch.bfloat16, "row") == m * k * 5 + m * 4   # the amax pass reads x again
    assert bytes_moved((m, k), torch.bfloat16, "mx32") == m * k * 3 + m * (k // 32)
    # a given scale (delayed): x read once, the scale read, the cast's tile maxima written and reduced
    assert bytes_moved((m, k), torch.bfloat16, "tensor", given_scale=True) == (
        m * k * 3 + 4 + 2 * 4 * (m // 128) * (k // 128) + 4)
    with pytest.raises(ValueError, match="a given scale is one per tensor"):
        bytes_moved((m, k), torch.bfloat16, "row", given_scale=True)
