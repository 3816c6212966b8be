"""Every prediction states the config it assumed (``inputs["config"]``) and the options of the
compile it read (``inputs["compile options"]``); they must agree, for every (op, rung) and pass
the model covers on every target it covers, at the op's first quick bench shape. A config that
is not the one the compiled kernel was built with weighs that kernel's loop wrongly (K steps
per iteration come from ``num_warps``): grouped GEMM v1 on sm_90 once stated GEMM v4's AMD
settings (8 warps, 2 stages) over the sm_90 compile's 4 warps and 3 stages, twice the steps,
above the H200's peak. On NVIDIA no AMD-only setting may be assumed either.

``slow``: a compile per rung, config and target (56 cases: about 75 s with an empty Triton
cache, 12 s with a warm one, on two shared cores), cached by the ISA inspector for the process.
"""
from __future__ import annotations

import pytest

import kernels
from workbench.model import AMD_TARGETS, BACKWARD, COVERED, NVIDIA_OPS, predict, predict_backward

pytestmark = pytest.mark.slow

GPU = {"gfx942": "MI300X", "gfx950": "MI355X", "sm_90": "H200"}   # one GPU per target
AMD_ONLY = ("waves_per_eu", "matrix_instr_nonkdim", "kpack")
CASES = [(target, backward, op, rung)
         for target in GPU
         for backward, table in ((False, COVERED), (True, BACKWARD))
         for op, (_, rungs) in table.items()
         if target in AMD_TARGETS or (not backward and op in NVIDIA_OPS[target])
         for rung in rungs]


def test_every_target_the_model_covers_is_checked():
    assert set(GPU) == set(AMD_TARGETS) | set(NVIDIA_OPS)


def configs_and_compiles(inputs: dict) -> list[tuple[str, dict, dict]]:
    """(name, the config stated, the compile's options) of every launch a prediction lists:
    "config" for one launch, "config dq" / "down: config" for a pass of several."""
    return [(key, value, inputs[key.replace("config", "compile options")][0])
            for key, (value, _) in inputs.items() if key == "config" or key.startswith("config ")
            or key.endswith(": config")]


@pytest.mark.parametrize(("target", "backward", "op", "rung"), CASES,
                         ids=[f"{t}-{op}-{r}{'-backward' if b else ''}" for t, b, op, r in CASES])
def test_the_stated_config_is_the_compiled_one(target, backward, op, rung):
    spec = kernels.spec(op)
    shape = spec.bench_shapes[spec.quick_shapes[0]]
    p = (predict_backward if backward else predict)(op, rung, shape, gpu=GPU[target])
    found = configs_and_compiles(p.inputs)
    assert found, sorted(p.inputs)
    for name, cfg, options in found:
        for setting in ("num_warps", "num_stages"):
            if setting in cfg and setting in options:
                assert cfg[setting] == options[setting], (name, setting, cfg, options)
        assert cfg["num_warps"] == options["num_warps"], (name, cfg, options)
        if target not in AMD_TARGETS:
            assert not set(AMD_ONLY) & (set(cfg) | set(options)), (name, cfg, options)
            assert cfg.get("NUM_XCDS", 1) == 1, (name, cfg)
