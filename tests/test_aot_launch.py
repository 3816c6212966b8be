"""AOT launch descriptions follow the JIT's specialization, so the ISA shows what runs."""
from __future__ import annotations

import pytest
import torch

import kernels
from kernels.gemm import v2_triton_tile
from kernels.gemm.spec import launch_ints
from kernels.triton_support import aot_launch
from workbench import isa


def test_unit_ints_become_constexprs_and_the_others_keep_their_values():
    """The values are what the compile specializes with Triton's own rule (test_aot_specialization)."""
    ints = launch_ints((8191, 8192, 8192))
    launch = aot_launch(v2_triton_tile._gemm_tile_kernel, torch.bfloat16, v2_triton_tile.config("hip"),
                        ints, constexprs={"INTERP_BF16": False})
    assert list(launch.signature) == list(v2_triton_tile._gemm_tile_kernel.arg_names)
    assert launch.constexprs["stride_ak"] == launch.constexprs["stride_cn"] == 1
    assert launch.signature["a_ptr"] == "*bf16" and launch.signature["K"] == "i32"
    assert launch.scalars == {k: v for k, v in ints.items() if v != 1} and launch.scalars["M"] == 8191
    assert launch.options == {"num_warps": 8, "num_stages": 1}


def test_an_argument_without_a_value_is_an_error():
    ints = launch_ints()
    del ints["K"]
    with pytest.raises(ValueError, match="no value for argument 'K'"):
        aot_launch(v2_triton_tile._gemm_tile_kernel, torch.float16, v2_triton_tile.config("hip"), ints,
                   constexprs={"INTERP_BF16": False})


@pytest.mark.parametrize("rung", [r for r in kernels.variants("gemm") if r.aot], ids=lambda r: r.label)
def test_every_triton_gemm_rung_loads_16_bytes_at_a_time_on_gfx942(rung):
    """Without the JIT's hints every load would be a 2-byte global_load_ushort."""
    loads = isa.inspect("gemm", rung.label, "gfx942", torch.bfloat16).global_loads
    wide = sum(n for name, n in loads.items() if name.endswith("dwordx4"))
    assert wide > 0 and not any("ushort" in name for name in loads), loads


def test_an_argument_the_kernel_does_not_specialize_stays_an_int_at_1_as_the_jit_keeps_it(monkeypatch):
    """history_ops' record kernel declares ``do_not_specialize=["index", "count"]``: at 1 they stay i32
    arguments of the one binary every value runs, as Triton's own launch binds them (launch_classes),
    while H, specialized, becomes a constexpr at 1."""
    from triton.backends.compiler import GPUTarget

    from kernels.fp8 import history_ops
    from kernels.triton_support import unspecialized
    from launch_classes import aot_jit_launch

    from workbench.isa import compile as isa_compile

    kernel = history_ops._record_kernel
    assert unspecialized(kernel) == unspecialized(isa_compile._Rebuilder().jit(kernel)) == {"index", "count"}
    launch = aot_launch(kernel, torch.float8_e4m3fn, dict(num_warps=1), dict(index=1, H=1, count=1),
                        constexprs=dict(LIMIT=464.0, AT_LIMIT=False, H_BLOCK=16, BLOCK=1024),
                        pointers=dict(history_ptr="*fp32", counts_ptr="*i64", maxima_ptr="*fp32",
                                      scale_ptr="*fp32"))
    assert launch.signature["index"] == launch.signature["count"] == "i32" and launch.constexprs["H"] == 1
    jit = aot_jit_launch(launch, GPUTarget("hip", "gfx942", 64), monkeypatch)
    assert jit["signature"] == launch.signature and jit["constexprs"] == launch.constexprs
