"""The FP8 GEMMs an ``fp8_linear`` forward and backward runs under a recipe, read from the tuning
keys its launches look up (a key names A's and B's formats, the operand layout and the binary:
:func:`kernels.gemm_fp8.launch.settings`)."""
from __future__ import annotations

import json

import pytest
import torch

from kernels import tuning
from kernels.gemm_fp8 import configs

from launch_classes import recorded_launches


def recipe_launches(recipe: str, grad_format: str | None = None, stub: bool = True) -> set[tuple[str, str, str, str]]:
    """(binary, layout, A's format, B's format) of each FP8 GEMM ``fp8_linear`` runs under ``recipe`` with dy
    in ``grad_format`` (default the recipe's), on the interpreter. 256 tokens, features and
    outputs: two 128-element scale blocks along every GEMM's K, as the blockwise recipe's
    launches have. The launches are recorded, not run, unless ``stub`` is False
    (:func:`launch_classes.recorded_launches`): which binary, layout and formats a GEMM takes
    is its tuning key, which the host builds from shapes, dtypes and strides before the
    launch; no value of a kernel's output enters it (tests/test_fp8_recipe_launches.py checks
    that the sets agree both ways for one recipe and format pair)."""
    from kernels.fp8.linear import fp8_linear

    x = torch.randn(256, 256, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(256, 256, dtype=torch.bfloat16, requires_grad=True)
    with tuning.recording() as seen, pytest.MonkeyPatch.context() as patch, \
            recorded_launches(patch, stub=stub):
        y = fp8_linear(x, w, recipe, grad_format=grad_format)
        y.backward(torch.randn_like(y))
    keys = [json.loads(text) for op, text in seen if op.startswith("gemm_fp8/")]
    # launch.settings' key: (M, N, K buckets, A's format, B's format, layout, ...)
    assert all("float8" in key[3] and "float8" in key[4] for key in keys), keys
    return {(*part_of(key), key[3], key[4]) for key in keys}


def part_of(key: list) -> tuple[str, str]:
    """(binary, operand layout) a ``gemm_fp8`` launch's tuning key names (:func:`kernels.gemm_fp8.launch.settings`)."""
    return next(p for p in key if p in configs.BINARIES), next(p for p in key if p in ("NN", "NT", "TN", "TT"))
