"""The progress file under stress: parallel writers, a corrupt file, a foreign one, a read-only one."""
from __future__ import annotations

import multiprocessing
import os
import time
import warnings

import pytest

from workbench import exercises
from workbench.cli import main
from workbench.learn.exercises import progress

WORKERS, ATTEMPTS = 4, 40


@pytest.fixture(autouse=True)
def _private(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_PROGRESS", str(tmp_path / "progress.json"))


def _attempts(path: str) -> list[str]:
    """One worker: ATTEMPTS attempts on one shared exercise; returns what went wrong."""
    problems = []
    for i in range(ATTEMPTS):
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                progress.record_attempt("gemm/v1", i % 2 == 0, f"attempt {i}", path)
            problems += [str(w.message) for w in caught]
        except Exception as exc:  # noqa: BLE001 - every failure is reported to the parent
            problems.append(f"{type(exc).__name__}: {exc}")
    return problems


@pytest.mark.timeout(300)
def test_four_processes_recording_at_once_lose_nothing(tmp_path):
    path = str(tmp_path / "progress.json")
    with multiprocessing.get_context("fork").Pool(WORKERS) as pool:
        problems = pool.map_async(_attempts, [path] * WORKERS).get(timeout=240)
    assert [p for per_worker in problems for p in per_worker] == []
    entry = progress.load(path)["gemm/v1"]
    assert entry["attempts"] == WORKERS * ATTEMPTS and entry["passed"] is True


@pytest.mark.parametrize("damage", [b"{not json", b"", b"\xff\xfe\x00binary", b"[" * 100_000])
def test_a_corrupt_file_is_moved_aside_and_a_new_one_started(damage):
    file = progress.progress_path()
    file.write_bytes(damage)
    with pytest.warns(progress.ProgressWarning, match="not valid JSON; moved it to .*corrupt"):
        assert progress.load() == {}
    [aside] = file.parent.glob("progress.json.corrupt-*")
    assert aside.read_bytes() == damage and not file.exists()
    assert progress.record_attempt("gemm/v1", True, "ok")["attempts"] == 1
    assert progress.load()["gemm/v1"]["passed"] is True


def test_recording_into_a_corrupt_file_restarts_it():
    progress.progress_path().write_text('{"gemm/v1": {"attem')
    with pytest.warns(progress.ProgressWarning, match="started a new progress file"):
        assert exercises.hints("gemm/v1").shown == 0
    progress.progress_path().write_text('{"gemm/v1": {"attem')
    with pytest.warns(progress.ProgressWarning, match="started a new progress file"):
        progress.record_hints("gemm/v1", 2)
    assert progress.load()["gemm/v1"]["hints"] == 2


@pytest.mark.parametrize("text, message", [
    ("[]", "holds an array"),
    ("null", "holds null"),
    ("5", "holds a number"),
    ('{"gemm/v1": []}', "the entry for 'gemm/v1' is not exercise progress"),
    ('{"gemm/v1": {"passed": false, "attempts": "3", "hints": 0, "last_message": "", "updated": ""}}',
     "the entry for 'gemm/v1'"),
    ('{"gemm/v1": {"passed": 1, "attempts": 3, "hints": 0, "last_message": "", "updated": ""}}',
     "the entry for 'gemm/v1'"),
])
def test_json_that_is_not_progress_is_an_error_naming_the_file(text, message, capsys):
    file = progress.progress_path()
    file.write_text(text)
    with pytest.raises(progress.ProgressFileError, match=message) as caught:
        progress.record_attempt("gemm/v1", True, "ok")
    assert str(file) in str(caught.value) and file.read_text() == text   # left alone
    assert main(["exercise", "list"]) == 2
    assert str(file) in capsys.readouterr().err


def test_a_read_only_file_still_shows_the_grade_and_warns(monkeypatch, capsys):
    file = progress.progress_path()
    progress.record_attempt("gemm/v0-bytes", False, "earlier")
    before = file.read_text()
    file.chmod(0o444)
    if os.geteuid() == 0:   # root may write anything: show it what anyone else would see
        access = os.access
        monkeypatch.setattr(os, "access", lambda p, mode: False if str(p) == str(file) else access(p, mode))
    with pytest.warns(progress.ProgressWarning, match=f"progress not saved to {file}.*read-only"):
        verdict = exercises.check("gemm/v0-bytes", answer=1)
    assert not verdict.passed and "not the answer" in verdict.message
    with pytest.warns(progress.ProgressWarning, match="not saved"):
        assert main(["exercise", "check", "gemm/v0-bytes", "--answer", "1"]) == 1
    assert "not the answer" in capsys.readouterr().out
    assert file.read_text() == before


def test_a_refused_write_still_returns_the_counted_entry(monkeypatch):
    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(progress.progress_path()))
    monkeypatch.setattr(progress, "write_atomic", refuse)
    with pytest.warns(progress.ProgressWarning, match="not saved"):
        entry = progress.record_attempt("gemm/v1", True, "ok")
    assert entry["attempts"] == 1 and entry["passed"] and not progress.progress_path().exists()


def test_a_lock_held_too_long_still_shows_the_grade(monkeypatch):
    file = progress.progress_path()
    monkeypatch.setattr(progress, "LOCK_TIMEOUT_S", 0.2)
    fork = multiprocessing.get_context("fork")
    ready = fork.Event()
    holder = fork.Process(target=_hold_lock, args=(file, ready))
    holder.start()
    try:
        assert ready.wait(60)
        with pytest.warns(progress.ProgressWarning, match=f"progress not saved to {file}.*lock"):
            entry = progress.record_attempt("gemm/v1", True, "ok")
        assert entry["attempts"] == 1 and not file.exists()
    finally:
        holder.terminate()
        holder.join(60)


def _hold_lock(file, ready) -> None:
    with progress._lock(file):
        ready.set()
        time.sleep(120)
