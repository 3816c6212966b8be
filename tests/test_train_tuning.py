"""The training benchmark tunes first: a pass times the kernels' candidates, the steps then
neither time nor wait for the device (the bar: no host syncs in the step loop after the pass).

On the interpreter each tuned rung has one candidate, so GEMM gets three fake ones here:
the pass then has keys to time (with a fake clock), and a step that timed would show.
"""
from __future__ import annotations

import pytest

from kernels import tuning, tuning_cache
from kernels.gemm import configs as gemm_configs
from workbench import cli, train
from workbench.train import loop
from workbench.train import tuning_pass as tuning_pass_module

SPACE = [gemm_configs._cfg(32, 32, 32, 4, 2, group_m=2), gemm_configs._cfg(16, 32, 16, 4, 2, group_m=2),
         gemm_configs._cfg(32, 16, 32, 4, 2, group_m=2)]


@pytest.fixture
def timed(monkeypatch):
    """Three GEMM candidates and a fake clock (every candidate 1 ms, none launched); the
    list of the candidates timed."""
    monkeypatch.setattr(gemm_configs, "space", lambda backend, arch="gfx942", dtype=None: SPACE)
    calls = []
    monkeypatch.setattr(tuning, "time_ms", lambda fn: calls.append(fn) or 1.0)
    return calls


def _after_the_pass(monkeypatch, then):
    """Run ``then(report)`` right after the run's tuning pass."""
    real = loop.tuning_pass

    def tuning_pass(*args):
        report = real(*args)
        then(report)
        return report
    monkeypatch.setattr(loop, "tuning_pass", tuning_pass)


def _no_timing(monkeypatch):
    monkeypatch.setattr(tuning, "time_ms", lambda fn: pytest.fail("a step timed a kernel"))


def test_the_run_tunes_first_and_its_steps_neither_time_nor_sync(monkeypatch, timed, trap_host_syncs):
    passes, reads = [], []

    def trap(report):
        passes.append(report)
        _no_timing(monkeypatch)
        reads.append(trap_host_syncs(allowed=(loop._read,)))
    _after_the_pass(monkeypatch, trap)
    monkeypatch.setattr(loop, "READ_EVERY", 2)
    rows = train.run("cpu-smoke", "workbench", steps=3, progress=False)
    (report,), (allowed,) = passes, reads
    assert report.count("timed") > 0 and len(timed) == 3 * report.count("timed")
    assert {r["tuning_s"] for r in rows} == {report.seconds} and report.seconds > 0
    assert [r["untuned"] for r in rows] == [0, 0, 0]
    assert allowed == ["tolist", "tolist"] * 2          # steps 1-2 read together, then step 3
    assert [r["step"] for r in rows] == [1, 2, 3] and all(r["step_ms"] > 0 for r in rows)


def test_keys_the_pass_did_not_meet_run_untuned_and_untimed(monkeypatch, timed, tmp_path):
    passes = []

    def forget_its_choices(report):
        passes.append(report)
        monkeypatch.setenv(tuning_cache.ENV_DIR, str(tmp_path / "empty"))
        tuning.forget()
        _no_timing(monkeypatch)
    _after_the_pass(monkeypatch, forget_its_choices)
    rows = train.run("cpu-smoke", {"gemm": "workbench"}, steps=1, progress=False)
    assert rows[0]["untuned"] == passes[0].count("timed") > 0


def test_cli_tune_times_a_presets_keys_and_says_where_they_went(timed, capsys):
    assert cli.main(["tune", "--preset", "cpu-smoke", "--kernels", "gemm=workbench"]) == 0
    out = capsys.readouterr().out
    assert "gemm/v6" in out and " timed " in out and tuning_cache.store().path.name in out
    assert tuning_cache.store().path.exists() and timed


def test_the_run_ranks_with_the_model_and_then_restores_the_prior(monkeypatch, timed):
    """The run's tuning pass and steps rank with the performance model (here, on the
    interpreter, it declines: the pass still times every fake candidate); after the run
    the tuners are back to the prior."""
    from workbench.model import tuning as tuning_model

    during = []
    _after_the_pass(monkeypatch, lambda report: during.append((type(tuning._ranker), report.count("timed"))))
    train.run("cpu-smoke", {"gemm": "workbench"}, steps=1, progress=False)
    (ranker, timed_keys), = during
    assert ranker is tuning_model.ModelRanker and len(timed) == 3 * timed_keys > 0
    assert tuning._ranker is None
    seen = []
    monkeypatch.setattr(tuning_pass_module, "tuning_pass", lambda *args: seen.append(type(tuning._ranker)))
    train.tune("cpu-smoke", {"gemm": "workbench"})
    assert seen == [tuning_model.ModelRanker] and tuning._ranker is None
