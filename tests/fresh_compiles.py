"""A test file's ahead-of-time compiles, all in one fresh Python process.

A process that ran interpreted kernels cannot AOT-compile (the interpreter patches Triton's
language module for the whole process), and pytest's process runs them; so the ISA tests of
kernels that are not rungs (:func:`workbench.isa.inspect` compiles rungs in its own way)
compile in a child process. Importing torch and the kernels there costs seconds, each compile
a fraction of one, so a file sends all its compiles to one child at once: :func:`results`.

The child runs ``JOBS = <the jobs>`` (a literal: no ``str.format`` braces to double), then
defines :func:`summary`, then the file's body, which defines ``result(job)``: the JSON-able
outcome of one job (or, where it raised, the traceback). It prints the list of outcomes as
its last line of stdout.
"""
from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_S = 600
SUMMARY = '''
import json


def summary(kernel, **extra):
    """A compiled AMD kernel (``compile_aot``'s dict): its resources (registers, spills,
    scratch, occupancy), LDS bytes and op histograms per class, with ``extra``'s fields."""
    from workbench.isa import parse as isa_parse

    lines = isa_parse.code_lines(kernel["asm"], "amdgcn")
    return dict(resources=isa_parse.amdgpu_resources(kernel["asm"]), lds=kernel["shared"],
                ops={c: dict(v) for c, v in isa_parse.histograms(lines, "amdgcn").items()}, **extra)
'''
ERROR = "__fresh_compile_error__"
RUN = f"""
import traceback


def _guarded(job):
    try:
        return result(job)
    except Exception:   # this job's failure, not its batch's: the others' outcomes stand
        return {{{ERROR!r}: traceback.format_exc()[-3000:]}}


print(json.dumps([_guarded(job) for job in JOBS]))
"""


class FreshCompileError(RuntimeError):
    """The child process failed (or hung, or printed no outcome per job), or one job raised."""


class Outcomes(dict):
    """{job: outcome}; asking for a job that raised in the child raises its traceback (only
    that job's cases fail: a gfx950 toolchain break leaves the gfx942 cases their results)."""

    def __getitem__(self, job):
        value = super().__getitem__(job)
        if isinstance(value, dict) and ERROR in value:
            raise FreshCompileError(f"job {job!r} raised in the child:\n{value[ERROR]}")
        return value

    def items(self):
        return [(job, self[job]) for job in self]

    def values(self):
        return [self[job] for job in self]


def script(body: str, jobs: tuple) -> str:
    """The child's program: ``jobs`` as a literal, :func:`summary`, ``body``, the printing."""
    return f"JOBS = {jobs!r}\n{SUMMARY}\n{body}\n{RUN}"


@functools.cache
def _outcome(body: str, jobs: tuple) -> dict | str:
    """{job: result}, or the failure's message: cached either way, so a file's other cases
    neither rerun a failing batch nor wait for it again (functools.cache keeps no exception)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    try:
        done = subprocess.run([sys.executable, "-c", script(body, jobs)], capture_output=True, text=True,
                              env=env, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as hung:
        stderr = hung.stderr.decode(errors="replace") if isinstance(hung.stderr, bytes) else hung.stderr or ""
        return f"the compiles ran past {TIMEOUT_S} s\n{stderr[-3000:]}"
    if done.returncode != 0:
        return f"the compiles exited {done.returncode}\n{done.stderr[-3000:]}"
    try:
        outcomes = json.loads(done.stdout.splitlines()[-1])
        return Outcomes(zip(jobs, outcomes, strict=True))
    except (IndexError, ValueError) as error:   # no line, not JSON, or not one outcome per job
        return f"the compiles printed no outcome per job ({error})\n{done.stdout[-1000:]}\n{done.stderr[-3000:]}"


def results(body: str, jobs: tuple) -> dict:
    """{job: ``result(job)``} for each of ``jobs`` (hashable, their ``repr`` a Python literal),
    ``body`` run once per (body, jobs) in this process, in one fresh child process; raises
    :class:`FreshCompileError` with the child's stderr tail if it failed (each time asked),
    and with a job's traceback when that job is read (:class:`Outcomes`)."""
    outcome = _outcome(body, tuple(jobs))
    if isinstance(outcome, str):
        raise FreshCompileError(outcome)
    return outcome
