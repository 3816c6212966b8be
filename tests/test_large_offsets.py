"""Operands whose element offsets pass 2^31: every rung of every op, on the interpreter.

Triton passes int arguments below 2^31 as i32, so ``rows * stride_am`` wraps unless the
kernel widens it to int64. The operands here are views into one large, mostly untouched
allocation (a few GiB of virtual memory, a few pages touched): A's rows and B's columns
(attention: the heads of q, k and v) sit 2^30 + 16 elements apart, so the third one
starts past 2^31 while the problem itself stays tiny (3 x 3 x 64; 3 heads of 17 x 32).
A wrapped offset reads the wrong memory (or faults), so the ops run in a subprocess and
a crash is reported as a failure: all ops in one first (importing torch and the kernels
costs seconds, an op's probe a fraction of one), then each op that did not pass there
(a rung failed, it crashed or hung, or a crash or hang came before its turn; after any
crash, every op) alone in one of its own, which judges it as before. The scales of the
scaled GEMMs (one per row of A, per column of B) are moved the same way. Only forward
outputs are judged: attention's backward kernels do not run here.
"""
from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path

import pytest

import kernels

STRIDE = 2**30 + 16         # the third row/column/head starts at element 2^31 + 32
BUFFER = 2**31 + 2**16      # elements per dtype; operands start SPACING apart in it
SPACING = 8192
# Per op, a small problem in which some dimension of every operand is 3 (GEMM: M and N;
# attention: the heads, B x Hq x Hkv x S x S_k x D x causal; grouped GEMM: the rows of x
# and the groups of w, T x K x N x G x routing, also for FP8; MoE layer: the tokens and the
# experts, T x dim x hidden x E x top_k x routing). A new op adds its shape here.
SHAPES = {"attention": (1, 3, 3, 17, 17, 32, 1), "grouped_gemm": (3, 64, 8, 3, 0),
          "grouped_gemm_fp8": (3, 64, 8, 3, 0), "grouped_gemm_mxfp8": (3, 64, 8, 3, 0),
          "moe": (3, 64, 8, 3, 2, 0)}
GEMM_SHAPE = (3, 3, 64)


def shape_for(op: str) -> tuple:
    if op in SHAPES:
        return SHAPES[op]
    assert kernels.spec(op).shape_names == ("M", "N", "K"), f"add a shape for {op} to SHAPES"
    return GEMM_SHAPE


def relocated(tensor, buffer, start):
    """``tensor`` copied into ``buffer`` with its dimension of size 3 STRIDE elements
    apart and the other dimensions packed below it, in their order."""
    wide = list(tensor.shape).index(3)
    rest = [n for i, n in enumerate(tensor.shape) if i != wide]
    inner = [1] * len(rest)
    for i in range(len(rest) - 2, -1, -1):
        inner[i] = inner[i + 1] * rest[i + 1]
    strides = inner[:wide] + [STRIDE] + inner[wide:]
    view = buffer[start:].as_strided(tuple(tensor.shape), tuple(strides))
    view.copy_(tensor)
    return view


def relocate_operands(inputs: list) -> list:
    """Every operand spanning a dimension of size 3 (A, B, per-row/column scales; q, k, v)
    moved into large buffers (one per dtype, virtual memory only), so its last slice along
    that dimension starts past 2^31."""
    import torch

    buffers, moved = {}, []
    for x in inputs:
        if isinstance(x, torch.Tensor) and x.dim() >= 2 and 3 in x.shape:
            buffer = buffers.setdefault(x.dtype, torch.empty(BUFFER, dtype=x.dtype))
            x = relocated(x, buffer, SPACING * len(moved))
            assert max(x.stride()) * 2 >= 2**31
        moved.append(x)
    return moved


def probe(op: str) -> int:
    """Run every rung of ``op`` that runs here on relocated operands; print a line each."""
    import torch

    from workbench.check import compare

    spec = kernels.spec(op)
    failures = 0
    for rung in [r for r in kernels.variants(op) if r.runs_here()]:
        dtype = torch.float16 if torch.float16 in rung.dtypes else rung.dtypes[0]
        inputs = relocate_operands(list(spec.make_inputs(shape_for(op), dtype, seed=3)))
        print(f"{rung.title}: start", flush=True)
        out = rung(*inputs)
        fields = compare(out, spec.reference(*inputs), kernels.registry.reference_rung(op)(*inputs),
                         out.dtype)
        failures += not fields["passed"]
        print(f"{rung.title}: {'pass' if fields['passed'] else 'FAIL'} error {fields['error']:.2e} "
              f"allowed {fields['allowed']:.2e}", flush=True)
    return failures


def _probe_in_subprocess(*ops: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(Path(__file__).resolve()), *ops], capture_output=True,
                          text=True, timeout=600, cwd=Path(__file__).resolve().parent.parent)


def passed_in(stdout: str, returncode: int | None, ops: tuple[str, ...]) -> set[str]:
    """The ops a probe of ``ops`` in turn vouches for: an op's lines, which end with ``DONE op
    failures``, have a rung's pass, no FAIL and no failure counted. An op at or after a crash
    has no such end. ``returncode`` None: the probe hung and was stopped, and the ops that
    ended before count. Otherwise the run must have ended every op and exited with the
    failures the DONE lines count (the probe's exit code, below): a crash after the last DONE
    line, or one before, may come from memory an earlier op's wrapped offset wrote, so then
    no op counts."""
    passed, ended, failed, lines = set(), set(), 0, []
    for line in stdout.splitlines():
        if line.startswith("DONE "):
            _, op, failures = line.split()
            text = "\n".join(lines)
            if failures == "0" and ": pass" in text and "FAIL" not in text:
                passed.add(op)
            ended.add(op)
            failed += int(failures)
            lines = []
        else:
            lines.append(line)
    if returncode is not None and (ended != set(ops) or returncode != min(failed, 255)):
        return set()
    return passed


@functools.cache
def _passed_together() -> set[str]:
    """The ops that passed in one subprocess probing all of them in turn (:func:`passed_in`)."""
    ops = tuple(kernels.ops())
    try:
        run = _probe_in_subprocess(*ops)
    except subprocess.TimeoutExpired as hung:   # its output so far; the ops not ended run alone
        out = hung.stdout or ""
        return passed_in(out.decode(errors="replace") if isinstance(out, bytes) else out, None, ops)
    return passed_in(run.stdout, run.returncode, ops)


@pytest.mark.parametrize("returncode, stdout, passed", [
    (0, "v0: start\nv0: pass\nDONE a 0\nv0: start\nv0: pass\nDONE b 0\n", {"a", "b"}),
    (1, "v0: start\nv0: pass\nDONE a 0\nv0: start\nv0: FAIL\nDONE b 1\n", {"a"}),
    (-11, "v0: start\nv0: pass\nDONE a 0\nv0: start\n", set()),           # b crashed mid-way
    (None, "v0: start\nv0: pass\nDONE a 0\nv0: start\n", {"a"}),          # b hung
    (-6, "v0: start\nv0: pass\nDONE a 0\nv0: start\nv0: pass\nDONE b 0\n", set()),   # crashed after
    (0, "v0: start\nDONE a 0\nv0: start\nv0: pass\nDONE b 0\n", {"b"}),   # a ran no rung
], ids=["all-pass", "one-fails", "crash-mid-way", "hang", "crash-after-all-done", "no-rung"])
def test_the_combined_probe_vouches_only_for_ops_it_ended_cleanly(returncode, stdout, passed):
    """Canned output of a probe of ops a and b: which of them need no probe of their own."""
    assert passed_in(stdout, returncode, ("a", "b")) == passed


@pytest.mark.parametrize("op", kernels.ops())
def test_offsets_past_2_31(op):
    if op in _passed_together():
        return
    run = _probe_in_subprocess(op)
    assert run.returncode == 0, (f"exit {run.returncode} (negative: killed by that signal)\n"
                                 f"{run.stdout}\n{run.stderr[-3000:]}")
    assert ": pass" in run.stdout and "FAIL" not in run.stdout, run.stdout


if __name__ == "__main__":
    import os

    os.environ.setdefault("KERNELS_BACKEND", "interpreter")
    failed = 0
    for name in sys.argv[1:]:
        failures = probe(name)
        print(f"DONE {name} {failures}", flush=True)
        failed += failures
    sys.exit(min(failed, 255))   # the failing rungs, which passed_in checks against the DONE lines
