"""MX blocks whose amax sits where the e8m0 scale rules decide, for the dense and grouped
quantize tests (tests/test_fp8_quantize.py, tests/test_grouped_quantize_mxfp8.py)."""
from __future__ import annotations

import torch


def adversarial_groups(fp8):
    """Rows of 32 whose amax sits where the e8m0 rules decide: exactly fmax 2^k and the next
    float above it (k over e8m0's whole range, where fp32 has it), just below a power of two,
    the largest finite fp32, subnormal amaxes whose quotient by fmax is a subnormal just above,
    at and below 2^-127 (half the smallest normal), and an all-zero group; the other 31
    elements random below the amax, one of them its negative."""
    fmax = torch.finfo(fp8).max
    tiny = torch.finfo(torch.float32).tiny
    top = [fmax * 2.0 ** k for k in range(-140, 115, 9)] + [2.0 ** k for k in (-149, -127, -126, 0, 100, 127)]
    amax = torch.tensor(top, dtype=torch.float32)
    above = amax.nextafter(torch.tensor(float("inf")))
    below = amax.nextafter(torch.tensor(0.0))
    quotients = torch.tensor([tiny / 2, tiny / 2 * (1 + 2 ** -22), tiny / 4, tiny * 0.75])   # of amax / fmax
    special = torch.cat([quotients * fmax, torch.tensor([torch.finfo(torch.float32).max, 0.0])])
    amax = torch.cat([amax, above, below, special]).unique()
    gen = torch.Generator().manual_seed(11)
    x = (torch.rand(amax.shape[0], 32, generator=gen) * 2 - 1) * amax[:, None]
    x[:, 5], x[:, 17] = amax, -amax
    return x
