"""Running the graded file's process with a time limit per step: a hang or a crash is a
graded failure with its message, never a crash or a hang of the grader.

The limit restarts at every step the worker announces (:mod:`.worker`): its own start
(torch, Triton and the op's package importing) gets :data:`STARTUP_S`, the file's import
``import_s``, each check or compile ``run_s``. A process that outlives its step is killed
with everything it started; one that dies is described by its signal or exit status and
the end of what it wrote to stderr.
"""
from __future__ import annotations

import os
import pickle
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

STARTUP_S = 300.0
STDERR_TAIL = 1500   # characters of the process's stderr kept for a crash's message


@dataclass
class Outcome:
    results: list[tuple[str, object]] = field(default_factory=list)
    failure: str | None = None       # why the process ended early (killed, crashed), else None
    failed_step: str | None = None
    seconds: float = 0.0

    def all(self, name: str) -> list:
        return [payload for kind, payload in self.results if kind == name]

    def first(self, name: str):
        found = self.all(name)
        return found[0] if found else None


def _read(stream, inbox: queue.Queue) -> None:
    try:
        while True:
            inbox.put(pickle.load(stream))
    except (EOFError, pickle.UnpicklingError, OSError):
        inbox.put(None)


def _death(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        meaning = {"SIGSEGV": "a segmentation fault", "SIGABRT": "an abort", "SIGBUS": "a bus error",
                   "SIGKILL": "killed (out of memory?)", "SIGFPE": "an arithmetic fault"}.get(name, "a signal")
        return f"the process died of {meaning} ({name})"
    return f"the process exited with status {returncode}"


def _tail(path: Path) -> str:
    text = path.read_text(encoding="utf-8", errors="replace").strip()
    return text[-STDERR_TAIL:] if text else ""


def run_worker(request: dict, import_s: float, run_s: float, compile_s: float | None = None) -> Outcome:
    """Run one stage of :mod:`.worker` on ``request``; collect its results until it is done,
    dies, or overruns a step's limit."""
    limits = {"startup": STARTUP_S, "import": import_s, "run": run_s, "compile": compile_s or run_s}
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    outcome = Outcome()
    started = time.monotonic()
    with tempfile.NamedTemporaryFile("w+b", suffix=".stderr") as err:
        proc = subprocess.Popen([sys.executable, "-m", "workbench.grade.worker"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=err, env=env, start_new_session=True)
        proc.stdin.write(pickle.dumps(request))
        proc.stdin.close()
        inbox: queue.Queue = queue.Queue()
        threading.Thread(target=_read, args=(proc.stdout, inbox), daemon=True).start()
        step, kind, deadline = "start", "startup", time.monotonic() + STARTUP_S
        while True:
            try:
                message = inbox.get(timeout=max(deadline - time.monotonic(), 0.0))
            except queue.Empty:
                _kill(proc)
                outcome.failure = (f"{step} did not finish within {limits[kind]:g} s (an endless loop or "
                                   f"a hang?): the process was killed")
                break
            if message is None:
                returncode = proc.wait()
                tail = _tail(Path(err.name))
                outcome.failure = f"{_death(returncode)} during {step}" + (f"; its stderr ends:\n{tail}" if tail else "")
                break
            if message[0] == "done":
                break
            if message[0] == "step":
                step, kind = message[1], message[2]
                deadline = time.monotonic() + limits[kind]
            else:
                outcome.results.append((message[1], message[2]))
        if outcome.failure:
            outcome.failed_step = step
        proc.wait()
    outcome.seconds = time.monotonic() - started
    return outcome


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
