"""Every prediction states the config it assumed (``inputs["config"]``) and the options of the
compile it read (``inputs["compile options"]``); their warps and stages must agree, for every
(op, rung) and pass (forward and backward) the model covers on every target it covers (sm_90
too), at the op's first quick bench shape, and for one launch of each rung the tuners ask about
(:data:`workbench.model.LAUNCHES`) on each target.
A config that is not the one the compiled kernel was built with describes another kernel than
the one weighed: grouped GEMM v1 on sm_90 once stated GEMM v4's AMD settings (8 warps, 2 stages)
over the sm_90 compile's 4 warps and 3 stages, and its K steps per iteration, then taken from
the stated warps, came out twice the compile's, above the H200's peak. On NVIDIA no AMD-only
setting may be assumed, nor handed to the compile (which drops what its backend does not take).

``slow``: a compile per case, cached by the ISA inspector for the process.
"""
from __future__ import annotations

import pytest

import kernels
from workbench.model import (AMD_TARGETS, BACKWARD, COVERED, LAUNCHES, TARGETS, predict, predict_backward,
                             predict_launch)

pytestmark = pytest.mark.slow

GPU = {"gfx942": "MI300X", "gfx950": "MI355X", "sm_90": "H200"}   # one GPU per target
AMD_ONLY = ("waves_per_eu", "matrix_instr_nonkdim", "kpack")
CASES = [(target, backward, op, rung)
         for target in GPU
         for backward, table in ((False, COVERED), (True, BACKWARD))
         for op, (_, rungs) in table.items()
         for rung in rungs]


def test_every_target_the_model_covers_is_checked():
    assert set(GPU) == set(TARGETS)


def configs_and_compiles(inputs: dict) -> list[tuple[str, dict, dict]]:
    """(name, the config stated, the compile's options) of every launch a prediction lists:
    "config" for one launch, "config dq" / "down: config" for a pass of several."""
    return [(key, value, inputs[key.replace("config", "compile options")][0])
            for key, (value, _) in inputs.items() if key == "config" or key.startswith("config ")
            or key.endswith(": config")]


def assert_agree(p, target: str) -> None:
    found = configs_and_compiles(p.inputs)
    assert found, sorted(p.inputs)
    for name, cfg, options in found:
        assert cfg["num_warps"] == options["num_warps"], (name, cfg, options)
        if "num_stages" in cfg and "num_stages" in options:
            assert cfg["num_stages"] == options["num_stages"], (name, cfg, options)
        if target not in AMD_TARGETS:
            assert not set(AMD_ONLY) & set(cfg) and not options.get("dropped"), (name, cfg, options)
            assert cfg.get("NUM_XCDS", 1) == 1, (name, cfg)


def _shape(op: str) -> tuple:
    spec = kernels.spec(op)
    return spec.bench_shapes[spec.quick_shapes[0]]


@pytest.mark.parametrize(("target", "backward", "op", "rung"), CASES,
                         ids=[f"{t}-{op}-{r}{'-backward' if b else ''}" for t, b, op, r in CASES])
def test_the_stated_config_is_the_compiled_one(target, backward, op, rung):
    assert_agree((predict_backward if backward else predict)(op, rung, _shape(op), gpu=GPU[target]), target)


LAUNCH = {("grouped_gemm", "v4"): "dw", ("moe", "v3"): "down", ("attention", "v5"): "dkdv",
          ("gemm_fp8", "v1"): "v1:NN", ("gemm_fp8", "v2"): "v2_blockwise:NN"}   # one launch of each


def test_one_launch_of_every_rung_with_launches_is_checked():
    assert set(LAUNCH) == set(LAUNCHES)


@pytest.mark.parametrize("target", GPU)
@pytest.mark.parametrize(("op", "rung"), LAUNCH)
def test_a_tuned_launchs_stated_config_is_the_compiled_one(op, rung, target):
    assert_agree(predict_launch(op, rung, LAUNCH[op, rung], _shape(op), gpu=GPU[target]), target)
