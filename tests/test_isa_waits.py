"""isa_waits names what each s_waitcnt retires: a hand-made loop, then the claims notebook 01
makes about v4's and v5's gfx942 hot loops and v4's gfx950 LDS reads, against compiled code."""
from __future__ import annotations

from collections import Counter

from workbench import isa
from workbench.isa import waits as isa_waits
from workbench.isa.parse import mnemonic

LOOP = """
.LBB0_1:
\tbuffer_load_dwordx4 v[0:3], v9, s[0:3], 0 offen
\tds_read_b128 v[4:7], v8
\tds_read_b128 v[10:13], v8 offset:16
\ts_waitcnt lgkmcnt(1)
\tv_mfma_f32_16x16x16_bf16 v[20:23], v[4:5], v[4:5], v[20:23]
\ts_waitcnt vmcnt(0) lgkmcnt(0)
\tds_write_b128 v8, v[0:3]
\ts_cbranch_scc1 .LBB0_1
"""


def test_a_wait_retires_all_but_the_most_recent_n():
    first, second = isa_waits.waits(LOOP)
    assert [text for text, _ in first.retires] == ["ds_write_b128 v8, v[0:3]", "ds_read_b128 v[4:7], v8"]
    assert [previous for _, previous in first.retires] == [True, False]
    assert [mnemonic(t) for t, _ in second.retires] == ["buffer_load_dwordx4", "ds_read_b128"]
    assert first.summary() == "1 x ds_write_b128 (previous iteration), 1 x ds_read_b128"


def _v4(target="gfx942"):
    return isa.inspect("gemm", "v4", target)


def test_v4_waits_as_the_notebook_reads_them():
    loop = _v4().hot_loop
    waits = isa_waits.waits(loop)
    assert [w.line for w in waits] == ["s_waitcnt lgkmcnt(0)", "s_waitcnt lgkmcnt(4)", "s_waitcnt vmcnt(0)",
                                       "s_waitcnt lgkmcnt(4)", "s_waitcnt lgkmcnt(3)", "s_waitcnt lgkmcnt(0)"]
    top, first_reads, globals_, *_, bottom = waits
    assert {mnemonic(t) for t, _ in top.retires} == {"ds_write_b128", "ds_write_b32"}
    assert all(previous for _, previous in top.retires)
    assert [mnemonic(t) for t, _ in first_reads.retires] == ["ds_read_b128"] * 4
    assert [mnemonic(t) for t, _ in globals_.retires] == ["buffer_load_dwordx4"] * 4
    assert not any(previous for _, previous in globals_.retires)
    assert {mnemonic(t) for t, _ in bottom.retires} == {"ds_read_b128"}
    body = [line.strip() for line in loop.splitlines() if mnemonic(line)]
    mfmas = [mnemonic(line).startswith("v_mfma") for line in body]
    assert sum(mfmas[:body.index("s_waitcnt vmcnt(0)")]) == 2 and sum(mfmas) == 32


def test_triton_pingpongs_v5_and_not_v4_on_gfx942():
    v4, v5 = _v4(), isa.inspect("gemm", "v5", "gfx942")
    assert "s_setprio" not in v4.asm and "sched_barrier" not in v4.asm
    loop = [m for m in map(mnemonic, v5.hot_loop.splitlines()) if m]
    assert loop.count("s_setprio") == 4 and "; sched_barrier" in v5.hot_loop
    assert "sched_group_barrier" not in v5.asm
    # each s_setprio 1 ... s_setprio 0 span holds one MFMA cluster of 31 (the first issues before it)
    lines = [line.strip() for line in v5.hot_loop.splitlines() if mnemonic(line)]
    raised = [i for i, line in enumerate(lines) if line == "s_setprio 1"]
    lowered = [i for i, line in enumerate(lines) if line == "s_setprio 0"]
    assert [sum(mnemonic(x).startswith("v_mfma") for x in lines[a:b]) for a, b in zip(raised, lowered)] == [31, 31]


def test_lds_read_widths_on_gfx942_and_gfx950():
    count = lambda report: Counter(m for m in map(mnemonic, report.hot_loop.splitlines()) if m and m.startswith("ds_"))
    cdna3, cdna4 = count(_v4("gfx942")), count(_v4("gfx950"))
    assert cdna3 == {"ds_read_b128": 12, "ds_write_b128": 2, "ds_write_b32": 8}
    assert cdna4 == {"ds_read_b128": 16, "ds_read_b64_tr_b16": 16}
