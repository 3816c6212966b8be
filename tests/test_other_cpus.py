"""The numerics tests that once held on one CPU only, run again as an AVX2-only CPU would.

The interpreter's tile dots go through NumPy's OpenBLAS, and torch's CPU ops through
MKL and ATen kernels, each picking a kernel (and with it a summation order) by the CPU
it finds. The suite once failed on an AVX2-only AMD EPYC while passing on AVX-512
machines: a large-score attention rule and bitwise claims between differently shaped
computations rested on one CPU's rounding. Each library lets its choice be pinned
below what the CPU has, so this machine can take an AVX2-only machine's paths: these
tests run the tests that depend on rounding order in a subprocess so pinned.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from numpy._core._multiarray_umath import __cpu_features__

ROOT = Path(__file__).resolve().parents[1]

# The tests whose verdict once depended on the BLAS kernel (issue 17's AVX2 failures). The whole
# suite run so pinned (stop 52) failed one more claim, the one-rank k-sum test's fp32 bits between
# differently tiled GEMMs, now a bound; its other claims are the same kernels' bits in the same
# order, so it is not pinned here (36 s more of CI, 16 -> 52 s measured, for no CPU-dependent verdict).
ROUNDING_ORDER_TESTS = [
    "tests/test_attention_ladder.py::test_large_scores_do_not_overflow",
    "tests/test_attention_ladder.py::test_v5_gradients_meet_the_rule_up_to_scores_of_1e4",
    "tests/test_ep_moe.py::test_v3_rows_do_not_depend_on_their_tile_mates",
]


def avx2_only_environment() -> dict[str, str]:
    """OpenBLAS's Haswell kernels, MKL's and ATen's AVX2 paths, NumPy's AVX-512 loops off."""
    avx512 = [name for name, present in __cpu_features__.items()
              if present and name.startswith("AVX512")]
    env = dict(os.environ, OPENBLAS_CORETYPE="Haswell", MKL_ENABLE_INSTRUCTIONS="AVX2",
               ATEN_CPU_CAPABILITY="avx2")
    if avx512:
        env["NPY_DISABLE_CPU_FEATURES"] = " ".join(avx512)
    return env


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.skipif(not __cpu_features__.get("AVX2"), reason="this CPU has no AVX2 to pin to")
def test_rounding_order_tests_hold_on_an_avx2_only_cpu(tmp_path):
    # Its own inductor cache: torch 2.13's on-disk cache keys do not hold ATEN_CPU_CAPABILITY, and
    # a graph compiled under one capability and loaded under the other gave wrong results or a
    # corrupted heap here (a plain torch function too, no kernel of ours), so a listed test that
    # compiles must not share the suite's cache.
    env = {**avx2_only_environment(), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    probe = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
        env=env, capture_output=True, text=True, check=True)
    assert probe.stdout.strip() == "AVX2", probe.stdout + probe.stderr   # the pin took
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:nbmake", "-n", "0",
         *ROUNDING_ORDER_TESTS], cwd=ROOT, env=env, capture_output=True, text=True)   # no notebook to run
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert " passed" in run.stdout and "skipped" not in run.stdout.splitlines()[-1]
