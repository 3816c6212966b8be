"""Roofline model, GPU datasheets and charts for the kernel workbench.

This package imports nothing else from the project, so a notebook, the workbench harness or
a plain script can place a kernel on a roofline without pulling in kernels or Triton.

GPU specs (dense peaks per dtype, memory and cache bandwidths, capacities), each number
with its source tags and caveats::

    roofline.gpus()                      # ['B200', 'H100 SXM', 'H200 SXM', 'MI250X', ...]
    s = roofline.spec("mi300x")          # aliases: case, spaces, dashes do not matter
    roofline.device_spec("AMD Instinct MI300X VF", "gfx942")   # as torch names the device
    s.peak_tflops["bf16"], s.hbm_tbps    # 1307.4, 5.3   (None = dtype not supported)
    s.ridge("bf16")                      # FLOP/byte where the HBM roof meets bf16 peak
    s.memory_levels                      # {'hbm': 5.3, 'llc': 17.0, 'l2': 34.4, ...}
    s.formats["fp8"], s.uncertain, s.provenance["peak_tflops.fp8"], s.sources
    roofline.load_spec("my_gpu.yaml")    # a user file; or put files in $ROOFLINE_SPECS_DIR

The model (numbers it returns are model numbers, never measurements)::

    roofline.attainable(s, intensity, "bf16", level="hbm")   # min(peak, bw * intensity)
    roofline.bound(s, intensity, "bf16")                     # 'hbm' or 'compute'
    roofline.percent_of_roof(s, intensity, "bf16", measured_tflops)

``intensity`` may also be a mapping level -> FLOP/byte for a hierarchical roofline.

Points and charts::

    p = roofline.point(s, "v3_mfma", flops, bytes_moved, ms, "bf16", "measured",
                       op="gemm", shape="4096x4096x4096")
    roofline.ceiling_point(s, "v3_mfma", flops, bytes_moved, "bf16")   # "v3_mfma (ceiling)", on the roof
    c = roofline.chart(s, [p], ceilings=measured)   # measured ceilings drawn dashed
    roofline.save_chart(c, "gemm.svg")               # or .png, no browser needed
    roofline.ladder_chart(rows)                      # TFLOP/s per rung and ratio to ref

Dtype names: fp64 fp32 tf32 fp16 bf16 fp8 fp6 fp4 int8 (int8 peaks are TOPS); torch dtypes
and spellings such as "bfloat16" or "float8_e4m3fnuz" are accepted wherever a dtype is.
"""

from importlib import import_module

from .dtypes import DTYPES, dtype_name
from .loader import load_spec
from .measured import check_ceilings
from .model import attainable, bound, percent_of_roof, roofs
from .points import CEILING, SOURCES, Point, ceiling_point, point
from .registry import device_spec, gpus, spec
from .spec import LEVELS, GpuSpec, Provenance

__all__ = [
    "CEILING", "DTYPES", "LEVELS", "SOURCES", "GpuSpec", "Point", "Provenance", "attainable", "bound",
    "ceiling_point", "chart", "check_ceilings", "device_spec", "dtype_name", "gpus", "ladder_chart", "load_spec",
    "percent_of_roof", "point", "roofs", "save_chart", "spec",
]

# Charts need altair and vl-convert (the ``notebook`` extra); they load on first use so the
# specs and the model work in a plain ``pip install`` without them.
_CHART_MODULES = {"chart": "charts", "ladder_chart": "ladder", "save_chart": "export"}


def __getattr__(name):
    if name in _CHART_MODULES:
        return getattr(import_module(f".{_CHART_MODULES[name]}", __name__), name)
    raise AttributeError(f"module 'roofline' has no attribute {name!r}")
