"""kernels.fp8.history_ops, delayed scaling's scale and record launches: bit for bit the torch
expressions they replace, on fresh random values with the edge cases (an empty history, an all-zero
tensor, an amax on and around each format's saturation limit), into poisoned outputs; the
custom ops' registrations (opcheck); and the record's compiled shift, which reads every old entry
before it writes one (gfx942, gfx950)."""
from __future__ import annotations

import pytest
import torch

from kernels.fp8 import history_ops
from kernels.fp8.recipes.delayed import HISTORY, _SATURATION, saturated
from kernels.outputs import poisoned_outputs

from fresh_compiles import results

FORMATS = (torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.float8_e5m2, torch.float8_e5m2fnuz)


def _reference_scale(seen, amax, fmax):
    ref = torch.where(seen > 0, seen, amax)
    return torch.where(ref > 0, ref / fmax, torch.ones_like(ref))


@pytest.mark.parametrize("fp8", FORMATS, ids=str)
def test_the_scale_is_the_torch_expressions(fp8):
    fmax = torch.finfo(fp8).max
    gen = torch.Generator().manual_seed(FORMATS.index(fp8))
    magnitudes = 10.0 ** torch.randint(-30, 30, (6,), generator=gen)
    values = [0.0, *(torch.rand(6, generator=gen, dtype=torch.float64) * magnitudes).tolist()]
    for seen in values:
        for amax in values:
            seen_t, amax_t = torch.tensor(seen, dtype=torch.float32), torch.tensor(amax, dtype=torch.float32)
            with poisoned_outputs():
                got = history_ops.scale(seen_t, amax_t, fmax)
            want = _reference_scale(seen_t, amax_t, fmax)
            assert got.shape == () and got.dtype == torch.float32
            assert torch.equal(got, want), (seen, amax, got, want)


@pytest.mark.parametrize("fp8", FORMATS, ids=str)
@pytest.mark.parametrize("history_len", [HISTORY, 5, 1])
def test_the_record_is_the_torch_expressions(fp8, history_len):
    """The amax enters first, the oldest entry drops out, and counts[index] gains 1 exactly where
    :func:`~kernels.fp8.recipes.delayed.saturated` says (on the limit too for the formats whose
    tie there rounds away from the max)."""
    gen = torch.Generator().manual_seed(history_len)
    limit, _ = _SATURATION[fp8]
    scale = torch.rand((), generator=gen) + 0.5
    edge = (scale * limit).item()
    for amax in (0.0, edge, torch.nextafter(torch.tensor(edge), torch.tensor(0.0)).item(),
                 torch.nextafter(torch.tensor(edge), torch.tensor(1e30)).item(), 3 * edge):
        history = torch.rand(history_len, generator=gen)
        counts = torch.randint(0, 5, (3,), generator=gen)
        amax_t = torch.tensor(amax, dtype=torch.float32)
        want_history = torch.cat([amax_t.reshape(1), history[:-1]])
        want_counts = counts.clone()
        want_counts[1] += saturated(amax_t, scale, fp8).to(torch.int64)
        history_ops.record(history, counts, 1, amax_t, scale, *_SATURATION[fp8])
        assert torch.equal(history, want_history) and torch.equal(counts, want_counts), (amax, edge)


def test_the_custom_ops_pass_opcheck():
    seen, amax = torch.tensor(0.0), torch.tensor(3.5)
    torch.library.opcheck(torch.ops.kernels.fp8_history_scale.default, (seen, amax, 448.0))
    torch.library.opcheck(torch.ops.kernels.fp8_record_amax.default,
                          (torch.rand(HISTORY), torch.zeros(3, dtype=torch.int64), 2, amax, torch.tensor(0.01),
                           464.0, False))


RECORD = """
import torch
from kernels.fp8 import history_ops
from kernels.triton_support import aot_launch
from workbench.isa import compile as isa_compile
from workbench.isa import parse as isa_parse


def result(arch):
    kernel = aot_launch(history_ops._record_kernel, torch.float8_e4m3fn, dict(num_warps=1), dict(index=2, H=16),
                        constexprs=dict(LIMIT=464.0, AT_LIMIT=False, BLOCK=16),
                        pointers=dict(history_ptr="*fp32", counts_ptr="*i64", amax_ptr="*fp32", scale_ptr="*fp32"))
    if arch == "sm_90":
        return isa_compile.compile_aot(kernel, ("cuda", 90, 32))["asm"].splitlines()
    return isa_parse.code_lines(isa_compile.compile_aot(kernel, ("hip", arch, 64))["asm"], "amdgcn")
"""


@pytest.mark.slow   # AOT compiles in a fresh process
@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_the_record_reads_the_whole_history_before_it_shifts_it(arch):
    """One load of the 16 entries, then a wait for it, then one store: no lane stores an entry
    another lane has yet to read (one wave is one workgroup: its barrier is the wait)."""
    lines = [line.split()[0] for line in results(RECORD, ("gfx942", "gfx950", "sm_90"))[arch]]
    vector = [i for i, op in enumerate(lines) if op.startswith(("buffer_", "global_"))]
    history_load, history_store = vector[0], vector[1]
    assert "load" in lines[history_load] and "store" in lines[history_store], lines
    assert "s_waitcnt" in lines[history_load:history_store], lines


@pytest.mark.slow
def test_on_nvidia_a_barrier_separates_the_records_loads_from_its_stores():
    """Lanes of an NVIDIA warp are not ordered without a barrier: bar.sync between the history's
    load and its shifted store."""
    ptx = [line.strip() for line in results(RECORD, ("gfx942", "gfx950", "sm_90"))["sm_90"]]
    store = next(i for i, line in enumerate(ptx) if "st.global" in line)           # the shifted history
    load = max(i for i, line in enumerate(ptx[:store]) if "ld.global" in line)     # its old entries
    assert any(line.startswith(("bar.sync", "barrier.sync")) for line in ptx[load:store]), ptx
