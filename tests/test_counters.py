"""The counter table: every story names a rung that exists and counters with a documented
meaning and source; the commands are well formed; bad arguments are named."""

import pytest

import kernels
from workbench.harness import counters


def test_every_story_is_about_a_registered_rung():
    for s in counters.STORIES:
        assert kernels.get(s.op, s.rung).label == s.rung, s


def test_every_counter_is_documented_with_a_known_source():
    used = {c for s in counters.STORIES for c in s.counters}
    assert used <= set(counters.COUNTERS), used - set(counters.COUNTERS)
    assert {src for _, src in counters.COUNTERS.values()} <= set(counters.SOURCES)
    assert all(c.isupper() or c.endswith("_sum") for c in used)   # hardware/derived names, not metrics


def test_commands_collect_the_story_counters():
    s = counters.story("gemm", "v4")
    cmd = counters.rocprofv3_command(s, "python bench.py")
    assert cmd.startswith("rocprofv3 --kernel-trace --pmc ") and cmd.endswith(" -- python bench.py")
    assert cmd.split("--pmc ")[1].split(" -d ")[0].split() == list(s.counters)
    profile, analyze = counters.rocprof_compute_commands(s, "python bench.py")
    assert profile == "rocprof-compute profile -n gemm_v4 -- python bench.py"
    assert analyze == "rocprof-compute analyze -p workloads/gemm_v4/MI300X"


def test_table_has_no_values_only_names():
    rows = counters.table()
    assert len(rows) == len(counters.STORIES)
    assert all(set(r) == {"op", "rung", "claim", "counters", "read", "sources"} for r in rows)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="rung='v9'"):
        counters.story("gemm", "v9")
    with pytest.raises(ValueError, match="app"):
        counters.rocprofv3_command(counters.STORIES[0], "  ")
