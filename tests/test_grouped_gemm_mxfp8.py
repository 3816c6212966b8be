"""MXFP8 grouped GEMM: every rung by the harness rule; the public op and training (recipe
"mxfp8" of ``grouped_gemm_fp8_train``) against the float64 product of the same MX operands
(tight) and of the unquantized ones (loose), at odd shapes (K and N not multiples of 32,
empty and one-row groups, groups spanning several tiles); the wgrad copy's 32-token blocks
never straddle groups; bad inputs; no host sync; custom ops under opcheck and
torch.compile; the launches' machine code on gfx950 (scaled MFMA) and gfx942 (emulated).
"""
from __future__ import annotations

import pytest
import torch

import kernels
from grouped_fp8_training import close
from host_sync import no_host_sync
from kernels.gemm_fp8.quantize_ref import quantize_one
from kernels.gemm_mxfp4.spec import dequantize
from kernels.moe.grouped_gemm import spec as grouped_spec
from kernels.moe.grouped_gemm_fp8 import grouped_gemm_fp8_train
from kernels.moe.grouped_gemm_mxfp8 import dw as dw_module
from kernels.moe.grouped_gemm_mxfp8 import grouped_gemm_mxfp8_dw, quantize, v0_one_launch
from kernels.moe.grouped_gemm_mxfp8.spec import quantize_weight
from kernels.outputs import poisoned_outputs
from workbench import isa
from workbench.check import check_rung
from workbench.isa import parse as isa_parse

E4M3FN = torch.float8_e4m3fn
SPEC = kernels.spec("grouped_gemm_mxfp8")
RUNGS = [r for r in kernels.variants("grouped_gemm_mxfp8") if r.runs_here()]
grouped_gemm_mxfp8 = kernels.grouped_gemm_mxfp8   # also registers torch.ops.kernels.grouped_gemm_mxfp8
SIZES = [7, 75, 0, 1, 40]    # unaligned starts, a group over two 64-token tiles, empty, one row
K, N = 37, 23                # K and N end inside a 32-element scale block


def _problem(sizes=SIZES, k=K, n=N, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    t = sum(sizes)
    x = torch.randn(t, k, generator=gen) * torch.randn(t, 1, generator=gen).exp()
    w = torch.randn(len(sizes), k, n, generator=gen) * torch.randn(len(sizes), 1, n, generator=gen).exp()
    dy = torch.randn(t, n, generator=gen) * torch.randn(1, n, generator=gen).exp()
    offsets = grouped_spec.offsets_from_sizes(torch.tensor(sizes, dtype=torch.int64))
    return x.to(dtype), w.to(dtype), dy.to(dtype), offsets


@pytest.mark.parametrize("rung", RUNGS, ids=lambda r: r.title)
def test_every_rung_passes_the_harness_at_smoke_shapes(rung):
    """Poisoned outputs, fresh inputs; one row, G = 1, every routing, empty groups, K of 16
    to 48 (partial scale blocks); both weight layouts."""
    for shape in SPEC.smoke_shapes:
        for seed, layout in ((0, "col"), (1, "row")):
            report = check_rung(rung, shape, E4M3FN, seed=seed, layout=layout)
            assert report.passed, report.message


def test_public_op_matches_the_dequantized_and_the_unquantized_product():
    x, w, _, offsets = _problem()
    (x8, sx), (w8, sw) = quantize_one(x, "mx32", E4M3FN), quantize_weight(w)
    with poisoned_outputs():
        out = grouped_gemm_mxfp8(x8, sx, w8, sw, offsets, torch.float32)
    close(out, SPEC.reference(x8, sx, w8, sw, offsets), 1e-5)        # fp32 accumulation only
    close(out, grouped_spec.reference(x.double(), w.double(), offsets), 0.1)   # + e4m3 rounding
    # every operand read through its strides: column-major x and scales give the same bits
    strided = [t.t().contiguous().t() for t in (x8, sx)] + [t.transpose(1, 2).contiguous().transpose(1, 2)
                                                            for t in (w8, sw)]
    assert strided[1].stride(0) == 1 and strided[3].stride(1) == 1
    assert torch.equal(grouped_gemm_mxfp8(*strided, offsets, torch.float32), out)


def test_make_inputs_scale_every_32_elements_along_k():
    x, sx, w, sw, offsets = SPEC.make_inputs((37, 40, 24, 4, 1), seed=2)
    assert (x.dtype, w.dtype, sx.dtype, sx.shape, sw.shape) == (E4M3FN, E4M3FN, torch.uint8, (37, 2), (4, 24, 2))
    assert w.stride(1) == 1 and int(offsets[-1]) == 37          # K-contiguous experts
    assert len(set(sx.flatten().tolist())) > 1 and len(set(sw.flatten().tolist())) > 1
    assert SPEC.bytes_moved((8, 40, 2, 3, 0)) == (8 + 3 * 2) * (40 + 2) + 8 * 2 * 2


def _args(**change):
    x, sx, w, sw, offsets = SPEC.make_inputs((9, 40, 6, 2, 0))
    return {**dict(x=x, sx=sx, w=w, sw=sw, offsets=offsets), **change}


@pytest.mark.parametrize("change,error,match", [
    (dict(x=torch.randn(9, 40).to(torch.float8_e4m3fnuz)), TypeError, "x has dtype float8_e4m3fnuz"),
    (dict(sx=torch.ones(9, 1, dtype=torch.uint8)), ValueError, r"sx has shape \(9, 1\); expected \(9, 2\)"),
    (dict(sx=torch.ones(9, 2)), TypeError, "sx has dtype float32"),
    (dict(sw=torch.ones(2, 2, 6, dtype=torch.uint8)), ValueError, r"sw has shape \(2, 2, 6\); expected \(2, 6, 2\)"),
    (dict(offsets=torch.tensor([4, 9])), TypeError, "offsets must be int32"),
    (dict(offsets=torch.tensor([5, 2], dtype=torch.int32)), ValueError, "non-decreasing"),
    (dict(out_dtype=torch.int8), TypeError, "out_dtype"),
], ids=["x-fnuz", "sx-shape", "sx-fp32", "sw-shape", "offsets-int64", "decreasing", "out-int8"])
def test_bad_inputs_are_refused_by_name(change, error, match):
    args = _args(**change)
    for fn in (*RUNGS, grouped_gemm_mxfp8):
        with pytest.raises(error, match=match):
            fn(**args)


def test_empty_operands_give_empty_results_or_zeros():
    for sizes, k, n in (([0, 0], 5, 3), ([2, 1], 0, 3), ([2, 1], 5, 0), ([], 5, 3)):
        t, g, blocks = sum(sizes), len(sizes), -(-k // 32)
        out = grouped_gemm_mxfp8(torch.zeros(t, k, dtype=E4M3FN), torch.zeros(t, blocks, dtype=torch.uint8),
                                 torch.zeros(g, k, n, dtype=E4M3FN), torch.zeros(g, n, blocks, dtype=torch.uint8),
                                 grouped_spec.offsets_from_sizes(torch.tensor(sizes, dtype=torch.int64)))
        assert torch.equal(out, torch.zeros(t, n, dtype=torch.bfloat16))


@pytest.mark.parametrize("rule", ["ocp", "round_up"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_token_operands_and_dgrads_weight_are_the_dense_fused_mx32_bit_for_bit(dtype, rule):
    """x, dy (T, C) and w as G·K rows of N are the dense op's ``mx32`` layout: one fused
    launch each (no plain pass), bit for bit ``quantize_one`` (C = 37 and 23, not multiples
    of 32; T = 0), into poisoned outputs, by either e8m0 rule."""
    from fp8_quantizations import quantizations
    x, w, dy, _ = _problem(dtype=dtype)
    for t in (x, dy, x[:0]):
        with poisoned_outputs(), quantizations() as seen:
            q, scales = quantize.tokens(t, E4M3FN, rule)
        want_q, want_scales = quantize_one(t, "mx32", E4M3FN, rule)
        assert [kind for kind, _, _ in seen] == ["fused"]
        assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8)) and torch.equal(scales, want_scales)
    with poisoned_outputs():
        wt8, swt = quantize.dgrad_weight(w, E4M3FN, rule)
    g, k, n = w.shape
    want_q, want_scales = quantize_one(w.reshape(g * k, n), "mx32", E4M3FN, rule)
    assert torch.equal(wt8.transpose(1, 2).reshape(g * k, n).view(torch.uint8), want_q.view(torch.uint8))
    assert torch.equal(swt, want_scales.reshape(g, k, -1))


def _expected(x, w, dy, offsets, rule):
    """float64 forward, dx and dw of the MX operands each GEMM gets from :mod:`.quantize` by
    the e8m0 rule ``rule``."""
    x8, sx = quantize.tokens(x, E4M3FN, rule)
    y = SPEC.reference(x8, sx, *quantize.forward_weight(w, E4M3FN, rule), offsets)
    dy8, sdy = quantize.tokens(dy, E4M3FN, rule)
    wt8, swt = quantize.dgrad_weight(w, E4M3FN, rule)
    dx = grouped_spec.reference(dequantize(dy8, sdy), dequantize(wt8.transpose(1, 2).reshape(-1, w.shape[2]),
                                                                 swt.reshape(-1, swt.shape[2]))
                                .reshape(w.shape).transpose(1, 2), offsets)
    ends = quantize.padded_ends(offsets)
    xt = dequantize(*quantize.wgrad_operand(x, offsets, ends, E4M3FN, rule))
    dyt = dequantize(*quantize.wgrad_operand(dy, offsets, ends, E4M3FN, rule))
    dw = torch.stack([xt[:, s:e] @ dyt[:, s:e].t() for s, e in grouped_spec.group_bounds(ends)])
    return y, dx, dw


@pytest.mark.parametrize("rule", [None, "ocp"], ids=["recipe's rule", "ocp"])
@pytest.mark.parametrize("dtype,rtol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)], ids=str)
def test_training_forward_and_both_gradients(dtype, rtol, rule):
    """Every operand by the call's e8m0 rule: the ``mxfp8`` recipe's round-up unless another is
    given (here the OCP rule)."""
    x, w, dy, offsets = _problem(dtype=dtype)
    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
    with poisoned_outputs():
        y = grouped_gemm_fp8_train(xg, wg, offsets, "mxfp8", scale_rule=rule)    # OCP e4m3fn by default
        y.backward(dy)
    for got, want in zip((y, xg.grad, wg.grad), _expected(x, w, dy, offsets, rule or "round_up")):
        assert got.dtype == dtype and got.shape == want.shape
        close(got, want, rtol)      # fp32 accumulation, one rounding to the output's dtype
    assert torch.equal(wg.grad[2], torch.zeros(K, N, dtype=dtype))     # the empty group's expert
    # against the unquantized GEMM: e4m3 rounding only (2^-4 per element, averaged over sums)
    x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
    grouped_spec.reference(x64, w64, offsets).backward(dy.double())
    for got, want in ((xg.grad, x64.grad), (wg.grad, w64.grad)):
        assert (got.double() - want).norm() <= 0.1 * want.norm()


def test_wgrad_blocks_never_straddle_groups():
    """Each group's tokens start at a multiple of 32 with zeros up to the next: its blocks'
    scales are those of the group's tokens alone, and the padding is zero."""
    x, _, _, offsets = _problem()
    ends = quantize.padded_ends(offsets)
    assert ends.tolist() == [32, 128, 128, 160, 224]
    q, scales = quantize.wgrad_operand(x, offsets, ends, E4M3FN)
    assert q.shape == (K, 288) and q.stride(1) == 1      # T + 31 G = 278, rounded up to 32
    for (s, e), (ps, pe) in zip(grouped_spec.group_bounds(offsets), grouped_spec.group_bounds(ends)):
        alone_q, alone_s = quantize_one(x[s:e].t(), "mx32", E4M3FN)
        assert torch.equal(q[:, ps:ps + e - s].view(torch.uint8), alone_q.view(torch.uint8))
        assert torch.equal(scales[:, ps // 32:pe // 32], alone_s)
        assert not q[:, ps + e - s:pe].view(torch.uint8).any()
    assert not q[:, 224:].view(torch.uint8).any()


def test_dw_op_zeroes_the_next_groups_tokens_in_a_partial_tile():
    """A partial last tile (the interpreter's tiles are 64 tokens) loads past its group's
    end: group 0's second tile reaches group 2's token, group 3's reaches the NaN bytes past
    the last end. Neither may reach the product."""
    gen = torch.Generator().manual_seed(4)
    k, n, ends = 19, 21, torch.tensor([96, 96, 128, 224], dtype=torch.int32)
    xt, dyt = torch.zeros(k, 256, dtype=torch.uint8), torch.zeros(n, 256, dtype=torch.uint8)
    for s, e in [(0, 90), (96, 97), (128, 224)]:    # each group's tokens; zeros to its padded end
        xt[:, s:e] = (torch.randn(k, e - s, generator=gen) * 50).to(E4M3FN).view(torch.uint8)
        dyt[:, s:e] = (torch.randn(n, e - s, generator=gen) * 50).to(E4M3FN).view(torch.uint8)
    xt[:, 224:], dyt[:, 224:] = 0x7F, 0x7F             # e4m3fn NaN
    xt, dyt = xt.view(E4M3FN), dyt.view(E4M3FN)
    sxt = torch.randint(120, 134, (k, 8), generator=gen, dtype=torch.uint8)
    sdyt = torch.randint(120, 134, (n, 8), generator=gen, dtype=torch.uint8)
    with poisoned_outputs():
        dw = grouped_gemm_mxfp8_dw(xt, sxt, dyt, sdyt, ends)
    xd, dyd = dequantize(xt, sxt), dequantize(dyt, sdyt)
    expected = torch.stack([xd[:, s:e] @ dyd[:, s:e].t() for s, e in grouped_spec.group_bounds(ends)])
    close(dw, expected, 1e-6)
    assert torch.equal(dw[1], torch.zeros(k, n))


@pytest.mark.parametrize("change,error,match", [
    (dict(ends=torch.tensor([40, 64], dtype=torch.int32)), ValueError, "multiples of 32"),
    (dict(ends=torch.tensor([64, 32], dtype=torch.int32)), ValueError, "non-decreasing"),
    (dict(ends=torch.tensor([32, 96], dtype=torch.int32)), ValueError, r"in \[0, 64\]"),
    (dict(dyt=torch.zeros(3, 32, dtype=E4M3FN)), ValueError, "one token count"),
    (dict(sxt=torch.zeros(4, 1, dtype=torch.uint8)), ValueError, r"sxt has shape \(4, 1\); expected \(4, 2\)"),
    (dict(xt=torch.zeros(4, 64, dtype=torch.float8_e5m2)), TypeError, "xt has dtype float8_e5m2"),
], ids=["unaligned", "decreasing", "past-R", "tokens", "scales", "e5m2"])
def test_dw_op_refuses_bad_operands(change, error, match):
    args = {**dict(xt=torch.zeros(4, 64, dtype=E4M3FN), sxt=torch.zeros(4, 2, dtype=torch.uint8),
                   dyt=torch.zeros(3, 64, dtype=E4M3FN), sdyt=torch.zeros(3, 2, dtype=torch.uint8),
                   ends=torch.tensor([32, 64], dtype=torch.int32)), **change}
    with pytest.raises(error, match=match):
        grouped_gemm_mxfp8_dw(**args)


def test_training_refuses_a_format_mx_does_not_have():
    x, w, _, offsets = _problem([3, 2], k=8, n=4)
    with pytest.raises(TypeError, match="mxfp8 recipe's elements are float8_e4m3fn"):
        grouped_gemm_fp8_train(x, w, offsets, "mxfp8", torch.float8_e4m3fnuz)


def test_one_backward_is_two_grouped_launches_and_reads_nothing_on_the_host(monkeypatch):
    launches = []
    forward, dw = v0_one_launch.grouped_mm_mxfp8, dw_module.grouped_dw_mxfp8
    monkeypatch.setattr(v0_one_launch, "grouped_mm_mxfp8", lambda *a: launches.append("mm") or forward(*a))
    monkeypatch.setattr(dw_module, "grouped_dw_mxfp8", lambda *a: launches.append("dw") or dw(*a))
    x, w, dy, offsets = _problem([5, 0, 30], k=8, n=5)
    x.requires_grad_(), w.requires_grad_()
    with no_host_sync():
        y = grouped_gemm_fp8_train(x, w, offsets, "mxfp8", check_offsets=False)
        assert launches == ["mm"]
        y.backward(dy)
    assert launches == ["mm", "mm", "dw"]       # forward; dX (the forward kernel on wᵀ), dW


def test_custom_ops_and_compile_without_graph_breaks():
    x, w, dy, offsets = _problem([3, 0, 6], k=8, n=5)
    args = (*quantize.tokens(x, E4M3FN), *quantize.forward_weight(w, E4M3FN), offsets)
    ends = quantize.padded_ends(offsets)
    dw_args = (*quantize.wgrad_operand(x, offsets, ends, E4M3FN), *quantize.wgrad_operand(dy, offsets, ends, E4M3FN),
               ends, torch.float32)
    # test_schema left out as for kernels::grouped_gemm_fp8: it needs a float8 torch.allclose
    for op, op_args in ((torch.ops.kernels.grouped_gemm_mxfp8.default, (*args, torch.bfloat16)),
                        (torch.ops.kernels.grouped_gemm_mxfp8_dw.default, dw_args)):
        torch.library.opcheck(op, op_args, test_utils=("test_faketensor", "test_aot_dispatch_dynamic"))

    def step(x, w):
        return (grouped_gemm_fp8_train(x, w, offsets, "mxfp8", check_offsets=False) * dy).sum()

    x.requires_grad_(), w.requires_grad_()
    explained = torch._dynamo.explain(step)(x, w)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    for eager, traced in zip(*[torch.autograd.grad(fn(x, w), (x, w)) for fn in (step, compiled)]):
        assert torch.equal(eager, traced)


KERNELS = {"forward": "_grouped_gemm_mxfp8_kernel", "dx": "_grouped_gemm_mxfp8_kernel",
           "dw": "_grouped_dw_mxfp8_kernel"}


def _reports(target):
    return dict(zip(KERNELS, isa.inspect_all("grouped_gemm_mxfp8", "v0", target)))


def _loop_ops(report):
    return [m for m in map(isa_parse.mnemonic, report.hot_loop.splitlines()) if m]


@pytest.mark.parametrize("kernel", KERNELS)
def test_gfx950_runs_the_scaled_mfma_without_spills(kernel):
    """The training step's three launches on CDNA4's scaled MFMA, 16-byte operand loads,
    no VGPR or SGPR spills, occupancy reported. The scale bytes pass through LDS in 8-bit
    accesses (the docstring of v0 says so; this pins it)."""
    report = _reports("gfx950")[kernel]
    ops = _loop_ops(report)
    assert report.kernel_name == KERNELS[kernel]
    assert set(report.matrix_instructions) == {"v_mfma_scale_f32_16x16x128_f8f6f4"}, report.summary()
    assert (report.spills, report.sgpr_spills, report.scratch_bytes) == (0, 0, 0), report.summary()
    assert report.occupancy.value >= 1 and report.occupancy.limited_by
    assert "buffer_load_dwordx4" in ops and "buffer_load_ubyte" in ops
    assert {"ds_write_b8", "ds_read_u8"} <= set(ops) and report.narrow_lds_ops > 0


@pytest.mark.parametrize("kernel", KERNELS)
def test_gfx942_emulates_on_bf16_mfma_without_spills(kernel):
    """CDNA3 has no scaled MFMA: Triton scales the operands in registers and runs bf16 MFMAs
    (half the FP8 rate); at a K step of 64 nothing spills and no LDS access is narrow."""
    report = _reports("gfx942")[kernel]
    assert set(report.matrix_instructions) == {"v_mfma_f32_16x16x16_bf16"}, report.summary()
    assert "mfma_scale" not in report.asm
    assert (report.spills, report.sgpr_spills, report.scratch_bytes, report.narrow_lds_ops) == (0, 0, 0, 0)
    assert report.occupancy.value >= 1


@pytest.mark.slow   # two more compiles of the three launches: about 30 s on 2 busy cores
def test_the_k_step_is_what_selects_the_scaled_mfma_and_what_keeps_gfx942_from_spilling():
    """:mod:`kernels.moe.grouped_gemm_mxfp8.tile`'s choice: at a K step of 64 gfx950 emulates
    too; at 128 gfx942 spills SGPRs and reads scale bytes from LDS 16 bits at a time."""
    shallow = isa.inspect("grouped_gemm_mxfp8", "v0", "gfx950", overrides={"BLOCK_K": 64})
    assert "mfma_scale" not in shallow.asm and all("bf16" in m for m in shallow.matrix_instructions)
    deep = isa.inspect("grouped_gemm_mxfp8", "v0", "gfx942", overrides={"BLOCK_K": 128})
    assert deep.sgpr_spills > 0 and "ds_read_u16" in _loop_ops(deep), deep.summary()
