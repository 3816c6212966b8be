"""The FP8 expert-parallel layer (``kernels.fp8.convert`` of ``kernels.MoE(..., ep_group=g)``)
against the single-process :class:`kernels.moe.fp8_layer.Float8MoE` of the same recipe and
weights, on 2 gloo processes: one spawn runs every recipe's case.

Each rank converts its expert-parallel share of one full layer (no warning) and runs its own
tokens forward and backward; the single-process FP8 layer, converted from the full layer,
runs all ranks' tokens (each rank computes some recipes' of these references: a process's
first interpreted FP8 launches cost seconds, so the parent computes none). Output, input
gradient, the local experts' weight gradients and the router's gradient (summed over the
ranks) are compared as :func:`workbench.check.relative_error` (max error over max
reference).

The row-local recipes (rowwise, blockwise, mxfp8) dispatch FP8 (the default): each rank also
runs their forward with ``fp8_dispatch=False`` (today's path, high-precision rows), whose output
the FP8 dispatch must give bit for bit, and the all-to-alls of both are counted (the dtype,
rows and bytes each one sends): the dispatch's rows are the same, in bytes plus their
scales, in as many collectives; so are mxfp8's in bfloat16 (17 bytes a row against 32). With FP8 dispatch the wgrad of gate and up requantizes the
dequantized rows, so those gradients are held to :data:`FP8_DISPATCH_GRADIENT_FACTOR` times
Float8MoE's error against float64 (blockwise's weight gradients all three: its wgrad's
128-token blocks hold an owner's rows), the rest to the reassociation bound.

Tensorwise (2 chunks) scales per tensor over an owner's rows and experts, not all of them: its
output and gradients are held to :data:`TENSORWISE_FACTOR` times Float8MoE's error against float64.

Delayed scaling starts from the single-process layer's histories after one training step
(forward and backward, with other output gradients), all eight sent to every rank (in its
first step each rank would take its own current amaxes, :mod:`kernels.moe.ep_fp8_layer`): its
forward is then the single-process layer's, its backward casts each output gradient with the
history's scale as Float8MoE's does, so output and gradients are held to the reassociation
bound, and after the step, synced, every rank holds the single-process layer's histories:
the forward operands' and down's dy's bit for bit (the amaxes its fused casts found, as
Float8MoE's: no torch pass reads an owner's rows, SwiGLU output or weights for an amax,
:class:`fp8_quantizations.TorchCalls`; dy's is max |w·dy| over the owner's rows, whose MAX over
the ranks is the global one), dg's and du's to :data:`DH_TOLERANCE`. The capacity cases
run forward and backward under the host-sync trap (the dropless one reads the host once,
for the plan's split sizes, as the high-precision layer), all cases with poisoned kernel
outputs. The FP8 grouped launches are counted: three forward per chunk, then one dX and
one dW per expert GEMM over all chunks' rows, no forward GEMM in the backward.
"""
from __future__ import annotations

import contextlib
import copy
import types
import warnings

import pytest
import torch
import torch.distributed as dist

import kernels
import kernels.fp8
from kernels.comm.launch import run_local
from kernels.fp8.recipes.delayed import HISTORY, PREFIX
from kernels.moe import MoEReference
from kernels.moe.ep_fp8_layer import Float8ExpertParallelMoE
from kernels.moe.fp8_experts import FP8_TENSORS, GRAD_TENSORS
from kernels.moe.fp8_layer import Float8MoE
from kernels.moe.grouped_gemm_fp8 import dw as dw_module
from kernels.moe.grouped_gemm_fp8 import v0_one_launch
from kernels.moe.grouped_gemm_fp8.quantize import ROW_LOCAL
from kernels.outputs import poisoned_outputs
from workbench.check import relative_error
from workbench.harness.tolerances import reassociation_bound
from workbench.train.flops import fp8_step_flops

from ep_gradients import grads_of
from fp8_quantizations import TorchCalls, amax_passes
from host_sync import counted_host_reads, no_host_sync

pytestmark = pytest.mark.timeout(300)

DIM, HIDDEN, EXPERTS, TOP_K = 16, 32, 4, 2   # one interpreter tile wide
FP8 = torch.float8_e4m3fn
TOKENS = (9, 5)                             # rank 0's and rank 1's
CAPACITY = TOKENS[0] * TOP_K                # room for every slot: nothing dropped
CASES = {"rowwise": (2, None), "delayed": (1, CAPACITY), "mxfp8": (1, CAPACITY), "blockwise": (1, None),
         "tensorwise": (2, None)}
"""recipe: (ep_chunks, ep_capacity)."""
REFERENCE_RANK = {"rowwise": 0, "mxfp8": 0, "delayed": 1, "blockwise": 1, "tensorwise": 0}
"""Which rank computes each recipe's single-process reference."""
SCALE_BYTES = {"rowwise": 4, "blockwise": 4, "mxfp8": 1}
"""The scales an FP8-dispatched row of DIM = 16 elements carries: one float32 per token
(rowwise), one per 128 of DIM (blockwise), one e8m0 byte per 32 (mxfp8)."""
HISTORIES = FP8_TENSORS + GRAD_TENSORS
"""Delayed's histories, the forward operands' and the output gradients' (both layers keep all eight)."""
DH_TOLERANCE = reassociation_bound(torch.float32)
"""The relative difference allowed between the EP layer's dg and du amaxes (``dy_gate``,
``dy_up``) and Float8MoE's, from equal histories: dy is quantized with the same scale (the
history's) into the same bytes per row, so dh = dy8 @ down8ᵀ, and g and u from the forward,
differ only by the fp32 order of the GEMMs' sums (an owner's tiles hold other rows), and dg and
du are elementwise in them. Measured here (CPU interpreter): 0."""
FP8_DISPATCH_GRADIENT_FACTOR = 2
"""FP8 dispatch's requantized weight gradients: their error against the float64 layer at most
this times Float8MoE's. Measured here (CPU interpreter): 1.61 at most (rowwise dup on rank 1:
0.064 against 0.040), blockwise 1.40, mxfp8 1.00."""


TENSORWISE_FACTOR = 2
"""Tensorwise's output and gradients: their error against the float64 layer at most this times
Float8MoE's. An owner's per-tensor scales are its own rows' and its experts' (one amax over the
tokens routed to it, over its chunks, 2 here), Float8MoE's all rows' and all experts': other
scales, other FP8 roundings. Measured here (CPU interpreter): 1.50 at most (the output on rank 1:
0.085 against 0.056)."""


def _batch():
    """The full layer (seed 0) and each rank's tokens and output gradients."""
    torch.manual_seed(0)
    full = kernels.MoE(DIM, HIDDEN, EXPERTS, TOP_K)
    gen = torch.Generator().manual_seed(1)
    xs = [torch.randn(n, DIM, generator=gen) for n in TOKENS]
    return full, xs, [torch.randn(n, DIM, generator=gen) for n in TOKENS]


def _histories(layer) -> torch.Tensor:
    return torch.stack([getattr(layer, PREFIX + name) for name in HISTORIES])


def _converted(layer, recipe, fp8_dispatch=None):
    """``layer`` in a Sequential converted by ``kernels.fp8.convert``, and the warnings it gave."""
    model = torch.nn.Sequential(layer)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kernels.fp8.convert(model, recipe, fp8_dtype=FP8, fp8_dispatch=fp8_dispatch)
    return model, [str(w.message) for w in caught]


def _reference(full, xs, gs, recipe):
    """The single-process FP8 layer's step on all tokens: (out, dx, gradients by name, and
    under delayed the histories before the step and after it, else None, None). Under
    delayed the step is the layer's second: the first (forward and backward, other output
    gradients) fills the histories, the output gradients' included."""
    model, caught = _converted(copy.deepcopy(full), recipe)
    single = model[0]
    assert type(single) is Float8MoE and caught == []
    start = None
    if recipe == "delayed":
        grads_of(single, torch.cat(xs), 3 * torch.cat(gs).flip(0))
        start = _histories(single).clone()
    out, dx, grads = grads_of(single, torch.cat(xs), torch.cat(gs))
    return out, dx, grads, start, _histories(single) if start is not None else None


@contextlib.contextmanager
def _fp8_launches():
    """The FP8 grouped GEMM launches (``"mm"``: forward or dX; ``"dw"``) within the block, in order."""
    launches, mm, dw = [], v0_one_launch.grouped_mm_fp8, dw_module.grouped_dw_fp8
    v0_one_launch.grouped_mm_fp8 = lambda *a: launches.append("mm") or mm(*a)
    dw_module.grouped_dw_fp8 = lambda *a: launches.append("dw") or dw(*a)
    try:
        yield launches
    finally:
        v0_one_launch.grouped_mm_fp8, dw_module.grouped_dw_fp8 = mm, dw


@contextlib.contextmanager
def _all_to_alls():
    """Each ``all_to_all_single`` within the block: (dtype, rows, bytes) of the tensor it sends."""
    sent, original = [], dist.all_to_all_single

    def counted(output, tensor, *args, **kwargs):
        sent.append((tensor.dtype, tensor.shape[0], tensor.nbytes))
        return original(output, tensor, *args, **kwargs)
    dist.all_to_all_single = counted
    try:
        yield sent
    finally:
        dist.all_to_all_single = original


def _converted_share(full, recipe, fp8_dispatch=None):
    """This rank's expert-parallel share of ``full`` with the case's chunks and capacity, converted
    (``fp8_dispatch`` as ``kernels.fp8.convert`` takes it)."""
    chunks, capacity = CASES[recipe]
    ep = kernels.MoE.from_full(full, dist.group.WORLD, ep_chunks=chunks)
    ep.ep_capacity = capacity
    model, caught = _converted(ep, recipe, fp8_dispatch)
    return ep, model, caught


def _forward(rank, full, xs, recipe, fp8_dispatch, dtype=torch.float32):
    """The forward of a row-local recipe's share of ``full`` in ``dtype``, with or without FP8
    dispatch, set by ``convert``'s keyword: (out, its all-to-alls)."""
    _, model, _ = _converted_share(copy.deepcopy(full).to(dtype), recipe, fp8_dispatch)
    assert model[0].fp8_dispatch is fp8_dispatch
    with pytest.raises(TypeError, match="fp8_dispatch must be a bool"):
        model[0].fp8_dispatch = int(fp8_dispatch)
    with _all_to_alls() as sent, torch.no_grad():
        out = model(xs[rank].to(dtype))
    return out, sent


def _high_precision_rows(rank, full, xs, gs, recipe="rowwise"):
    """A row-local recipe with ``fp8_dispatch = False``: (out, dx, gradients by name), which
    the test holds to Float8MoE's at the reassociation bound, gradients included (no
    requantized operand on this path)."""
    _, model, _ = _converted_share(copy.deepcopy(full), recipe)
    model[0].fp8_dispatch = False
    out, dx, g = grads_of(model, xs[rank], gs[rank])
    return out, dx, {name[2:]: grad for name, grad in g.items()}


def _ep_case(rank, full, xs, gs, recipe, start):
    """This rank's converted share of ``full`` on its tokens: (out, dx, gradients by name, the
    router's summed over the ranks, histories after a sync under delayed, problems found,
    the all-to-alls of forward and backward). With FP8 dispatch the owner keeps the FP8 rows
    (bytes and scales) for the backward, not high-precision ones."""
    chunks, capacity = CASES[recipe]
    ep, model, caught = _converted_share(full, recipe)
    fp8, problems = model[0], []
    if caught or type(fp8) is not Float8ExpertParallelMoE or fp8.gate is not ep.gate:
        problems.append(f"convert: {caught}, {type(fp8).__name__}")
    if fp8.fp8_dispatch != (recipe in ROW_LOCAL):
        problems.append(f"fp8_dispatch {fp8.fp8_dispatch}")
    if recipe not in ROW_LOCAL:
        with pytest.raises(ValueError, match=f"{recipe}' takes one scale per tensor"):
            fp8.fp8_dispatch = True
    if kernels.fp8.converted(model) != {"0": recipe}:
        problems.append(f"converted: {kernels.fp8.converted(model)}")
    cfg = types.SimpleNamespace(batch=1, seq=1)   # MFU counts its routed experts at the FP8 peak
    if fp8_step_flops(model, cfg) != 6 * fp8.top_k * 3 * fp8.dim * fp8.hidden:
        problems.append(f"FP8 FLOPs per token: {fp8_step_flops(model, cfg)}")
    if start is not None:
        with torch.no_grad():
            for name, history in zip(HISTORIES, start):
                getattr(fp8, PREFIX + name).copy_(history)
    # with capacity: no host read, and every kernel output starts as NaN, so a padding row's
    # unwritten GEMM output would reach an amax (and the results) if the layer did not zero it
    reading = no_host_sync() if capacity is not None else counted_host_reads()
    saved = []   # (dtype, shape) of every tensor autograd keeps

    def keep(t):
        saved.append((t.dtype, tuple(t.shape)))
        return t
    torch_calls = TorchCalls() if recipe == "delayed" else contextlib.nullcontext()
    with (reading as reads, _fp8_launches() as launches, poisoned_outputs(), _all_to_alls() as sent,
          torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t), torch_calls as seen):
        out, dx, g = grads_of(model, xs[rank], gs[rank])
    if recipe == "delayed":   # the amaxes its histories record are the fused casts': no torch pass
        operands = {shape for _, shape in seen.calls if len(shape) == 2 and shape[1] in (DIM, HIDDEN)}
        weights = {tuple(getattr(fp8, name).shape) for name in ("gate", "up", "down")}
        if amax_passes(seen.calls, operands | weights):
            problems.append(f"torch amax passes {amax_passes(seen.calls, operands | weights)}")
    fp8_rows = [DIM + SCALE_BYTES[recipe]] * chunks if recipe in ROW_LOCAL else []   # the owner keeps, per chunk
    if [shape[1] for dtype, shape in saved if dtype == torch.uint8] != fp8_rows:
        problems.append(f"saved {saved}")
    if reads != ([] if capacity is not None else ["tolist"]):     # dropless: the plan's one read
        problems.append(f"host reads {reads}")
    if recipe != "mxfp8" and launches != ["mm"] * 3 * chunks + ["mm", "dw"] * 3:
        problems.append(f"FP8 grouped launches {launches}")
    if int(fp8.ep_dropped) != 0:
        problems.append(f"{int(fp8.ep_dropped)} slots dropped")
    dist.all_reduce(g["0.router.weight"])
    synced = None
    if start is not None:
        kernels.fp8.sync_amax(model)
        synced = _histories(fp8)
        if list(kernels.fp8.saturation(model)) != ["0"]:
            problems.append(f"saturation sees {list(kernels.fp8.saturation(model))}")
    return out, dx, {name[2:]: grad for name, grad in g.items()}, synced, problems, sent


def _fp8_cases(rank, world):
    """({recipe: single-process reference} of this rank's recipes, {recipe: EP result},
    {row-local recipe: its forward without FP8 dispatch}, mxfp8's bfloat16 forward with and
    without FP8 dispatch)."""
    full, xs, gs = _batch()
    references = {r: _reference(full, xs, gs, r) for r in CASES if REFERENCE_RANK[r] == rank}
    start = references["delayed"][3] if "delayed" in references else torch.empty(len(HISTORIES), HISTORY)
    dist.broadcast(start, REFERENCE_RANK["delayed"])
    results = {r: _ep_case(rank, full, xs, gs, r, start if r == "delayed" else None) for r in CASES}
    today = {r: _forward(rank, full, xs, r, False) for r in CASES if r in ROW_LOCAL}
    bf16 = [_forward(rank, full, xs, "mxfp8", on, torch.bfloat16) for on in (True, False)]
    return references, results, today, bf16, _high_precision_rows(rank, full, xs, gs)


def _check_wire(recipe, chunks, forward, today, itemsize=4):
    """FP8 dispatch's forward all-to-alls against today's: the same collectives, each of the
    ``chunks`` dispatches the same rows as FP8 bytes and scales (today ``itemsize`` bytes an
    element), the others unchanged."""
    assert len(forward) == len(today) and sum(s[0] == torch.uint8 for s in forward) == chunks, (recipe, forward)
    for (dtype, rows, nbytes), high in zip(forward, today):
        if dtype == torch.uint8:     # a dispatch: today rows of the activation dtype
            assert high[1:] == (rows, rows * DIM * itemsize) and high[0].itemsize == itemsize, (recipe, today)
            assert nbytes == rows * (DIM + SCALE_BYTES[recipe]), (recipe, forward)
        else:
            assert (dtype, rows, nbytes) == high, (recipe, forward, today)


def _factor(recipe: str, key: str) -> int | None:
    """The multiple of Float8MoE's error against float64 that ``key`` is held to, or None: to
    Float8MoE's result itself, at the reassociation bound (every key under delayed, whose
    output gradients take the synced histories' scales)."""
    if recipe == "delayed":
        return None
    if recipe == "tensorwise":
        return TENSORWISE_FACTOR
    if key in ("dgate", "dup") or (recipe == "blockwise" and key == "ddown"):
        return FP8_DISPATCH_GRADIENT_FACTOR
    return None


@pytest.mark.slow   # 2 gloo ranks: ten expert-parallel steps, six references
def test_fp8_ep_layer_matches_the_single_process_fp8_layer():
    """Rowwise (2 chunks), delayed (capacity), mxfp8 (capacity), blockwise and tensorwise (2
    chunks): output and gradients equal to Float8MoE's to the reassociation bound of the
    high-precision EP layer, but for what :func:`_factor` holds to a multiple of Float8MoE's error
    against float64 (tensorwise's all); the row-local recipes' FP8 dispatch gives today's forward bit for bit, with its
    bytes (:func:`_check_wire`), and rowwise without it keeps every gradient at the bound; delayed's histories after the step equal on both ranks and
    Float8MoE's (dg's and du's to :data:`DH_TOLERANCE`)."""
    ranks = run_local(_fp8_cases, 2, timeout=280, group_timeout=200)
    references = {r: ref for refs, *_ in ranks for r, ref in refs.items()}
    full, xs, gs = _batch()
    exact = MoEReference(DIM, HIDDEN, EXPERTS, TOP_K)
    exact.load_state_dict(full.state_dict())
    exact = grads_of(exact.double(), torch.cat(xs).double(), torch.cat(gs).double())
    bound = reassociation_bound(torch.float32)
    for recipe in CASES:
        out_all, dx_all, g_all, _, after = references[recipe]
        for rank, (_, results, today, _, _) in enumerate(ranks):
            out, dx, grads, synced, problems, sent = results[recipe]
            assert problems == [], (recipe, rank)
            chunks = CASES[recipe][0]   # the backward's all-to-alls: output gradients out, input gradients back
            forward, backward = sent[:-2 * chunks], sent[-2 * chunks:]
            assert [dtype for dtype, _, _ in backward] == [torch.float32] * 2 * chunks, (recipe, sent)
            if recipe in ROW_LOCAL:
                assert torch.equal(out, today[recipe][0]), (recipe, rank)
                _check_wire(recipe, chunks, forward, today[recipe][1])
            rows = slice(sum(TOKENS[:rank]), sum(TOKENS[:rank + 1]))
            experts = slice(rank * EXPERTS // 2, (rank + 1) * EXPERTS // 2)
            got = {"out": out, "dx": dx, **{f"d{n}": grads[n] for n in ("gate", "up", "down", "router.weight")}}
            want = {"out": out_all[rows], "dx": dx_all[rows], "drouter.weight": g_all["router.weight"]}
            want |= {f"d{n}": g_all[n][experts] for n in ("gate", "up", "down")}
            truth = {"out": exact[0][rows], "dx": exact[1][rows], "drouter.weight": exact[2]["router.weight"]}
            truth |= {f"d{n}": exact[2][n][experts] for n in ("gate", "up", "down")}
            for key in got:
                assert got[key].isfinite().all(), (recipe, rank, key)   # relative_error skips NaN
                factor = _factor(recipe, key)
                if factor is not None:
                    ours, theirs = (relative_error(t, truth[key])[0] for t in (got[key], want[key]))
                    assert ours <= factor * theirs, (recipe, rank, key, ours, theirs)
                else:
                    error = relative_error(got[key], want[key].double())[0]
                    assert error <= bound, (recipe, rank, key, error)
            if synced is not None:   # the forward operands' and down's dy's bit for bit, dg's and du's close
                close = [HISTORIES.index(n) for n in ("dy_gate", "dy_up")]
                bitwise = [i for i in range(len(HISTORIES)) if i not in close]
                assert torch.equal(synced[bitwise], after[bitwise]), (rank, synced, after)
                torch.testing.assert_close(synced[close], after[close], rtol=DH_TOLERANCE, atol=0)
                assert not torch.equal(after[:, 0], after[:, 1])   # the step's entry is new
    assert torch.equal(ranks[0][1]["delayed"][3], ranks[1][1]["delayed"][3])
    out_all, dx_all, g_all, _, _ = references["rowwise"]   # rowwise without FP8 dispatch: all at the bound
    for rank, (*_, (out, dx, grads)) in enumerate(ranks):
        rows = slice(sum(TOKENS[:rank]), sum(TOKENS[:rank + 1]))
        experts = slice(rank * EXPERTS // 2, (rank + 1) * EXPERTS // 2)
        pairs = [(out, out_all[rows]), (dx, dx_all[rows])] + [(grads[n], g_all[n][experts]) for n in ("gate", "up", "down")]
        for got, want in pairs:
            assert got.isfinite().all() and relative_error(got, want.double())[0] <= bound, rank
    for _, _, _, ((out, sent), (out_today, sent_today)), _ in ranks:   # bfloat16: about half the bytes
        assert out.dtype == torch.bfloat16 and torch.equal(out, out_today)
        _check_wire("mxfp8", CASES["mxfp8"][0], sent, sent_today, itemsize=2)


def test_from_ep_takes_only_the_expert_parallel_layer():
    with pytest.raises(TypeError, match="takes an ExpertParallelMoE, got MoE"):
        Float8ExpertParallelMoE.from_ep(kernels.MoE(DIM, HIDDEN, EXPERTS, TOP_K))
    with pytest.raises(TypeError, match="Float8ExpertParallelMoE.from_ep"):
        Float8MoE.from_moe(torch.nn.Linear(2, 2))


@pytest.mark.parametrize("recipe", ["tensorwise", "delayed"])
def test_convert_refuses_fp8_dispatch_under_a_per_tensor_recipe_before_swapping(recipe):
    """``convert(..., fp8_dispatch=True)`` under a per-tensor recipe raises the property's error
    (and a non-bool its TypeError) before any layer is swapped, whether or not the model holds
    an expert-parallel layer (the two-rank test converts with the keyword and runs both settings)."""
    model = torch.nn.Sequential(kernels.MoE(DIM, HIDDEN, EXPERTS, TOP_K), torch.nn.Linear(DIM, DIM))
    with pytest.raises(ValueError, match=f"fp8_dispatch needs a recipe .*{recipe}' takes one scale per tensor"):
        kernels.fp8.convert(model, recipe, fp8_dtype=FP8, fp8_dispatch=True)
    with pytest.raises(TypeError, match="fp8_dispatch must be a bool, got int"):
        kernels.fp8.convert(model, "rowwise", fp8_dtype=FP8, fp8_dispatch=1)
    assert type(model[0]) is kernels.MoE and kernels.fp8.converted(model) == {}
    kernels.fp8.convert(model, recipe, fp8_dtype=FP8, fp8_dispatch=False)   # the recipe's own setting
    assert type(model[0]) is Float8MoE
