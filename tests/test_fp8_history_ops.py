"""kernels.fp8.history_ops, delayed scaling's scale and record launches, which reduce what they
read themselves (the history, the amax pass's partials, a cast's tile maxima): bit for bit the
rule they replace (a float64 reference: the history's max, the current amax while the history is
empty, 1 for zero; the amax entering first) on fresh random values with the edge cases (an empty
history, an all-zero tensor, no maxima at all, inf, an amax on and around each format's saturation
limit, the largest value in every history entry, every partial and every tile, past the first
block of maxima), into poisoned outputs; a Float8Linear's histories, counts and scales over
several steps against that rule (its launches and torch ops: tests/test_host_overhead_fp8.py); the
custom ops' registrations (opcheck); and the kernels as gfx942 and gfx950 compile them (no spills, no
scratch; the record's shift reads every old entry before it writes one), one binary for every count."""
from __future__ import annotations

import re

import pytest
import torch

import kernels
from kernels.fp8 import Float8Linear, history_ops
from kernels.fp8.recipes.delayed import HISTORY, _SATURATION, history_scale, push_amax, saturated
from kernels.gemm_fp8 import quantize_kernel
from kernels.gemm_fp8.quantize import quantize_checked, reduce_maxima
from kernels.outputs import poisoned_outputs

from fresh_compiles import results

FORMATS = (torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.float8_e5m2, torch.float8_e5m2fnuz)
MAXIMA = quantize_kernel.PARTIALS * 2 + 452   # three loop steps, the last partial


def _rule(history: torch.Tensor, amax: torch.Tensor, fmax: float) -> torch.Tensor:
    """The delayed scale, in float64 then rounded once (a correctly rounded float32 quotient:
    float64 carries more than twice float32's bits): max(history) / fmax, the current amax's
    while every entry is 0, 1 where both are 0."""
    seen = history.double().max() if history.numel() else torch.zeros((), dtype=torch.float64)
    ref = seen if seen > 0 else amax.double()
    return (ref / fmax).float() if ref > 0 else torch.ones((), dtype=torch.float32)


def _inf_last(n: int) -> torch.Tensor:
    """n zeros but the last entry, inf (:func:`_peaked` with an inf peak would make every entry inf)."""
    values = torch.zeros(n)
    values[-1] = float("inf")
    return values


def _peaked(n: int, at: int, peak: float, gen) -> torch.Tensor:
    """n non-negative float32 values below ``peak`` but the one at ``at``, which is ``peak``."""
    values = torch.rand(n, generator=gen) * peak * 0.99
    values[at] = peak
    return values


def _positions(n: int) -> list[int]:
    """Every position of a short vector; of a long one its ends and each loop step's."""
    if n <= 2 * HISTORY:
        return list(range(n))
    block = quantize_kernel.PARTIALS
    return sorted({0, 1, block - 1, block, 2 * block - 1, 2 * block, n - 1} & set(range(n)))


@pytest.mark.parametrize("fp8", FORMATS, ids=str)
def test_the_scale_is_the_rule(fp8):
    """Random magnitudes (1e-30 .. 1e30) for the history's max and the current amax, 0 among them."""
    fmax = torch.finfo(fp8).max
    gen = torch.Generator().manual_seed(FORMATS.index(fp8))
    magnitudes = 10.0 ** torch.randint(-30, 30, (6,), generator=gen)
    values = [0.0, *(torch.rand(6, generator=gen, dtype=torch.float64) * magnitudes).tolist()]
    for seen in values:
        history = _peaked(HISTORY, int(torch.randint(HISTORY, (), generator=gen)), seen, gen)
        for amax in values:
            maxima = _peaked(5, int(torch.randint(5, (), generator=gen)), amax, gen)
            with poisoned_outputs():
                got = history_ops.scale(history, maxima, fmax)
            assert got.shape == () and got.dtype == torch.float32
            assert torch.equal(got, _rule(history, torch.tensor(amax, dtype=torch.float32), fmax)), (seen, amax)


def test_the_scale_reads_every_history_entry_and_every_maxima():
    """The history's max in each of its entries (the last included), and with an empty history
    (all 0, or no entries) the current amax in each of the maxima, past the first loop step; none:
    0, so 1; inf: inf."""
    fmax, gen = 448.0, torch.Generator().manual_seed(1)
    maxima = torch.rand(MAXIMA, generator=gen)   # all below 1: the history's max wins
    for at in range(HISTORY):
        history = _peaked(HISTORY, at, 3.0, gen)
        assert torch.equal(history_ops.scale(history, maxima, fmax), _rule(history, reduce_maxima(maxima), fmax)), at
    empty = torch.zeros(HISTORY)
    for n in (1, 5, MAXIMA):
        for at in _positions(n):
            maxima = _peaked(n, at, 7.5, gen)
            got = history_ops.scale(empty, maxima, fmax)
            assert torch.equal(got, _rule(empty, torch.tensor(7.5), fmax)) and got == 7.5 / fmax, (n, at)
            assert torch.equal(history_ops.scale(torch.zeros(0), maxima, fmax), got)   # no entries: the same
    assert history_ops.scale(empty, torch.zeros(0), fmax) == 1
    assert history_ops.scale(empty, torch.zeros(MAXIMA), fmax) == 1
    assert history_ops.scale(empty, _inf_last(MAXIMA), fmax) == float("inf")
    assert history_ops.scale(_inf_last(HISTORY), torch.zeros(0), fmax) == float("inf")


@pytest.mark.parametrize("fp8", FORMATS, ids=str)
@pytest.mark.parametrize("history_len", [HISTORY, 5, 1])
def test_the_record_is_the_rule(fp8, history_len):
    """The amax (the max of the maxima) enters first, the oldest entry drops out, and
    counts[index] gains 1 exactly where :func:`~kernels.fp8.recipes.delayed.saturated` says (on
    the limit too for the formats whose tie there rounds away from the max)."""
    gen = torch.Generator().manual_seed(history_len)
    limit, _ = _SATURATION[fp8]
    scale = torch.rand((), generator=gen) + 0.5
    edge = (scale * limit).item()
    for amax in (0.0, edge, torch.nextafter(torch.tensor(edge), torch.tensor(0.0)).item(),
                 torch.nextafter(torch.tensor(edge), torch.tensor(1e30)).item(), 3 * edge, float("inf")):
        history = torch.rand(history_len, generator=gen)
        counts = torch.randint(0, 5, (3,), generator=gen)
        maxima = _peaked(6, int(torch.randint(6, (), generator=gen)), amax, gen).reshape(2, 3)
        amax_t = torch.tensor(amax, dtype=torch.float32)
        want_history = torch.cat([amax_t.reshape(1), history[:-1]])
        want_counts = counts.clone()
        want_counts[1] += saturated(amax_t, scale, fp8).to(torch.int64)
        history_ops.record(history, counts, 1, maxima, scale, *_SATURATION[fp8])
        assert torch.equal(history, want_history) and torch.equal(counts, want_counts), (amax, edge)


def test_the_record_reads_every_maxima():
    """The amax in each of the maxima, past the first loop step, is what enters; none: 0."""
    gen = torch.Generator().manual_seed(2)
    scale = torch.tensor(1.0)
    for n in (1, 7, MAXIMA):
        for at in _positions(n):
            history, counts = torch.rand(HISTORY, generator=gen), torch.zeros(3, dtype=torch.int64)
            old = history.clone()
            history_ops.record(history, counts, 0, _peaked(n, at, 500.0, gen), scale, *_SATURATION[torch.float8_e4m3fn])
            assert history[0] == 500.0 and torch.equal(history[1:], old[:-1]) and counts.tolist() == [1, 0, 0], (n, at)
    history = torch.rand(HISTORY, generator=gen)
    history_ops.record(history, counts, 0, torch.zeros(0), scale, *_SATURATION[torch.float8_e4m3fn])
    assert history[0] == 0


def _one_per_tile(shape, dtype, peak, at_tile, gen):
    """x of ``shape`` whose largest |value| (``peak``, negative) lies in tile ``at_tile`` (row-major)."""
    x = (torch.rand(shape, generator=gen) * 2 - 1).to(dtype)
    tiles_k = -(-shape[1] // quantize_kernel.TILE)
    row, col = divmod(at_tile, tiles_k)
    r = min(row * quantize_kernel.TILE + 3, shape[0] - 1)
    c = min(col * quantize_kernel.TILE + 5, shape[1] - 1)
    x[r, c] = -peak
    return x


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_tensors_scale_and_record_find_its_amax_in_every_tile(dtype):
    """Through the real launches: the amax pass's partials (an empty history: x read) reduced by
    the scale's launch, and the cast's tile maxima reduced by the record's, with x's largest value
    in each tile of a ragged 3 x 3 grid: the scale and the entry are the torch pass's amax's."""
    gen, fp8 = torch.Generator().manual_seed(3), torch.float8_e4m3fn
    shape = (2 * quantize_kernel.TILE + 9, 2 * quantize_kernel.TILE + 17)
    for at in range(9):
        x = _one_per_tile(shape, dtype, 6.0, at, gen)
        history, counts = torch.zeros(HISTORY), torch.zeros(3, dtype=torch.int64)
        amax = x.abs().amax().float()
        with poisoned_outputs():
            scale = history_scale(history, x, fp8)
            _, _, maxima = quantize_checked(x, "tensor", fp8, scale=scale, amax=True)
        assert maxima.shape == (3, 3) and torch.equal(scale, _rule(history, amax, 448.0)), at
        push_amax(history, counts, 0, maxima, scale, fp8)
        assert torch.equal(history[:2], torch.stack([amax, torch.zeros(())])) and counts.sum() == 0, at
    empty = torch.zeros(0, 5, dtype=dtype)
    history = torch.zeros(HISTORY)
    scale = history_scale(history, empty, fp8)
    _, _, maxima = quantize_checked(empty, "tensor", fp8, scale=scale, amax=True)
    push_amax(history, counts, 0, maxima, scale, fp8)
    assert scale == 1 and maxima.numel() == 0 and not history.any()


def _reference_step(state: dict, name: str, t: torch.Tensor, fp8: torch.dtype) -> torch.Tensor:
    """One delayed cast of ``t`` by the rule, on the reference state: its scale, and its amax
    entering the history with a saturating step counted."""
    history, counts, index = state[name], state["counts"], ("x", "w", "dy").index(name)
    amax = t.detach().abs().amax().float()
    scale = _rule(history, amax, torch.finfo(fp8).max)
    counts[index] += saturated(amax, scale, fp8).to(torch.int64)
    state[name] = torch.cat([amax.reshape(1), history[:-1]])
    return scale


def test_a_delayed_linears_histories_counts_and_scales_follow_the_rule_over_steps():
    """Steps whose x and dy grow past their history (saturating), an all-zero step, a shrinking
    one: after each, the layer's three histories, its counts and the scales its forward took are
    the rule's, bitwise."""
    _follows_the_rule_over_steps("cpu")


@pytest.mark.gpu
def test_on_this_gpu_a_delayed_linears_bookkeeping_follows_the_rule_over_steps():
    """The same steps on the real backend: its amax pass, casts and one-program scale and record
    kernels give the rule's histories, counts and scales, bitwise (the rule in float64 on the CPU)."""
    _follows_the_rule_over_steps(kernels.backend.current().device)


def _follows_the_rule_over_steps(device) -> None:
    gen = torch.Generator().manual_seed(4)
    layer = Float8Linear(200, 9, bias=False, recipe="delayed").to(device)
    fp8, grad = layer.fp8_dtype, layer.grad_fp8_dtype
    state = {"x": torch.zeros(HISTORY), "w": torch.zeros(HISTORY), "dy": torch.zeros(HISTORY),
             "counts": torch.zeros(3, dtype=torch.int64)}
    for step, size in enumerate((1.0, 1.0, 8.0, 0.0, 0.5, 1000.0)):
        x = torch.randn(130, 200, generator=gen) * size
        dy = torch.randn(130, 9, generator=gen) * size * 3
        layer(x.to(device)).backward(dy.to(device))
        weight = layer.weight.detach().cpu()
        want_x, want_w = (_reference_step(state, name, t, fp8) for name, t in (("x", x), ("w", weight)))
        _reference_step(state, "dy", dy, grad)
        took = layer._fp8_forward_scales
        assert torch.equal(took["x"].cpu(), want_x) and torch.equal(took["w"].cpu(), want_w), step
        for name in ("x", "w", "dy"):
            assert torch.equal(getattr(layer, f"fp8_amax_history_{name}").cpu(), state[name]), (step, name)
        assert torch.equal(layer.fp8_saturated.cpu(), state["counts"]), step
    assert state["counts"][0] >= 2 and state["counts"][2] >= 2   # the rule saturated: the test saw counts move


def test_the_custom_ops_pass_opcheck():
    maxima = torch.tensor([[3.5, 1.0], [0.0, 2.0]])
    torch.library.opcheck(torch.ops.kernels.fp8_history_scale.default, (torch.zeros(HISTORY), maxima, 448.0))
    torch.library.opcheck(torch.ops.kernels.fp8_history_scale.default, (torch.rand(HISTORY), torch.zeros(0), 448.0))
    torch.library.opcheck(torch.ops.kernels.fp8_record_amax.default,
                          (torch.rand(HISTORY), torch.zeros(3, dtype=torch.int64), 2, maxima, torch.tensor(0.01),
                           464.0, False))
    torch.library.opcheck(torch.ops.kernels.fp8_amax_partials.default, (torch.randn(130, 260), torch.zeros(HISTORY)))


COMPILE = """
import torch
from kernels.fp8 import history_ops
from kernels.fp8.recipes.delayed import HISTORY
from kernels.gemm_fp8 import quantize_kernel
from kernels.triton_support import aot_launch
from workbench.isa import compile as isa_compile
from workbench.isa import parse as isa_parse

# as the launches pass them: an 8192 x 8192 x's PARTIALS partials for the scale, its 64 x 64 tile maxima for
# the record (the kernels do not specialize count: any count is this binary)
COUNTS = dict(scale=quantize_kernel.PARTIALS, record=64 * 64)


def aot(kernel):
    blocks = dict(H_BLOCK=HISTORY, BLOCK=quantize_kernel.PARTIALS)
    if kernel == "scale":
        return aot_launch(history_ops._scale_kernel, torch.float32, dict(num_warps=1),
                          dict(H=HISTORY, count=COUNTS[kernel]), constexprs=dict(FMAX=448.0, **blocks))
    return aot_launch(history_ops._record_kernel, torch.float8_e4m3fn, dict(num_warps=1),
                      dict(index=2, H=HISTORY, count=COUNTS[kernel]),
                      constexprs=dict(LIMIT=464.0, AT_LIMIT=False, **blocks),
                      pointers=dict(history_ptr="*fp32", counts_ptr="*i64", maxima_ptr="*fp32", scale_ptr="*fp32"))


def result(job):
    kernel, arch = job
    if arch == "sm_90":
        return isa_compile.compile_aot(aot(kernel), ("cuda", 90, 32))["asm"].splitlines()
    compiled = isa_compile.compile_aot(aot(kernel), ("hip", arch, 64))
    return summary(compiled, code=[line.strip() for line in isa_parse.code_lines(compiled["asm"], "amdgcn")])
"""
JOBS = tuple((kernel, arch) for kernel in ("scale", "record") for arch in ("gfx942", "gfx950", "sm_90"))


@pytest.mark.slow   # AOT compiles in a fresh process
@pytest.mark.parametrize("kernel", ["scale", "record"])
@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_the_kernels_do_not_spill(kernel, arch):
    res = results(COMPILE, JOBS)[(kernel, arch)]["resources"]
    assert (res["vgpr_spills"], res["sgpr_spills"], res["scratch_bytes"]) == (0, 0, 0), res


@pytest.mark.slow   # AOT compiles in a fresh process
@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_the_record_reads_the_whole_history_before_it_shifts_it(arch):
    """Between the history's load (the last load through the buffer descriptor of its shifted
    store, the first vector store) and that store: the barrier, which in a workgroup of one wave
    compiles to a wave barrier (no memory access moves across it), and a wait for every vector
    load. Only the barrier fails here when tl.debug_barrier() is left out (checked): the wait is
    there without it, each lane's stored value being its own load's, so on these GPUs the code
    without it is the same but for the marker."""
    code = results(COMPILE, JOBS)[("record", arch)]["code"]
    history_store = next(i for i, line in enumerate(code) if line.startswith("buffer_store"))
    descriptor = code[history_store].split(", ")[2]   # buffer_store_dword data, offset, s[..], ...
    history_load = max(i for i, line in enumerate(code[:history_store])
                       if line.startswith("buffer_load") and line.split(", ")[2] == descriptor)
    between = code[history_load:history_store]
    assert "; wave barrier" in between and "s_waitcnt vmcnt(0)" in between, code


@pytest.mark.slow
def test_on_nvidia_a_barrier_separates_the_records_loads_from_its_stores():
    """Lanes of an NVIDIA warp are not ordered without a barrier: bar.sync between the history's
    load and its shifted store. The load is the history's own: the one whose address is the
    store's one entry back (``add.s64 %rdL, %rdS, -4``: entry i - 1 for the lane storing entry i)."""
    ptx = [line.strip() for line in results(COMPILE, JOBS)[("record", "sm_90")]]
    store = next(i for i, line in enumerate(ptx) if "st.global" in line)           # the shifted history
    stored_at = re.search(r"\[ (%rd\d+)", ptx[store]).group(1)
    one_back = {m.group(1) for line in ptx[:store]
                if (m := re.match(rf"add\.s64\s+(%rd\d+), {stored_at}, -4;", line))}
    load = max(i for i, line in enumerate(ptx[:store])
               if "ld.global" in line and re.search(r"\[ (%rd\d+)", line).group(1) in one_back)
    assert any(line.startswith(("bar.sync", "barrier.sync")) for line in ptx[load:store]), ptx


def test_every_count_launches_the_binary_the_isa_tests_compile(monkeypatch):
    """``count`` (a shape's number of maxima) and the record's ``index`` are not specialized:
    calls with 1, 16 and 17 maxima, index 1 and 2, give both kernels' every argument the class
    (for gfx942) of the AOT launch above, where a specialized count would be a constant or
    divisible by 16: up to three binaries per kernel."""
    from launch_classes import differences, recorded_launches
    compile_namespace = {}
    exec(COMPILE, compile_namespace)
    aot = compile_namespace["aot"]
    history, counts, scale = torch.zeros(HISTORY), torch.zeros(3, dtype=torch.int64), torch.tensor(0.5)
    with recorded_launches(monkeypatch, stub=True) as launches:
        for n, index in ((1, 1), (16, 2), (17, 2)):
            maxima = torch.rand(n)
            history_ops.scale(history, maxima, 448.0, direct=True)
            history_ops.record(history, counts, index, maxima, scale, 464.0, False, direct=True)
    assert len(launches) == 6
    for launch, kernel in zip(launches, ("scale", "record") * 3):
        assert differences(launch, aot(kernel), monkeypatch) == {}, (kernel, launch[1])
