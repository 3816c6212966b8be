"""The fused MoE rung (``moe`` v3): the harness at every smoke shape and dtype, forward and
backward; agreement with v2; that no permuted copy of x reaches the gate/up kernel;
determinism; the modelled traffic; the kernels' program order; its two kernels' machine
code on gfx942 and gfx950."""
from __future__ import annotations

import re

import pytest
import torch
import triton
import triton.language as tl

import kernels
from kernels.moe.layer_ladder import spec as moe_spec
from kernels.moe.layer_ladder import v3_fused
from kernels.outputs import poisoned_outputs
from workbench import isa
from workbench.isa import parse as isa_parse
from workbench.check import check_rung

V3 = kernels.get("moe", "v3")


@pytest.mark.parametrize("dtype", moe_spec.DTYPES, ids=str)
@pytest.mark.parametrize("shape", moe_spec.SMOKE_SHAPES, ids=str)
def test_harness_passes_forward_and_backward(shape, dtype):
    report = check_rung(V3, shape, dtype)
    assert report.passed, report.message
    assert {"dx", "drouter", "dgate", "dup", "ddown"} <= set(report.message.split())


@pytest.mark.parametrize("dtype, bound", [(torch.float32, 1e-6), (torch.bfloat16, 2 ** -6)], ids=str)
def test_matches_v2(dtype, bound):
    """Same tiles and K order as v2's grouped GEMM: fp32 agrees to rounding; in 16 bits v3
    rounds h once where v2 rounds g, u and h, so they differ by an ulp or two."""
    for shape in moe_spec.SMOKE_SHAPES:
        inputs = moe_spec.make_inputs(shape, dtype, seed=4)
        got, want = V3(*inputs).double(), kernels.get("moe", "v2")(*inputs).double()
        assert ((got - want).abs().max() / want.abs().max()).item() <= bound, shape


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16), ids=str)
def test_down_scatter_weights_the_fp32_product_before_its_one_rounding(dtype):
    """Kernel 2 multiplies each row's fp32 product by its routing weight and rounds once. On
    small integers every product, sum and weighting (by 0.75 or 1.25) is exact in fp32, so
    the result is the exact value rounded once, bit for bit; sums past 256 (bf16) or 2048
    (fp16) are not all in the dtype, so rounding the product before the weight shows.
    Poisoned output: each slot's row is written."""
    gen = torch.Generator().manual_seed(7)
    tokens, top_k, experts, hidden, dim = 5, 2, 3, 40, 24
    ids = torch.stack([torch.randperm(experts, generator=gen)[:top_k] for _ in range(tokens)]).to(torch.int32)
    offsets, slots = v3_fused.sort_slots(ids, experts)
    h = torch.randint(-31, 32, (tokens * top_k, hidden), generator=gen).to(dtype)
    down = torch.randint(-31, 32, (experts, hidden, dim), generator=gen).to(dtype)
    weights = torch.tensor([0.75, 1.25])[torch.randint(0, 2, (tokens, top_k), generator=gen)]
    with poisoned_outputs():
        out = v3_fused.down_scatter(h, down, slots, weights, offsets)
    expert = torch.searchsorted(offsets.long(), torch.arange(tokens * top_k), right=True)   # of each sorted row
    exact = torch.empty(tokens * top_k, dim, dtype=torch.float64)
    exact[slots] = torch.einsum("rk,rkn->rn", h.double(), down.double()[expert]) * weights.reshape(-1).double()[slots, None]
    assert torch.equal(out, exact.to(dtype))


def test_gate_up_kernel_reads_x_itself(monkeypatch):
    """The gather is in the load: kernel 1 gets x (T, dim), not a (T·k, dim) sorted copy."""
    seen = []
    kernel = v3_fused._gate_up_kernel
    real = kernel.run   # what the launch calls (triton_support.run_kwargs)
    monkeypatch.setitem(kernel.__dict__, "run", lambda *args, **kwargs: seen.append(args[0]) or real(*args, **kwargs))
    x, *rest = moe_spec.make_inputs((45, 48, 33, 8, 2, 1), torch.float16, seed=2)
    V3(x, *rest)
    assert len(seen) == 1 and seen[0] is x


def test_forward_and_backward_are_bitwise_deterministic():
    inputs = moe_spec.make_inputs((33, 24, 17, 5, 2, 2), torch.bfloat16, seed=5)

    def run():
        leaves = [t.detach().clone().requires_grad_() for t in inputs[:5]]
        out = V3(*leaves, inputs[5])
        out.backward(torch.ones_like(out))
        return [out.detach()] + [t.grad for t in leaves]

    assert all(torch.equal(a, b) for a, b in zip(run(), run()))


def test_modelled_bytes_save_the_permuted_copies():
    t, dim, hidden, e, k, _ = shape = moe_spec.BENCH_SHAPES["dsv3 (32 local experts)"]
    model = moe_spec.modelled_bytes(shape, torch.bfloat16)
    rows = t * k
    assert model["v2"] - model["v3"] == 2 * (t * dim + 2 * rows * dim + 4 * rows * hidden)
    assert model["floor"] < model["v3"] < model["v2"]
    # v3's docstring: "1.5 GB of v2's 6.1 GB per call" for this preset
    assert round((model["v2"] - model["v3"]) / 1e9, 1) == 1.5 and round(model["v2"] / 1e9, 1) == 6.1
    one = moe_spec.modelled_bytes((t, dim, hidden, e, 1, 0), torch.bfloat16)
    assert one["v2"] - one["v3"] == 2 * (t * dim + 4 * t * dim + 4 * t * hidden)


@triton.jit
def _schedule_kernel(offsets_ptr, out_ptr, R, N, G, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_G: tl.constexpr, GROUP_M: tl.constexpr):
    """Each program's (group, first row, first column) on v3's schedule."""
    group, rows, _, cols, _ = v3_fused._program_tile(offsets_ptr, R, N, G, BLOCK_M, BLOCK_N, 16, BLOCK_G,
                                                      GROUP_M)
    pid = tl.program_id(0)
    tl.store(out_ptr + pid * 3, group)
    tl.store(out_ptr + pid * 3 + 1, tl.min(rows, 0))
    tl.store(out_ptr + pid * 3 + 2, tl.min(cols, 0))


def test_programs_walk_super_rows_so_a_row_tile_stays_hot_across_its_column_panels():
    """Every (row tile, column panel) of every expert once; a row tile's programs all fall in a
    window of GROUP_M x (column panels) consecutive ids, its super-row's (over the whole grid
    in a row-tile-fastest order they would lie a grid column apart), and each column panel's
    row tiles run back to back."""
    counts, n, block = [70, 0, 9, 121], 100, 32     # an empty expert; ragged tiles
    offsets = torch.tensor(counts).cumsum(0).to(torch.int32)
    rows, groups = int(offsets[-1]), len(counts)
    tiles_m, tiles_n = -(-rows // block) + groups, -(-n // block)
    out = torch.full((tiles_m * tiles_n, 3), -1, dtype=torch.int32)
    _schedule_kernel[(tiles_m * tiles_n,)](offsets, out, rows, n, groups, BLOCK_M=block, BLOCK_N=block,
                                           BLOCK_G=4, GROUP_M=v3_fused.GROUP_M)
    work = [(pid, *map(int, row)) for pid, row in enumerate(out) if row[0] < groups]
    starts = [0, *offsets.tolist()[:-1]]
    want = {(g, r, c) for g in range(groups) for r in range(starts[g], int(offsets[g]), block)
            for c in range(0, n, block)}
    assert sorted((g, r, c) for _, g, r, c in work) == sorted(want)
    for row in {r for _, _, r, _ in work}:
        ids = [pid for pid, _, r, _ in work if r == row]
        assert max(ids) - min(ids) < v3_fused.GROUP_M * tiles_n
    panel = [(c, pid) for pid, _, _, c in work]
    assert panel == sorted(panel)   # within the first super-row (all of this grid's work): panel by panel


def _loop_mfma_macs(report) -> int:
    """MACs of the MFMAs in the hot loop, with the loop's out-of-line blocks: backward
    branches whose spans overlap the hot loop's (gfx950's masked direct-to-LDS loads
    branch out of the loop body and back) are one loop."""
    lines = isa_parse.code_lines(report.asm, "amdgcn")
    first = lines.index(report.hot_loop.splitlines()[0])
    low, high = first, first + len(report.hot_loop.splitlines()) - 1
    labels = {m.group(1): i for i, line in enumerate(lines) if (m := isa_parse._LABEL.match(line))}
    spans = [(labels[t], i) for i, line in enumerate(lines)
             if (t := isa_parse.branch_target(line, "amdgcn")) in labels and labels[t] < i]
    for _ in spans:
        for a, b in spans:
            if a <= high and b >= low:
                low, high = min(low, a), max(high, b)
    shapes = [isa_parse.mnemonic(line) or "" for line in lines[low:high + 1]]
    return sum(int(m) * int(n) * int(kk) for s in shapes if s.startswith("v_mfma_f32_")
               for m, n, kk in [s.split("_")[3].split("x")])


NARROW_LDS = re.compile(r"ds_(read|write)_(u16|i16|b16)(_d16(_hi)?)?$")   # not gfx950's ds_read_*_tr_b16


@pytest.mark.parametrize("target", ["gfx942", "gfx950"])
def test_kernels_use_mfma_for_every_product_stage_through_lds_and_do_not_spill(target):
    """As the launch runs them untimed at the AOT shape: the first config of v3's pruned space."""
    first, second = isa.inspect_all("moe", "v3", target)
    assert (first.kernel_name, second.kernel_name) == ("_gate_up_kernel", "_down_scatter_kernel")
    for report, cfg, products in zip((first, second), v3_fused.config("hip", target), (2, 1)):
        assert report.options["num_warps"] == cfg["num_warps"]
        macs = products * cfg["BLOCK_M"] * cfg["BLOCK_N"] * cfg["BLOCK_K"]   # gate and up: 2
        assert _loop_mfma_macs(report) * cfg["num_warps"] >= macs, report.matrix_instructions
        assert report.lds_bytes > 0 and report.lds_reads > 0 and report.lds_writes + sum(
            n for name, n in report.global_loads.items() if "lds" in name) > 0
        loop = [m for m in map(isa_parse.mnemonic, report.hot_loop.splitlines()) if m]
        every = [m for m in map(isa_parse.mnemonic, isa_parse.code_lines(report.asm, "amdgcn")) if m]
        assert not [op for op in every if NARROW_LDS.match(op)], report.kernel_name   # anywhere, not only the loop
        if target == "gfx942":   # v3's docstring: 128-bit operand reads
            assert {op for op in loop if op.startswith("ds_read")} == {"ds_read_b128"}, report.kernel_name
        assert (report.spills, report.sgpr_spills, report.scratch_bytes) == (0, 0, 0), report.summary()
        assert report.occupancy.value >= 2 and report.occupancy.limited_by
