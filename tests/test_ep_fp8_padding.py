"""The expert-parallel FP8 owner's casts over capacity padding rows: which read them, and why
their amaxes are the real rows'.

With ``ep_capacity`` an owner's rows end in padding (rows past ``offsets[-1]``, in no expert's
group). The grouped GEMMs read no padding row, but a cast that takes a scale from its tensor's
amax reads them all: the per-tensor recipes' casts of the rows x and SwiGLU's output h in the
forward (tensorwise's current amax, delayed's recorded amax and first scale), and in the
backward each output gradient's two casts (down's dy, gate's dg, up's du) and the wgrad
operands' (x, dequantized from the wire under FP8 dispatch, and h). None of them bounds its
read by ``offsets[-1]``: they rely on those rows being exactly 0. That holds by construction,
not by luck of the allocator: x's and dy's padding rows are the sender's explicit zero row,
copied by the all-to-all, which writes every row it delivers (:func:`kernels.moe.ep_exchange.start`;
under FP8 dispatch zero bytes, a zero element times a zero scale); h, dg and du are written 0
there by SwiGLU's kernels bounded on the device (``rows_end``), which read nothing of the
GEMMs' unwritten g, u and dh. This test poisons everything that could break it: every kernel
output starts as NaN (``poisoned_outputs``: the GEMMs' unwritten padding rows of g, u, dh and
dX) and every all-to-all's output buffer starts as all-ones bytes (NaN in every float and FP8
format, e8m0's NaN too) before the collective writes it; then every tensor a cast reads over
all rows has exact zeros past ``offsets[-1]``, for every recipe, 2 chunks, one gloo rank in this
process. (The bound in SwiGLU's kernels is what the test catches if dropped: its padding
rows of h, dg and du turn NaN.)
"""
from __future__ import annotations

import pytest
import torch

import kernels
import kernels.fp8
from kernels.moe import ep_exchange, ep_fp8_layer
from kernels.moe.ep_fp8_layer import Float8ExpertParallelMoE
from kernels.outputs import poisoned_outputs

DIM, HIDDEN, EXPERTS, TOP_K, TOKENS, PADDING = 16, 32, 4, 2, 11, 5


def _poisoned_collective(real):
    """``all_to_all_single`` whose output buffer is all-ones bytes until the collective writes it."""
    def call(output, input, *args, **kwargs):
        output.view(torch.uint8).fill_(0xFF)
        return real(output, input, *args, **kwargs)
    return call


@pytest.mark.parametrize("recipe", ["tensorwise", "delayed", "rowwise", "blockwise", "mxfp8"])
def test_what_the_owners_casts_read_past_the_last_group_is_zero(recipe, one_rank, monkeypatch):
    torch.manual_seed(0)
    ep = kernels.MoE.from_full(kernels.MoE(DIM, HIDDEN, EXPERTS, TOP_K).to(torch.bfloat16), one_rank, ep_chunks=2)
    ep.ep_capacity = TOKENS * TOP_K + PADDING
    layer = kernels.fp8.convert(torch.nn.Sequential(ep), recipe, fp8_dtype=torch.float8_e4m3fn)[0]
    assert isinstance(layer, Float8ExpertParallelMoE)
    read = []   # (what, the tensor a cast reads over all rows, offsets)
    gradients = ep_fp8_layer.gradients
    owner_forward, tokens = ep_fp8_layer._Float8Owner.forward, ep_fp8_layer.token_operand
    wgrad = ep_fp8_layer.wgrad_operand
    chunk = []   # the owner's forward's offsets, while it runs (the sender's token_operand, FP8 dispatch's, reads x)

    def forward_rows(self, rows, offsets, *args):   # its casts: the rows' (once for gate and up), h's
        chunk.append(offsets)
        try:
            return owner_forward(self, rows, offsets, *args)
        finally:
            chunk.pop()

    def token_cast(x, *args, **kwargs):
        if chunk:
            read.append(("forward operand", x.detach().clone(), chunk[-1]))
        return tokens(x, *args, **kwargs)

    def wgrad_rows(x, offsets, *args, **kwargs):   # gate's and up's wgrad operand of the rows, made once
        read.append(("wgrad rows", x.detach().clone(), offsets))
        return wgrad(x, offsets, *args, **kwargs)

    def backward_casts(x, w, offsets, dy, *args, **kwargs):
        if isinstance(x, torch.Tensor):   # (not the rows' wgrad operand, made already)
            read.append(("wgrad x", x.detach().clone(), offsets))
        read.append(("dy", dy.detach().clone(), offsets))
        return gradients(x, w, offsets, dy, *args, **kwargs)

    monkeypatch.setattr(ep_fp8_layer._Float8Owner, "forward", forward_rows)
    monkeypatch.setattr(ep_fp8_layer, "token_operand", token_cast)
    monkeypatch.setattr(ep_fp8_layer, "wgrad_operand", wgrad_rows)
    monkeypatch.setattr(ep_fp8_layer, "gradients", backward_casts)
    monkeypatch.setattr(ep_exchange.dist, "all_to_all_single", _poisoned_collective(ep_exchange.dist.all_to_all_single))
    x = torch.randn(TOKENS, DIM, dtype=torch.bfloat16, requires_grad=True)
    with poisoned_outputs():
        out = layer(x)
        out.backward(torch.randn_like(out))
    # forward, per chunk: h, and the rows without FP8 dispatch (once for gate and up); backward,
    # merged: the rows once (mxfp8: gate's and up's), h, dy, dg and du
    rows = 0 if layer.fp8_dispatch else 1
    assert len(read) == 2 * (1 + rows) + (6 if recipe == "mxfp8" else 5), [what for what, _, _ in read]
    for what, t, offsets in read:
        end = int(offsets[-1])
        assert end < t.shape[0], what   # there is padding
        assert t[:end].isfinite().all(), what
        assert torch.equal(t[end:], torch.zeros_like(t[end:])), (what, t[end:].abs().amax())
    assert out.isfinite().all()
    assert all(p.grad.isfinite().all() for p in (x, layer.gate, layer.up, layer.down))
