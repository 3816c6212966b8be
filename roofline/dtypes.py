"""Data-type names shared by specs, the model and the charts.

Results, torch and the datasheets all spell a type differently (``torch.bfloat16``,
``"bfloat16"``, ``"bf16"``; FNUZ vs OCP fp8). The roofline only cares which compute roof a
kernel runs on, so every spelling is folded to one short name here, once. The exact fp8/fp4
encoding a GPU uses is kept in ``GpuSpec.formats``, not in the name.
"""

DTYPES = ("fp64", "fp32", "tf32", "fp16", "bf16", "fp8", "fp6", "fp4", "int8")

_ALIASES = {
    "float64": "fp64", "double": "fp64",
    "float32": "fp32", "float": "fp32",
    "xf32": "tf32",
    "float16": "fp16", "half": "fp16",
    "bfloat16": "bf16",
    "float8_e4m3fn": "fp8", "float8_e4m3fnuz": "fp8",
    "float8_e5m2": "fp8", "float8_e5m2fnuz": "fp8",
    "e4m3fn": "fp8", "e4m3fnuz": "fp8", "e5m2": "fp8", "e5m2fnuz": "fp8",
    "mxfp6": "fp6",
    "mxfp4": "fp4", "nvfp4": "fp4", "float4_e2m1fn_x2": "fp4",
    "i8": "int8",
}


def dtype_name(dtype) -> str:
    """Fold a dtype spelling (str or torch dtype) to one of ``DTYPES``.

    torch is not imported: ``str(torch.bfloat16)`` is ``"torch.bfloat16"``, which is enough.
    """
    text = str(dtype).strip().lower().removeprefix("torch.")
    name = _ALIASES.get(text, text)
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join(DTYPES)}")
    return name
