"""`make compat`: the runner's pieces, and that its recorded matrix proves the stated range."""
from __future__ import annotations

import json
import sys

import pytest

from kernels.triton_version import GPU_RANGE, PARTIAL, minor, oldest
from workbench.isa import compat


@pytest.fixture(scope="module")
def record():
    return json.loads(compat.RECORDED.read_text())


def test_error_line_is_the_first_line_of_the_last_exception():
    chained = ("compiling gemm v2 for gfx950 failed:\nTraceback (most recent call last):\n"
               '  File "a.py", line 1, in f\n    g()\nKeyError: inner\n\n'
               "During handling of the above exception, another exception occurred:\n\n"
               'Traceback (most recent call last):\n  File "b.py", line 2, in h\n    raise X\n'
               "triton.compiler.errors.CompilationError: at 3:4:\n    x = tl.dot(a, b)\n")
    assert compat.error_line(chained) == "triton.compiler.errors.CompilationError: at 3:4:"
    assert compat.error_line("\nthe helper died\nmore") == "the helper died"


def test_newest_patch_of_each_minor_compares_numbers_and_skips_prereleases():
    listed = ["3.9.0", "3.10.0rc1", "3.7.1", "3.7.10", "3.7.0", "2.3.1", "3.8.0"]
    assert compat.newest_patches(listed) == ["2.3.1", "3.7.10", "3.8.0", "3.9.0"]


def test_a_release_run_compiles_real_cases_and_names_the_error_of_a_bad_one(tmp_path):
    todo = [{"op": "gemm", "rung": "v2", "target": "gfx942", "dtype": "bfloat16"},
            {"op": "gemm", "rung": "v9", "target": "sm90", "dtype": "bfloat16"}]
    release = compat.run_release(sys.executable, tmp_path, todo, 600, tmp_path / "cache")
    assert release["results"]["gemm v2 @ gfx942"] is None
    assert release["results"]["gemm v9 @ sm90"].startswith("KeyError: \"gemm has no rung 'v9'")
    assert minor(release["triton"]) >= GPU_RANGE[0]


def test_cases_left_when_the_time_is_up_say_so(tmp_path):
    todo = [{"op": "gemm", "rung": "v2", "target": "gfx942", "dtype": "bfloat16"}]
    release = compat.run_release(sys.executable, tmp_path, todo, 0.01, tmp_path / "cache")
    assert release["results"]["gemm v2 @ gfx942"].startswith("not run: the release's 0 s")


def test_matrix_shows_failing_targets_per_rung_and_counts_each_error():
    cases = [{"op": "gemm", "rung": "v2", "target": t, "dtype": "bfloat16"} for t in ("gfx942", "sm90")]
    record = {"cases": cases, "releases": {
        "3.3.1": {"results": {"gemm v2 @ gfx942": "E: boom", "gemm v2 @ sm90": "E: boom"}},
        "3.4.0": {"results": {"gemm v2 @ gfx942": None, "gemm v2 @ sm90": "E: other"}},
        "3.5.1": {"results": {"gemm v2 @ gfx942": None, "gemm v2 @ sm90": None}}}}
    table, errors = compat.matrix(record).split("\n\nErrors:\n")
    assert [cell.strip() for cell in table.splitlines()[2].split("|")[1:-1]] == [
        "gemm v2", "fails all", "fails sm90", "ok"]
    assert errors.splitlines() == ["- 3.3.1: E: boom (2 of 2)", "- 3.4.0: E: other (1 of 2)"]


def test_recorded_matrix_covers_every_triton_rung_registered_now(record):
    assert record["cases"] == compat.cases()


def test_recorded_matrix_proves_the_stated_gpu_range(record):
    """GPU_RANGE compiles everything, each PARTIAL minor misses exactly what it lists, and
    every older minor compat ran misses more (so warning, not refusing, could not go lower)."""
    by_minor = {minor(v): release for v, release in record["releases"].items()}
    floor, newest = GPU_RANGE
    assert max(by_minor) == newest, "the range goes up to the newest release compat ran"
    assert sorted(m for m in by_minor if floor <= m) == [(floor[0], m) for m in range(floor[1], newest[1] + 1)]
    assert all(m < floor for m in PARTIAL)
    least = set(PARTIAL.get(oldest(), ()))
    for m, release in by_minor.items():
        failing = {case for case, error in release["results"].items() if error is not None}
        if m >= floor:
            assert not failing, m
        elif m >= oldest():
            assert failing == set(PARTIAL.get(m, ())), m
        else:
            assert failing > least, m
    below = (oldest()[0], oldest()[1] - 1)
    assert below in by_minor, f"compat ran no {below[0]}.{below[1]}: the oldest is not shown to be"
