"""Token tensors and group offsets the FP8 grouped-quantization tests share
(tests/test_grouped_quantize.py, tests/test_fp8_token_operands.py)."""
from __future__ import annotations

import torch

from kernels.moe.grouped_gemm import spec as grouped_spec

FORMATS = [(torch.float32, torch.float8_e4m3fn), (torch.bfloat16, torch.float8_e4m3fnuz),
           (torch.float16, torch.float8_e5m2), (torch.bfloat16, torch.float8_e5m2fnuz)]
IDS = ["fp32-e4m3fn", "bf16-e4m3fnuz", "fp16-e5m2", "bf16-e5m2fnuz"]


def tokens(rows: int, cols: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Random tokens with outlier rows and columns (scales differ per group and feature)
    and one outlier value, 100 times the mean magnitude, all in range for fp16."""
    gen = torch.Generator().manual_seed(seed)
    t = torch.randn(rows, cols, generator=gen) * torch.randn(rows, 1, generator=gen).exp()
    t = t * torch.randn(1, cols, generator=gen).exp()
    if t.numel():
        t.view(-1)[t.numel() // 3] = 100 * t.abs().mean()
    return t.to(dtype)


def offsets(sizes) -> torch.Tensor:
    """int32 group ends of groups of ``sizes`` tokens."""
    return grouped_spec.offsets_from_sizes(torch.tensor(sizes, dtype=torch.int64))


def bits(q: torch.Tensor) -> torch.Tensor:
    return q.view(torch.uint8)
