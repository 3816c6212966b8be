"""tests/fresh_compiles.py's batches, on bodies that compile nothing: outcomes per job, one
child per (body, jobs), and a failure's stderr in the error, raised again without a rerun."""
from __future__ import annotations

import subprocess

import pytest

import fresh_compiles
from fresh_compiles import FreshCompileError, results


def test_each_job_gets_its_result_from_one_child():
    body = "def result(job):\n    return {'twice': job[1] * 2, 'set': sorted({job[0]})}\n"
    jobs = (("a", 1), ("b", {"x": 3}["x"]))
    assert results(body, jobs) == {("a", 1): {"twice": 2, "set": ["a"]}, ("b", 3): {"twice": 6, "set": ["b"]}}


def test_a_job_that_raises_fails_its_cases_alone():
    body = "def result(job):\n    if job == 'gfx950':\n        raise RuntimeError('no compiler for ' + job)\n    return job\n"
    outcomes = results(body, ("gfx942", "gfx950"))
    assert outcomes["gfx942"] == "gfx942"
    with pytest.raises(FreshCompileError, match="(?s)job 'gfx950' raised.*RuntimeError: no compiler for gfx950"):
        outcomes["gfx950"]
    with pytest.raises(FreshCompileError, match="gfx950"):
        dict(outcomes.items())


def test_a_failing_batch_says_why_and_is_not_run_again(monkeypatch):
    body = "import sys\ndef result(job):\n    sys.exit('no compiler for ' + job)\n"
    with pytest.raises(FreshCompileError, match="exited 1\nno compiler for gfx0"):
        results(body, ("gfx0",))
    monkeypatch.setattr(subprocess, "run", lambda *args, **kwargs: pytest.fail("the batch ran again"))
    with pytest.raises(FreshCompileError, match="no compiler for gfx0"):
        results(body, ("gfx0",))


def test_a_batch_that_prints_no_outcome_per_job_fails(monkeypatch):
    monkeypatch.setattr(fresh_compiles, "RUN", "\nprint('[1]')\n")
    with pytest.raises(FreshCompileError, match="no outcome per job"):
        results("def result(job):\n    return job\n", (1, 2))
