"""A float32 launch of a tuned rung on a GPU is offered its table's float32 section (and a bf16 or
fp16 one the bf16 section): at float32 a tile needs twice the LDS and registers, and most configs
bf16 keeps spill, or on gfx942 cannot launch at all (kernels.tuning.section). Checked on a pretended
gfx942 (``fake_gpu``), with the tuner's choice replaced by a recorder that launches nothing."""
from __future__ import annotations

import pytest
import torch

from kernels import tuning
from kernels.attention import configs as attention_configs, configs_backward, v4_amd_tuned, v5_backward
from kernels.gemm import configs as gemm_configs, v6_persistent
from kernels.moe.grouped_gemm import configs as grouped_configs, v4_persistent as grouped_v4
from kernels.moe.layer_ladder import configs as moe_configs

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@pytest.fixture
def offered(monkeypatch, fake_gpu):
    """The candidates each tuned launch is offered, by op; the first is taken, untimed."""
    fake_gpu("hip", "gfx942")
    seen: dict[str, list[dict]] = {}

    def record(op, key, candidates, run, problem=None):
        seen[op] = candidates()
        return seen[op][0]
    for module in (v6_persistent, v4_amd_tuned, v5_backward, grouped_v4):
        monkeypatch.setattr(module, "choice", record)
    monkeypatch.setattr(tuning, "choice", record)   # the MoE layer's, through moe_configs.choose
    return seen


def _kept(table, dtype, fits=lambda cfg: True) -> list[dict]:
    section = tuning.section("gfx942", dtype)
    return [e["config"] for e in tuning.shipped(table)[section]["kept"] if fits(e["config"])]


def _within(offered: list[dict], kept: list[dict]) -> bool:
    return bool(offered) and all({k: v for k, v in cfg.items() if k in kept[0]} in kept for cfg in offered)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gemm(offered, dtype):
    a, b = torch.empty(4096, 4096, dtype=dtype), torch.empty(4096, 4096, dtype=dtype)
    v6_persistent.tuned(a, b, torch.empty_like(a), v6_persistent.persistent_settings(v6_persistent._backend.current()))
    assert _within(offered["gemm/v6"], _kept(gemm_configs.TABLE, dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_attention_forward_and_backward(offered, dtype):
    q = torch.empty(1, 2, 4096, 128, dtype=dtype)
    v4_amd_tuned.tuned(q, q, q, True, 0.1)
    assert _within(offered["attention/v4"],
                   _kept(attention_configs.TABLE, dtype, lambda cfg: cfg["BLOCK_D"] == 128))
    for kernel in configs_backward.KERNELS:
        v5_backward._tuned(kernel, (kernel,), 4096, 4096, 128, dtype, run=None)
        assert _within(offered[f"attention/v5/{kernel}"], _kept(
            configs_backward.TABLE, dtype, lambda cfg: (cfg["KERNEL"], cfg["BLOCK_D"]) == (kernel, 128)))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_grouped_gemm_and_the_moe_layer(offered, dtype):
    x, w = torch.empty(8192, 2048, dtype=dtype), torch.empty(8, 2048, 1024, dtype=dtype)
    offsets = torch.arange(1, 9, dtype=torch.int32) * 1024
    grouped_v4.choose("forward", x, w, offsets, torch.empty(8192, 1024, dtype=dtype), (8192, 2048, 1024, 8), None)
    assert _within(offered["grouped_gemm/v4"], _kept(grouped_configs.TABLE, dtype))
    moe_configs.choose("gate_up", "hip", "gfx942", 8192, 1024, 8, dtype, run=None)
    assert _within(offered["moe/v3"], _kept(moe_configs.TABLE, dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_performance_model_compiles_the_config_a_launch_of_its_dtype_runs(dtype):
    """workbench.predict at float32 weighs float32's prior, not bf16's (which on gfx942 needs
    more LDS than a CU has): the GEMM's and the grouped GEMM's."""
    from workbench.model import gemm as gemm_model, grouped_gemm as grouped_model

    plan = gemm_model.plan("v6", (4096, 4096, 4096), "gfx942", 304, dtype)
    assert _within([plan.cfg], _kept(gemm_configs.TABLE, dtype))
    cfg, _ = grouped_model.config("v4", (8192, 2048, 1024, 8), "gfx942", "forward", dtype)
    assert _within([cfg], _kept(grouped_configs.TABLE, dtype))
