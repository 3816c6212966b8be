"""The ISA pages of the rungs a training step launches describe the binary a call runs.

Each case runs a real call under the interpreter, at a preset's shapes scaled down (every
size a multiple of 16 where ``gpu-moe-small``'s and ``gpu-dense-1b``'s are, so each int
argument keeps its class; the operands laid out as the training step lays them out),
records its launches, and asks Triton's JIT (:mod:`launch_classes`) how it would
specialize each argument for gfx942: the class of every int, pointer and constexpr must
be the one the rung's ``aot()`` (what ``workbench.isa`` compiles) gives it. Skipped are
the arguments a target chooses (tiles, warps' shares, a persistent grid's schedule) and
the interpreter's own flags. The blockwise GEMMs' calls (:data:`RECORDED_ONLY`) are recorded,
not run: their 2048-wide operands cost seconds to interpret, and what each of their launches
passes (pointers, sizes, strides, constexprs) comes from shapes and layouts, never from what
an earlier launch wrote (the MoE calls' routing does decide their launches: those run).
"""
from __future__ import annotations

import json

import pytest
import torch

import kernels
from kernels import gemm_fp8, tuning
from kernels.attention import v4_amd_tuned, v5_backward
from kernels.gemm import v6_persistent, wgrad
from kernels.gemm.linear import linear
from kernels.loss import cross_entropy_kernels
from kernels.moe.grouped_gemm import spec as grouped_spec, v4_persistent
from kernels.moe import routing_fused_kernels
from kernels.moe.fp8_layer import Float8MoE
from kernels.moe.layer_ladder import combine_backward, slot_sum, swiglu_backward, swiglu_forward, v3_fused
from kernels.moe.routing_fused import route_fused as routing_fused
from kernels.moe.swiglu_op import swiglu
from kernels.norm import rms_norm_kernels
from kernels.rotary import kernel as rope_kernel
from fp8_recipe_launches import part_of
from launch_classes import differences, recorded_launches
from workbench.train.layers import rope_tables

INTERPRETER_ONLY = ("INTERP_BF16", "S_AS_FORWARD")
ATTENTION_CHOSEN = ("BLOCK_M", "BLOCK_N", "BLOCK_D", "P_BITS", "K_ROWS")   # per target (P_BITS, K_ROWS: CDNA3's)
GEMM_CHOSEN = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "NUM_XCDS", "NUM_PROGS")
HIP = ("hip", "gfx942")

B, S, HQ, HKV, D = 1, 64, 16, 4, 64      # gpu-moe-small: 16 heads, 4 KV heads, head dim 64


def _heads(s: int, h: int) -> torch.Tensor:
    """(B, H, S, D) as the training step's attention gets it: a (B, S, H, D) projection transposed."""
    return torch.randn(B, s, h, D, dtype=torch.bfloat16).transpose(1, 2).requires_grad_()


def attention_dense():
    q, k, v = _heads(S, HQ), _heads(S, HKV), _heads(S, HKV)
    out = kernels.flash_attention(q, k, v, causal=True)
    out.backward(torch.randn(B, S, HQ, D, dtype=torch.bfloat16).transpose(1, 2))


def attention_varlen():
    lengths = torch.tensor([0, 16, 48, 64], dtype=torch.int32)
    q, k, v = (torch.randn(S, h, D, dtype=torch.bfloat16, requires_grad=True) for h in (HQ, HKV, HKV))
    out = kernels.flash_attention_varlen(q, k, v, lengths, lengths, 32, 32, causal=True)
    out.backward(torch.randn_like(out))


def cross_entropy():
    """The training step's loss at its preset's vocabulary (V = 32000: the row passes' blocks are
    chosen from V), 16 rows (R keeps the preset's class), forward and backward."""
    logits = torch.randn(16, cross_entropy_kernels.AOT_SHAPE[1], dtype=torch.bfloat16, requires_grad=True)
    kernels.cross_entropy(logits, torch.randint(0, logits.shape[1], (16,))).backward()


def grouped_gemm_v4():
    """gpu-moe-small's expert GEMM (T·k rows, 32 experts), scaled down; the backward's dX and dW."""
    x, w, offsets = grouped_spec.make_inputs((64, 32, 48, 32, 0), torch.bfloat16)
    x.requires_grad_(), w.requires_grad_()
    y = kernels.get("grouped_gemm", "v4")(x, w, offsets)
    y.backward(torch.randn_like(y))


def moe_v3():
    """gpu-moe-small's MoE layer (32 experts, top-4, a shared expert) as the training step
    builds it, narrower and on 16 tokens; its backward runs v4's kernels and the SwiGLU one."""
    layer = kernels.MoE(64, 32, 32, 4, shared_experts=1, dtype=torch.bfloat16)
    y = layer(torch.randn(1, 16, 64, dtype=torch.bfloat16, requires_grad=True))
    y.backward(torch.randn_like(y))


def moe_v3_master_weights():
    """:func:`moe_v3` as the training step runs it under bf16 autocast: fp32 master expert weights,
    whose gradients the backward's three dW launches write in fp32."""
    layer = kernels.MoE(64, 32, 32, 4, shared_experts=1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(torch.randn(1, 16, 64, dtype=torch.bfloat16, requires_grad=True))
    y.backward(torch.randn_like(y))


def swiglu_unweighted():
    """The expert-parallel owner's launch: weight 1, no h·w."""
    dh, g, u, h = (torch.randn(64, 32, dtype=torch.bfloat16) for _ in range(4))
    swiglu_backward.swiglu_backward(dh, g, u, h, None, swiglu=True, dw_rows=True, weighted_h=False)


def swiglu_fp8_owner():
    """The FP8 expert-parallel owner's launch with capacity: dg and du only, weight 1, the rows
    past the received ones bounded by an int32 on the device."""
    dh, g, u, h = (torch.randn(64, 32, dtype=torch.bfloat16) for _ in range(4))
    swiglu_backward.swiglu_backward(dh, g, u, h, None, swiglu=True, dw_rows=False, weighted_h=False,
                                    rows_end=torch.full((1,), 50, dtype=torch.int32))


def swiglu_float8moe():
    """Float8MoE's SwiGLU (``kernels::swiglu``) on the gate and up GEMMs' contiguous rows."""
    g, u = (torch.randn(64, 32, dtype=torch.bfloat16) for _ in range(2))
    swiglu(g, u)


def float8moe():
    """gpu-moe-small's MoE layer in FP8 (rowwise), narrower and on 16 tokens: its combine
    (the weighted gathering k-sum), the combine's backward and permute's backward."""
    layer = Float8MoE.from_moe(kernels.MoE(64, 32, 32, 4, dtype=torch.bfloat16), "rowwise", FP8)
    y = layer(torch.randn(1, 16, 64, dtype=torch.bfloat16, requires_grad=True))
    y.backward(torch.randn_like(y))


def swiglu_forward_fp8_owner():
    """The FP8 expert-parallel owner's SwiGLU with capacity: the rows past the received ones
    bounded by an int32 on the device."""
    g, u = (torch.randn(64, 32, dtype=torch.bfloat16) for _ in range(2))
    swiglu_forward.swiglu_forward(g, u, rows_end=torch.full((1,), 50, dtype=torch.int32))


def rope():
    """gpu-moe-small's query rotation as the training step calls it (a projection's view,
    rope_tables' cos and sin), and its backward on a gradient laid out as the result."""
    cos, sin = rope_tables(S, D, 10000.0)
    y = kernels.rope(_heads(S, HQ), cos, sin)
    y.backward(torch.randn(B, S, HQ, D, dtype=torch.bfloat16).transpose(1, 2))


def rms_norm(x_dtype: torch.dtype, weight_dtype: torch.dtype, out_dtype: torch.dtype | None = None,
             residual_dtype: torch.dtype | None = None):
    """The training model's norm on (B, S, dim) rows of ``x_dtype``, scaled down (64 wide), forward
    and backward, with a weight of ``weight_dtype`` and y (and dy) of ``out_dtype``; with
    ``residual_dtype``, a block's: ``kernels.add_rms_norm`` of x and a residual of that dtype, h
    used downstream (its gradient comes in)."""
    def call():
        x = torch.randn(2, 32, 64, dtype=x_dtype, requires_grad=True)
        w = torch.randn(64, dtype=weight_dtype, requires_grad=True)
        if residual_dtype is None:
            y = kernels.rms_norm(x, w, 1e-5, out_dtype=out_dtype)
            y.backward(torch.randn_like(y))
            return
        residual = torch.randn(2, 32, 64, dtype=residual_dtype, requires_grad=True)
        h, y = kernels.add_rms_norm(x, residual, w, 1e-5, out_dtype=out_dtype)
        torch.autograd.backward((h, y), (torch.randn_like(h), torch.randn_like(y)))
    return call


def rms_norm_aot(x_dtype: torch.dtype, weight_dtype: torch.dtype, out_dtype: torch.dtype | None = None,
                 residual_dtype: torch.dtype | None = None):
    """Its forward's and backward's AOT launches."""
    return lambda: [rms_norm_kernels.aot(x_dtype, backward=backward, weight_dtype=weight_dtype, out_dtype=out_dtype,
                                         residual_dtype=residual_dtype) for backward in (False, True)]


RMS_NORM_CASES = {"rms_norm": (torch.bfloat16, torch.bfloat16), "rms_norm fp32 weight": (torch.bfloat16, torch.float32),
                  "rms_norm training step": (torch.float32, torch.float32, torch.bfloat16),
                  "add_rms_norm training step": (torch.float32, torch.float32, torch.bfloat16, torch.bfloat16)}
"""x's, the weight's (and y's, and a residual's) dtypes: bf16 throughout, an fp32 master weight
beside bf16 rows, the training step's under autocast (fp32 residual rows and weight, bf16 y and
dy), and its blocks' norms, which add a bf16 branch to those rows first."""


def moe_routing():
    """The MoE layer's routing at the AOT's experts and top_k, 128 tokens (16 programs' partials,
    a multiple of 16 as the AOT's 2048), its weights and aux loss differentiated."""
    _, experts, top_k = routing_fused_kernels.AOT_SHAPE
    logits = torch.randn(128, experts, requires_grad=True)
    weights, _, _, aux = routing_fused(logits, top_k)
    torch.autograd.grad((weights, aux), logits, (torch.randn_like(weights), torch.tensor(1.0)))


def gemm(layout: str, bias: bool = False, tail: bool = False):
    """A projection of the presets', scaled down, whose tiles fill whole waves: 16 of the
    interpreter's 32 x 32 tiles on its 4 programs (DP_TILES a multiple of 16, as whole
    waves of 304 or 256 programs are), no tail split (SPLITS = 1), as in most of a training
    step's GEMMs and in the AOT's. With ``tail``, 2 tiles on 4 programs: each split in two
    along K, which the fix-up adds up."""
    m, n, k = (64, 32, 64) if tail else (128, 128, 64)
    x, w = torch.randn(m, k, dtype=torch.bfloat16), torch.randn(n, k, dtype=torch.bfloat16)
    if bias:
        return lambda: linear(x, w, torch.randn(n, dtype=torch.bfloat16))
    a, b = {"NN": (x, w.t().contiguous()), "NT": (x, w.t()), "TN": (x.t().contiguous().t(), w.t().contiguous())}[layout]
    return lambda: kernels.get("gemm", "v6")(a, b)


def wgrad_fp32(tail: bool = False):
    """A Linear's weight-gradient GEMM for an fp32 master weight under autocast, as its backward
    launches it (``grad_yᵀ @ x``: TN, bf16 operands, fp32 C); the shapes as :func:`gemm`'s."""
    m, n, k = (64, 32, 64) if tail else (128, 128, 64)
    grad_y, x = torch.randn(k, m, dtype=torch.bfloat16), torch.randn(k, n, dtype=torch.bfloat16)
    return lambda: wgrad.matmul_to(grad_y.t(), x, torch.float32)


def v6_aot(layout: str, bias: bool = False, kernel: int = 0, split_tail: bool = False, fp32_c: bool = False):
    """v6's AOT launch ``kernel`` (0 the persistent kernel, of whole tiles or with ``split_tail``
    of a split tail; 1 the fix-up) of ``layout``, storing an fp32 C with ``fp32_c``."""
    return lambda: [v6_persistent.aot(torch.bfloat16, *HIP, {"layout": layout, "HAS_BIAS": bias,
                                                             "split_tail": split_tail, "fp32_c": fp32_c})[kernel]]


FP8 = torch.float8_e4m3fnuz   # gfx942's


def fp8_rowwise(label: str):
    """The rowwise recipe's forward GEMM on rung ``label``: x per row, w per output feature."""
    def call():
        x8, sx, *_ = gemm_fp8.quantize(torch.randn(32, 256, dtype=torch.bfloat16), "row", FP8)
        w8, sw, *_ = gemm_fp8.quantize(torch.randn(64, 256, dtype=torch.bfloat16), "row", FP8)
        kernels.get("gemm_fp8", label)(x8, w8.t(), sx, sw.t())
    return call


def fp8_tensorwise():
    """The tensorwise recipe's forward GEMM (``kernels.matmul_fp8``): one scale per tensor."""
    x8, sx = gemm_fp8.quantize_fp8(torch.randn(32, 256, dtype=torch.bfloat16), FP8)
    w8, sw = gemm_fp8.quantize_fp8(torch.randn(64, 256, dtype=torch.bfloat16), FP8)
    kernels.get("gemm_fp8", "v2")(x8, w8.t(), sx, sw)


def fp8_tensorwise_backward(gemm: str):
    """The tensorwise and delayed recipes' backward GEMMs (``PerTensorRecipe``): dgrad
    ``matmul_fp8(dy8, w8)``, B = w N-contiguous ("NN"), or wgrad ``matmul_fp8(dy8.t(), x8)``, A
    M-contiguous ("TN"); dy in e4m3, the format the table compiles."""
    def call():
        x8, sx = gemm_fp8.quantize_fp8(torch.randn(32, 256, dtype=torch.bfloat16), FP8)
        w8, sw = gemm_fp8.quantize_fp8(torch.randn(64, 256, dtype=torch.bfloat16), FP8)
        dy8, sdy = gemm_fp8.quantize_fp8(torch.randn(32, 64, dtype=torch.bfloat16), FP8)
        kernels.get("gemm_fp8", "v2")(*((dy8, w8, sdy, sw) if gemm == "dgrad" else (dy8.t(), x8, sdy, sx)))
    return call


def fp8_blockwise_dgrad():
    """The blockwise recipe's dgrad: dy per 1 x 128 along N, B = w (N, K) N-contiguous ("NN") in
    its 128 x 128 blocks, read along N; K = N = 2048 (16 scale blocks each way)."""
    dy8, sdy = gemm_fp8.quantize(torch.randn(32, 2048, dtype=torch.bfloat16), "block1x128", FP8)
    w8, sw = gemm_fp8.quantize(torch.randn(2048, 2048, dtype=torch.bfloat16), "block128x128", FP8)
    gemm_fp8.blockwise_matmul(dy8, sdy, w8, sw)


def fp8_v2_aot(binary: str, layout: str):
    """v2's AOT launch of ``binary`` at operand ``layout``, as ``workbench.isa.tune_space`` compiles it."""
    return lambda: kernels.get("gemm_fp8", "v2").aot(FP8, *HIP, {"binary": binary, "layout": layout})


def fp8_blockwise():
    """The blockwise recipe's forward (DeepSeek-V3's scales), K = 2048 (gpu-dense-1b's width:
    16 scale blocks along K; gpu-moe-small's 1024 makes 8, not a multiple of 16)."""
    x = torch.randn(32, 2048, dtype=torch.bfloat16)
    kernels.fp8.get("blockwise").forward(x, torch.randn(128, 2048, dtype=torch.bfloat16), FP8, torch.bfloat16)


def fp8_blockwise_wgrad():
    """The blockwise recipe's weight gradient alone: dy.T per 1 x 128 along the tokens, x per
    128 x 1 (the scales of its transposed copy), 2048 tokens (16 scale blocks along K)."""
    _, _, dyt8, sdyt = gemm_fp8.quantize(torch.randn(2048, 32, dtype=torch.bfloat16), "block1x128", FP8, transpose=True)
    _, _, xt8, sxt = gemm_fp8.quantize(torch.randn(2048, 32, dtype=torch.bfloat16), "block1x128", FP8, transpose=True)
    gemm_fp8.blockwise_matmul(dyt8, sdyt, xt8.t(), sxt.t())


def fp8_harness(label: str):
    """A plain call of rung ``label`` on the harness's inputs at ``make_inputs``' default layout
    ("row": A and B row-major, "NN"), per-row and per-column scales: v1's, v2's rowwise binary."""
    return lambda: kernels.get("gemm_fp8", label)(*kernels.spec("gemm_fp8").make_inputs((32, 64, 256), FP8,
                                                                                        granularity="channel"))


RECORDED_ONLY = {fp8_blockwise, fp8_blockwise_wgrad, fp8_blockwise_dgrad}
"""Dense calls whose launches are recorded with ``stub``: no kernel of theirs runs."""

CASES = {
    "attention forward": (attention_dense, lambda: v4_amd_tuned.aot(torch.bfloat16, *HIP), ATTENTION_CHOSEN),
    "attention backward": (attention_dense, lambda: v5_backward.aot(torch.bfloat16, *HIP), ATTENTION_CHOSEN),
    "attention varlen forward": (attention_varlen, lambda: v4_amd_tuned.aot(torch.bfloat16, *HIP, {"VARLEN": True}),
                                 ATTENTION_CHOSEN),
    "attention varlen backward": (attention_varlen, lambda: v5_backward.aot(torch.bfloat16, *HIP, {"VARLEN": True}),
                                  ATTENTION_CHOSEN),
    "cross entropy": (cross_entropy, lambda: cross_entropy_kernels.aot(torch.bfloat16), ()),
    "moe routing": (moe_routing, routing_fused_kernels.aot, ()),
    "grouped gemm v4": (grouped_gemm_v4, lambda: v4_persistent.aot(torch.bfloat16, *HIP), GEMM_CHOSEN),
    "moe v3": (moe_v3, lambda: v3_fused.aot(torch.bfloat16, *HIP), GEMM_CHOSEN),
    # v3's backward runs v4's kernels: dH and the gate's and up's dX on wᵀ, the three dW
    "moe v3 backward grouped gemm": (moe_v3, lambda: v4_persistent.aot(torch.bfloat16, *HIP)[1:], GEMM_CHOSEN),
    "moe v3 backward fp32 dW": (moe_v3_master_weights, lambda: v4_persistent.aot(
        torch.bfloat16, *HIP, {"kernel": "dw", "fp32_dw": True}), GEMM_CHOSEN),
    "moe v3 swiglu backward": (moe_v3, lambda: [swiglu_backward.aot(torch.bfloat16)], ("BLOCK_R", "BLOCK_H")),
    "swiglu backward unweighted": (swiglu_unweighted, lambda: [swiglu_backward.aot(torch.bfloat16, weighted=False)],
                                   ("BLOCK_R", "BLOCK_H")),
    "swiglu backward fp8 owner": (swiglu_fp8_owner, lambda: [swiglu_backward.aot(torch.bfloat16, fp8_owner=True)],
                                  ("BLOCK_R", "BLOCK_H")),
    "swiglu forward": (swiglu_float8moe, lambda: [swiglu_forward.aot(torch.bfloat16)], ("BLOCK_R", "BLOCK_H")),
    "swiglu forward fp8 owner": (swiglu_forward_fp8_owner, lambda: [swiglu_forward.aot(torch.bfloat16, bounded=True)],
                                 ("BLOCK_R", "BLOCK_H")),
    "rope forward and backward": (rope, lambda: [rope_kernel.aot(torch.bfloat16, D),
                                                 rope_kernel.aot(torch.bfloat16, D, inverse=True)], ()),
    **{name: (rms_norm(*dtypes), rms_norm_aot(*dtypes), ("BLOCK_R", "BLOCK_N")) for name, dtypes in RMS_NORM_CASES.items()},
    # forward's combine (weighted), then permute's backward (weight 1)
    "float8moe k-sums": (float8moe, lambda: [slot_sum.aot(torch.bfloat16),
                                             slot_sum.aot(torch.bfloat16, weighted=False)], ("BLOCK_T", "BLOCK_D")),
    "float8moe combine backward": (float8moe, lambda: [combine_backward.aot(torch.bfloat16)], ("BLOCK_R", "BLOCK_H")),
    **{f"gemm v6 {layout}": (gemm(layout), v6_aot(layout), GEMM_CHOSEN) for layout in ("NN", "NT", "TN")},
    "gemm v6 bias": (gemm("NT", bias=True), v6_aot("NT", bias=True), GEMM_CHOSEN),
    "gemm v6 split tail": (gemm("NT", tail=True), v6_aot("NT", split_tail=True), GEMM_CHOSEN),
    "gemm v6 split tail fix-up": (gemm("NT", tail=True), v6_aot("NT", kernel=1), GEMM_CHOSEN),
    "gemm v6 split tail fix-up, bias": (gemm("NT", bias=True, tail=True), v6_aot("NT", bias=True, kernel=1),
                                        GEMM_CHOSEN),
    "gemm v6 wgrad fp32": (wgrad_fp32(), v6_aot("TN", fp32_c=True), GEMM_CHOSEN),
    "gemm v6 wgrad fp32 fix-up": (wgrad_fp32(tail=True), v6_aot("TN", kernel=1, fp32_c=True), GEMM_CHOSEN),
    **{f"gemm_fp8 {label} rowwise": (fp8_rowwise(label), lambda label=label: kernels.get("gemm_fp8", label).aot(
        FP8, *HIP), GEMM_CHOSEN) for label in ("v0", "v1")},
    # v2's launches: the blockwise recipe's scales, then the rowwise recipe's (constant along K)
    "gemm_fp8 v2 blockwise": (fp8_blockwise, lambda: kernels.get("gemm_fp8", "v2").aot(FP8, *HIP)[:1], GEMM_CHOSEN),
    "gemm_fp8 v2 rowwise": (fp8_rowwise("v2"), lambda: kernels.get("gemm_fp8", "v2").aot(FP8, *HIP)[1:], GEMM_CHOSEN),
    "gemm_fp8 v2 tensorwise": (fp8_tensorwise, lambda: kernels.get("gemm_fp8", "v2").aot(
        FP8, *HIP, {"binary": "v2_tensorwise"}), GEMM_CHOSEN),
    "gemm_fp8 v2 blockwise wgrad": (fp8_blockwise_wgrad, lambda: kernels.get("gemm_fp8", "v2").aot(
        FP8, *HIP, {"binary": "v2_blockwise_128x1"}), GEMM_CHOSEN),
    # the backward's other operand layouts, compiled for the FP8 table
    "gemm_fp8 v2 tensorwise dgrad": (fp8_tensorwise_backward("dgrad"), fp8_v2_aot("v2_tensorwise", "NN"), GEMM_CHOSEN),
    "gemm_fp8 v2 tensorwise wgrad": (fp8_tensorwise_backward("wgrad"), fp8_v2_aot("v2_tensorwise", "TN"), GEMM_CHOSEN),
    "gemm_fp8 v2 blockwise dgrad": (fp8_blockwise_dgrad, fp8_v2_aot("v2_blockwise", "NN"), GEMM_CHOSEN),
    # plain calls' row-major operands (the harness's default layout), compiled for the FP8 table
    "gemm_fp8 v1 NN": (fp8_harness("v1"), lambda: kernels.get("gemm_fp8", "v1").aot(
        FP8, *HIP, {"binary": "v1", "layout": "NN"}), GEMM_CHOSEN),
    "gemm_fp8 v2 rowwise NN": (fp8_harness("v2"), fp8_v2_aot("v2_rowwise", "NN"), GEMM_CHOSEN),
}


_LAUNCHES: dict = {}
"""Per call function, its recorded launches: several cases compare other kernels of one call
(attention's forward and backward, the MoE layers' kernels), which runs once for all of them."""


def _launches_of(call) -> list:
    """The launches of ``call`` (:func:`recorded_launches`), recorded the first time a case asks.
    A launch's argument classes are those of its ints, pointers and constexprs, which the same
    call on inputs of the same shapes gives again; its tensors stay alive here, their pointers
    valid for the comparison."""
    if call not in _LAUNCHES:
        with pytest.MonkeyPatch.context() as patch, \
                recorded_launches(patch, stub=call in RECORDED_ONLY) as launches:
            call()
        _LAUNCHES[call] = launches
    return _LAUNCHES[call]


@pytest.mark.parametrize("case", CASES)
def test_the_aot_launch_specializes_every_argument_as_a_call_does(case, monkeypatch):
    """The k-th AOT launch of a kernel against the call's k-th launch of it where both launch
    it as often (v4's forward and dX), else each against every one (the backward's three dW)."""
    call, aot, chosen = CASES[case]
    launches = _launches_of(call)
    compiled = aot()
    assert compiled, f"{case}: no AOT launch to compare"
    found = {}
    for index, launch in enumerate(compiled):
        ran = [recorded for recorded in launches if recorded[0] is launch.jit_fn]
        assert ran, f"the call never launched {launch.jit_fn.__name__}"
        same = [other for other in compiled if other.jit_fn is launch.jit_fn]
        pairs = [ran[same.index(launch)]] if len(ran) == len(same) else ran
        for recorded in pairs:
            found[launch.jit_fn.__name__, index] = differences(recorded, launch, monkeypatch,
                                                               chosen + INTERPRETER_ONLY)
            if found[launch.jit_fn.__name__, index]:
                break
    assert found == {key: {} for key in found}


def fp8_blockwise_one_k_block(gemm: str):
    """The blockwise recipe's dgrad of a layer with 128 outputs, or its forward of one with 128
    inputs: K = 128, one scale block along K (A's scales (M, 1), B's (1, N/128): strides 0 along K)."""
    def call():
        a8, sa = gemm_fp8.quantize(torch.randn(32, 128, dtype=torch.bfloat16), "block1x128", FP8)
        if gemm == "dgrad":
            w8, sw = gemm_fp8.quantize(torch.randn(128, 2048, dtype=torch.bfloat16), "block128x128", FP8)
            return gemm_fp8.blockwise_matmul(a8, sa, w8, sw)
        w8, sw = gemm_fp8.quantize(torch.randn(2048, 128, dtype=torch.bfloat16), "block128x128", FP8)
        return gemm_fp8.blockwise_matmul(a8, sa, w8.t(), sw.t())
    return call


@pytest.mark.parametrize("gemm", ["dgrad", "forward"])
def test_block_scales_of_one_k_block_launch_the_constexprs_their_binary_was_compiled_with(gemm, monkeypatch):
    """B's 128 x 128 blocks with one block along K: the launch tunes as a part the table compiled
    (its tuning key names the binary and layout) and runs the ``GROUP_N`` and ``SCALES_ALONG_K``
    that part's AOT launch was compiled with. Its scale strides are of another class than the
    AOT's (a scale tensor of one column: stride 1, folded), as a shape's may be."""
    with tuning.recording() as seen, recorded_launches(monkeypatch, stub=True) as launches:
        fp8_blockwise_one_k_block(gemm)()
    key, = [json.loads(text) for op, text in seen if op == "gemm_fp8/v2"]
    part = part_of(key)
    assert part in gemm_fp8.configs.PARTS.values()
    aot, = fp8_v2_aot(*part)()
    (fn, args), = [launch for launch in launches if launch[0] is aot.jit_fn]   # not the quantizations'
    ran = dict(zip(fn.arg_names, args))
    assert {name: ran[name] for name in ("SCALE_K", "GROUP_N", "SCALES_ALONG_K")} == \
        {name: aot.constexprs[name] for name in ("SCALE_K", "GROUP_N", "SCALES_ALONG_K")}
