"""torch.profiler without the profiler's own log lines on stderr.

The CPU build of torch's profiler (Kineto) writes ``USDT: ... profiler_start`` and
``... profiler_stop`` from C++ straight to file descriptor 2 each time a profile starts
and stops, and no environment variable turns that off: a profiled training run prints
two such lines per step, which a notebook shows as a wall of red. :func:`profiled`
sends descriptor 2 to a file while the profile runs and passes on every other line.
"""
from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile

import torch

_PROFILER_LINE = re.compile(r"USDT:.*\] profiler_(start|stop)\s*$")


@contextlib.contextmanager
def without_profiler_lines():
    """Descriptor 2 goes to a file inside the block; afterwards every line of it but the
    profiler's start/stop lines is written to ``sys.stderr``."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            kept = [line for line in capture.read().decode(errors="replace").splitlines(keepends=True)
                    if not _PROFILER_LINE.match(line)]
            if kept:
                sys.stderr.write("".join(kept))


@contextlib.contextmanager
def profiled(activities):
    """``torch.profiler.profile(activities=...)`` whose start and stop lines are dropped."""
    with without_profiler_lines(), torch.profiler.profile(activities=activities) as prof:
        yield prof
