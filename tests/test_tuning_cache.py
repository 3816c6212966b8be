"""kernels.tuning.choice, its on-disk cache and the tuning pass: what is timed, when, and what is kept.

A fake op stands for the tuned rungs: its candidates carry their own "milliseconds", and
``time_ms`` (the tuner's clock) runs the launch and returns what it answers. The conftest
gives every test an empty cache folder of its own.
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from triton.runtime.errors import OutOfResources

import kernels
from kernels import tuning, tuning_cache
from kernels.comm.launch import run_local

ROOT = Path(__file__).resolve().parent.parent
OP, KEY = "test/op", (64, 128, torch.bfloat16, "NT", True)
SPACE = [{"BLOCK_M": 32, "ms": 3.0}, {"BLOCK_M": 16, "ms": 1.0}, {"BLOCK_M": 64, "ms": 2.0}]


@pytest.fixture
def no_clock(monkeypatch):
    monkeypatch.setattr(tuning, "time_ms", lambda fn: pytest.fail("timed"))


def _choose(key=KEY, space=SPACE):
    return tuning.choice(OP, key, lambda: space, lambda cfg: cfg["ms"])


def test_the_fastest_is_timed_once_and_kept_for_the_process(clock):
    assert _choose() == SPACE[1] and clock == [3.0, 1.0, 2.0]
    assert _choose() == SPACE[1] and len(clock) == 3


def test_a_choice_persists_and_another_process_reads_it_untimed(clock):
    assert _choose() == SPACE[1]
    script = ("import json, torch\nfrom kernels import tuning\n"
              "tuning.time_ms = lambda fn: 1 / 0\n"
              f"print(json.dumps(tuning.choice({OP!r}, (64, 128, torch.bfloat16, 'NT', True), "
              f"lambda: {SPACE!r}, lambda cfg: cfg['ms'])))")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.splitlines()[-1]) == SPACE[1]


@pytest.mark.parametrize("change", ["torch", "triton", "kernels", "arch"])
def test_another_arch_or_version_is_a_miss(clock, monkeypatch, change):
    import triton

    assert _choose() == SPACE[1] and len(clock) == 3
    before = tuning_cache.store().path
    tuning.forget()
    if change == "torch":
        monkeypatch.setattr(torch, "__version__", "9.9.9")
    elif change == "triton":
        monkeypatch.setattr(triton, "__version__", "9.9.9")
    elif change == "kernels":
        monkeypatch.setattr(tuning_cache, "_package_version", lambda: "9.9.9")
    else:
        other = dataclasses.replace(kernels.backend.current(), arch="gfx950")
        monkeypatch.setattr(tuning_cache.backend, "current", lambda: other)
    assert _choose() == SPACE[1] and len(clock) == 6          # timed again
    assert tuning_cache.store().path != before and before.exists()
    assert tuning_cache.store().path.name.startswith("gfx950-" if change == "arch" else "cpu-")


@pytest.mark.parametrize("content", ["{not json", "[]", '{"schema": "other", "version": 1}', "\xff"])
def test_a_corrupt_or_foreign_file_is_ignored_with_a_warning_and_replaced(clock, content):
    path = tuning_cache.store().path
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content.encode("latin-1"))
    with pytest.warns(tuning_cache.TuningCacheWarning, match="ignored"):
        assert _choose() == SPACE[1]
    assert len(clock) == 3 and json.loads(path.read_text())["choices"][OP]


def test_a_file_of_another_identity_at_the_path_is_ignored(clock):
    assert _choose() == SPACE[1]
    path = tuning_cache.store().path
    doc = json.loads(path.read_text())
    path.write_text(json.dumps({**doc, "identity": {**doc["identity"], "torch": "1.0"}}))
    tuning.forget()
    with pytest.warns(tuning_cache.TuningCacheWarning, match="made for"):
        assert _choose() == SPACE[1]
    assert len(clock) == 6


def test_an_unwritable_cache_warns_and_the_choice_still_holds(clock, tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(tuning_cache.ENV_DIR, str(blocker / "tuning"))
    tuning.forget()
    with pytest.warns(tuning_cache.TuningCacheWarning, match="not saved"):
        assert _choose() == SPACE[1]
    assert _choose() == SPACE[1] and len(clock) == 3


def test_a_kept_choice_that_is_no_longer_a_candidate_is_timed_again(clock):
    assert _choose() == SPACE[1]
    tuning.forget()
    assert _choose(space=[SPACE[0], SPACE[2]]) == SPACE[2] and clock[3:] == [3.0, 2.0]


def test_the_file_lives_in_the_user_cache_unless_the_variable_moves_it(monkeypatch, tmp_path):
    ident = tuning_cache.identity()
    monkeypatch.delenv(tuning_cache.ENV_DIR)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert tuning_cache.path(ident).parent == tmp_path / "amd-kernel-workbench" / "tuning"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert tuning_cache.path(ident).parent == Path.home() / ".cache" / "amd-kernel-workbench" / "tuning"
    monkeypatch.setenv(tuning_cache.ENV_DIR, str(tmp_path / "x"))
    assert tuning_cache.path(ident).parent == tmp_path / "x"


def test_keys_must_be_plain(clock):
    with pytest.raises(TypeError, match="tuning key .* device"):
        _choose(key=(1, torch.device("cpu")))


def test_frozen_mode_takes_the_first_candidate_untimed_and_notes_it(no_clock, monkeypatch):
    with tuning.mode("frozen"), tuning.recording() as seen:
        assert _choose() == SPACE[0]
    assert seen == {(OP, tuning_cache.key_text(KEY)): ("untuned", SPACE[0])}
    assert not tuning_cache.store().path.exists()
    timed = []
    monkeypatch.setattr(tuning, "time_ms", lambda fn: timed.append(fn()) or timed[-1])
    assert _choose() == SPACE[1] and len(timed) == 3     # not kept: a later pass times it
    with pytest.raises(ValueError, match="tuning mode"):
        with tuning.mode("fast"):
            pass


def test_graph_capture_never_times_and_takes_the_kept_choice(clock, monkeypatch):
    assert _choose() == SPACE[1]
    tuning.forget()
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    monkeypatch.setattr(tuning, "time_ms", lambda fn: pytest.fail("timed during capture"))
    with tuning.recording() as seen:
        assert _choose() == SPACE[1]                          # kept on disk
        assert _choose(key=(1, 2)) == SPACE[0]                # new: the prior, untimed
    assert seen[(OP, "[1, 2]")][0] == "untuned" and seen[(OP, tuning_cache.key_text(KEY))][0] == "cached"


def test_an_enclosing_recording_sees_the_keys_of_an_inner_one(no_clock):
    with tuning.recording() as outer:
        with tuning.recording() as inner:
            _choose(space=SPACE[:1])
        _choose(key=(2,), space=SPACE[:1])
    assert list(inner) == [(OP, tuning_cache.key_text(KEY))] and len(outer) == 2


def test_one_candidate_is_never_timed_nor_written(no_clock):
    with tuning.recording() as seen:
        assert _choose(space=SPACE[:1]) == SPACE[0]
    assert list(seen.values()) == [("only", SPACE[0])]
    assert not tuning_cache.store().path.exists()


# -- the pass ------------------------------------------------------------------------

def test_tune_runs_forward_and_backward_and_reports_every_key():
    layer = kernels.nn.Linear(16, 8, bias=False)
    x = torch.randn(4, 16, requires_grad=True)
    report = kernels.tune(layer, x)
    assert layer.weight.grad is not None and x.grad is not None and report.seconds > 0
    hows = {how for how, _ in report.keys.values()}
    assert {op for op, _ in report.keys} == {"gemm/v6"} and hows == {"only"}   # the interpreter
    assert len(report.keys) == 3          # forward, dX and dW: three layouts or shapes
    assert report.count("only") == 3 and len(report.rows()) == 3


def _rank_tunes(rank, world, folder):
    """Each rank's clock makes a different candidate fastest, and rank 1 meets a key of its
    own; after the pass, every rank chooses rank 0's untimed, rank 1 its own for its key."""
    os.environ[tuning_cache.ENV_DIR] = f"{folder}/rank{rank}"   # no file shared between ranks
    tuning.forget()
    tuning.time_ms = lambda fn: fn()
    fastest = SPACE[rank]

    def model():
        for key in [KEY, ("rank 1 only",)][:rank + 1]:
            tuning.choice(OP, key, lambda: SPACE, lambda cfg: 0.0 if cfg == fastest else 5.0)
    kernels.tune(model)
    tuning.time_ms = lambda fn: 1 / 0
    with tuning.mode("frozen"):
        own = _choose(key=("rank 1 only",)) if rank else None
        return _choose(), own, json.loads(tuning_cache.store().path.read_text())["choices"][OP]


def test_data_parallel_ranks_take_rank_0s_choices(tmp_path):
    (choice0, _, disk0), (choice1, own1, disk1) = run_local(_rank_tunes, 2, str(tmp_path), timeout=120)
    assert choice0 == choice1 == SPACE[0] and own1 == SPACE[1]
    shared = tuning_cache.key_text(KEY)
    assert disk0 == {shared: SPACE[0]} and disk1 == {shared: SPACE[0], '["rank 1 only"]': SPACE[1]}


def test_two_processes_saving_at_once_both_keep_theirs():
    ident = tuning_cache.identity()
    first, second = tuning_cache.Store(ident), tuning_cache.Store(ident)
    assert first.get(OP, "a") is None and second.get(OP, "b") is None   # both read the empty file
    first.put({OP: {"a": SPACE[0]}})
    second.put({OP: {"b": SPACE[1]}})
    assert tuning_cache.Store(ident).choices() == {OP: {"a": SPACE[0], "b": SPACE[1]}}


def _launch_or_refuse(cfg):
    """A candidate's launch: its "milliseconds", or Triton's refusal of a config the device cannot hold."""
    if cfg.get("refused"):
        raise OutOfResources(98304, 65536, "shared memory")
    return cfg["ms"]


def test_a_candidate_the_device_cannot_launch_is_skipped_as_tritons_autotuner_skips_it(clock):
    """On a device or dtype its table section was not compiled for, a candidate may need more
    LDS than a CU has: it is never the fastest, and the others are still timed."""
    space = [{"BLOCK_M": 128, "ms": 0.5, "refused": True}, *SPACE]
    assert tuning.choice(OP, KEY, lambda: space, _launch_or_refuse) == SPACE[1] and clock == [3.0, 1.0, 2.0]


def test_when_no_candidate_can_launch_the_refusal_is_raised(clock):
    space = [{"BLOCK_M": b, "ms": 1.0, "refused": True} for b in (64, 128)]
    with pytest.raises(OutOfResources, match="shared memory"):
        tuning.choice(OP, KEY, lambda: space, _launch_or_refuse)


def test_float32_reads_its_own_section_of_a_table_where_it_has_one(tmp_path):
    table = tmp_path / "tuned_space.json"
    table.write_text(json.dumps({"targets": {"gfx942": {}, "gfx942:fp32": {}, "sm90": {}}}))
    assert tuning.target(table, "hip", "gfx942", torch.float32) == "gfx942:fp32"
    assert tuning.target(table, "hip", "gfx942", torch.bfloat16) == "gfx942"
    assert tuning.target(table, "hip", "gfx942", torch.float16) == "gfx942"
    assert tuning.target(table, "hip", "gfx90a", torch.float32) == "gfx942:fp32"   # an AMD arch not compiled
    assert tuning.target(table, "cuda", "sm_90", torch.float32) == "sm90"           # no float32 section: the target's
