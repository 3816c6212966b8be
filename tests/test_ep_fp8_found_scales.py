"""What the expert-parallel FP8 owner finds once: under tensorwise the scales of the rows and the
weights, which its merged backward takes from the forward (bit for bit the gradients of a backward
that finds them again, and that many amax launches fewer); under delayed the weights' amaxes, from
their one cast a forward, and each chunk's rows' from their one cast for gate and up (the histories
and gradients unchanged:
tests/test_ep_fp8_delayed_dy.py and tests/test_fp8_recompute.py hold them to Float8MoE's). One
in-process gloo rank."""
from __future__ import annotations

import pytest
import torch

import kernels
from kernels.moe import ep_fp8_layer
from kernels.moe.ep_fp8_layer import Float8ExpertParallelMoE
from workbench.harness.device_ops import device_ops

FP8, GRAD = torch.float8_e4m3fn, torch.float8_e5m2
DIM, HIDDEN, EXPERTS, TOP_K, TOKENS = 16, 32, 4, 3, 9   # 27 rows; two chunks of 15 and 12
EMPTY = EXPERTS - 1   # the expert no token picks


def _layer(group, chunks: int, capacity: int | None, recipe: str = "tensorwise") -> Float8ExpertParallelMoE:
    """A one-rank expert-parallel layer whose router never picks :data:`EMPTY` for a token of
    positive features (its router row negative, the others positive)."""
    torch.manual_seed(0)
    full = kernels.MoE(DIM, HIDDEN, EXPERTS, TOP_K)
    with torch.no_grad():
        full.router.weight.abs_()[EMPTY].neg_()
    ep = kernels.MoE.from_full(full, group, ep_chunks=chunks)
    ep.ep_capacity = capacity
    return Float8ExpertParallelMoE.from_ep(ep, recipe, FP8, GRAD)


def _tokens(zero_chunk: bool, tokens: int = TOKENS) -> torch.Tensor:
    """Positive tokens; with ``zero_chunk`` the second chunk's all 0 (its rows' amax 0, scale 1)."""
    x = torch.rand(tokens, DIM, generator=torch.Generator().manual_seed(1)) + 0.1
    if zero_chunk:
        x[tokens - tokens // 2:] = 0
    return x.requires_grad_()


CASES = [(TOKENS, 1, None, False), (TOKENS, 2, None, False), (TOKENS, 2, None, True),
         (TOKENS, 2, TOKENS * TOP_K + 5, False), (1, 2, None, False), (1, 2, TOP_K + 2, False)]
"""(tokens, ep_chunks, ep_capacity, the second chunk's rows all 0); one token in two chunks leaves
the second chunk no rows (with capacity, only padding rows)."""


@pytest.mark.parametrize("tokens, chunks, capacity, zero_chunk", CASES)
def test_tensorwise_backward_takes_the_forward_s_scales_bit_for_bit(one_rank, monkeypatch, tokens, chunks,
                                                                    capacity, zero_chunk):
    """The forward's GEMMs take the scales the owner found, with the bits of casts that find their own;
    each expert GEMM's gradients get them (the rows' over all chunks, the weight's), and give the bits
    of today's backward, which finds them again (scales None): odd row
    counts, an empty expert, capacity padding, a chunk whose rows are all 0 (whose scale of 1 is no
    candidate for the max: the scale is of the largest amax, not the largest scale), a chunk with
    no rows."""
    layer = _layer(one_rank, chunks, capacity)
    calls, real = [], ep_fp8_layer.gradients

    def spy(*args, **kwargs):
        calls.append((args, kwargs))
        return real(*args, **kwargs)

    grouped, gemm, forwards = Float8ExpertParallelMoE._grouped, ep_fp8_layer._Float8Owner._gemm, []
    cast_rows, rows = ep_fp8_layer.token_operand, []

    def rows_cast(x, recipe, fp8, scale, *args):   # the rows' cast for gate and up (made once), h's for down
        rows.append((x, scale))
        return cast_rows(x, recipe, fp8, scale, *args)

    def found(self, a8, sa, name, w, offsets, out_dtype, save):   # each forward GEMM, and as casts finding
        y = gemm(self, a8, sa, name, w, offsets, out_dtype, save)   # the scales give it
        (a, scale_a), end = rows[-1], int(offsets[-1])   # capacity padding rows are left unwritten
        forwards.append((scale_a is not None and self.weight_scales[name] is not None, y[:end],
                         grouped(layer, a, None, w, None, offsets)[:end]))
        return y

    monkeypatch.setattr(ep_fp8_layer, "gradients", spy)
    monkeypatch.setattr(ep_fp8_layer._Float8Owner, "_gemm", found)
    monkeypatch.setattr(ep_fp8_layer, "token_operand", rows_cast)
    wgrad, wgrad_rows = ep_fp8_layer.wgrad_operand, []
    monkeypatch.setattr(ep_fp8_layer, "wgrad_operand",
                        lambda x, offsets, recipe, fp8, scale: wgrad_rows.append((x, offsets, scale))
                        or wgrad(x, offsets, recipe, fp8, scale))
    out = layer(_tokens(zero_chunk, tokens))
    assert len(forwards) == 3 * chunks and all(given and torch.equal(a, b) for given, a, b in forwards)
    out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(2)))
    assert len(calls) == 3   # down, gate, up: the merged backward
    offsets = calls[0][0][2]
    assert offsets[EMPTY] == offsets[EMPTY - 1] and offsets[-1] == tokens * TOP_K   # an empty expert
    for args, kwargs in calls:
        scale_x, scale_w = args[8:10]
        assert scale_x is not None and scale_w is not None
        today = args[:8]
        if isinstance(args[0], tuple):   # gate's and up's: the rows' wgrad operand, cast once with scale_x;
            (merged, _, given), = wgrad_rows   # today each cast the rows, finding their scale
            assert given is scale_x
            today = (merged, *args[1:8])
        (dx, dw), (dx_today, dw_today) = real(*args, **kwargs), real(*today, None, None, **kwargs)
        end = int(offsets[-1])   # dX's capacity padding rows are left unwritten
        assert torch.equal(dx[:end], dx_today[:end]) and torch.equal(dw, dw_today), (tokens, chunks, capacity,
                                                                                     zero_chunk)


BACKWARD_LAUNCHES = {1: (19, {}), 2: (21, {"cat": 2})}
"""The owner's merged tensorwise backward, by chunks: (Triton launches, torch ops). Per expert
GEMM dy's two operands from one cast (its amax pass, two launches, and the cast), dX and dW (5;
the dgrad weight is the forward's, made with the weight's forward operand), the wgrad casts of h
and of the rows (once for gate and up), then SwiGLU's derivative and the k-sum of dX; with two
chunks the scales of x and hidden over both chunks' rows (the partials joined, a torch cat, and
one launch each)."""

FINDING_LAUNCHES = 23
"""The same backward with every scale None (each cast finds its own, the path it had before the
owner kept the forward's): the amax passes and reductions of the rows and h again (two launches
each; the weights' dgrad operands are the forward's either way), and no joined scale, for either
chunk count."""


@pytest.mark.parametrize("chunks", sorted(BACKWARD_LAUNCHES))
def test_tensorwise_backward_launches_no_amax_pass_over_the_rows_or_the_weights(one_rank, monkeypatch, chunks):
    layer = _layer(one_rank, chunks, None)
    seen, real = [], ep_fp8_layer._Float8Owner.backward
    monkeypatch.setattr(ep_fp8_layer._Float8Owner, "backward", lambda *a: seen.append(a) or real(*a))
    out = layer(_tokens(False))
    out.backward(torch.ones_like(out))
    (args,) = seen
    ops = device_ops(lambda: real(*args))
    assert (ops.triton, dict(ops.torch_ops)) == BACKWARD_LAUNCHES[chunks], ops
    owner = args[0]
    owner.weight_scales = dict.fromkeys(owner.weight_scales)   # the weights' scales None
    monkeypatch.setattr(ep_fp8_layer._Float8Owner, "_rows_scale", lambda self, name: None)   # and the rows'
    finding = device_ops(lambda: real(*args))
    assert (finding.triton, dict(finding.torch_ops)) == (FINDING_LAUNCHES, {}), finding


def test_delayed_casts_write_the_tile_maxima_of_each_chunks_rows_and_each_weight_once(one_rank, monkeypatch):
    """Which forward casts write tile maxima (``amax``), two chunks: each chunk's rows once for gate
    and up, and its SwiGLU output; each weight once a forward (its one cast, which every chunk reads):
    what :meth:`record` enters in the histories, one part per chunk for the rows, one for a weight."""
    layer = _layer(one_rank, 2, None, "delayed")
    casts, tokens = [], ep_fp8_layer.token_operand
    monkeypatch.setattr(ep_fp8_layer, "token_operand", lambda t, *a: casts.append(("rows", a[3])) or tokens(t, *a))
    for name in ("forward_weight", "weight_operands"):   # the forward's operand alone, or with dgrad's
        monkeypatch.setattr(ep_fp8_layer, name, lambda w, *a, cast=getattr(ep_fp8_layer, name): casts.append(
            ("w", a[3])) or cast(w, *a))
    record, parts = ep_fp8_layer.record_parts, {}

    def counted(layer, name, maxima):
        parts[name] = len(maxima)
        return record(layer, name, maxima)
    monkeypatch.setattr(ep_fp8_layer, "record_parts", counted)
    out = layer(_tokens(False))
    out.backward(torch.ones_like(out))
    assert casts == [("rows", True), ("w", True), ("w", True), ("rows", True), ("w", True), ("rows", True),
                     ("rows", True)]   # chunk 1: x, gate, up, h, down; chunk 2: x, h
    assert parts == {"x": 2, "hidden": 2, "gate": 1, "up": 1, "down": 1}
