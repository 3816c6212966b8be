"""An FP8 grouped GEMM training problem, run and check: every recipe's forward, dX and dW tests judge alike."""
from __future__ import annotations

import torch

from kernels.moe.grouped_gemm import spec as grouped_spec
from kernels.moe.grouped_gemm_fp8 import grouped_gemm_fp8_train
from kernels.outputs import poisoned_outputs

SIZES = [5, 0, 1, 26, 3]     # an empty group, a one-row group, unaligned group starts
K, N = 37, 23                 # odd: every tile edge is ragged


def problem(sizes=SIZES, k=K, n=N, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    t = sum(sizes)
    # outlier rows and columns, so per-row scales differ from per-tensor ones
    x = torch.randn(t, k, generator=gen) * torch.randn(t, 1, generator=gen).exp()
    w = torch.randn(len(sizes), k, n, generator=gen) * torch.randn(len(sizes), 1, n, generator=gen).exp()
    dy = torch.randn(t, n, generator=gen) * torch.randn(t, 1, generator=gen).exp()
    offsets = grouped_spec.offsets_from_sizes(torch.tensor(sizes, dtype=torch.int64))
    return x.to(dtype), w.to(dtype), dy.to(dtype), offsets


def close(actual, expected, rtol):
    torch.testing.assert_close(actual.double(), expected, rtol=rtol,
                               atol=rtol * max(expected.abs().max().item(), 1e-30))


def run(x, w, dy, offsets, recipe, fp8, grad=None, scales=(None, None)):
    x, w = x.clone().requires_grad_(), w.clone().requires_grad_()
    with poisoned_outputs():
        y = grouped_gemm_fp8_train(x, w, offsets, recipe, fp8, grad, *scales)
        y.backward(dy)
    return y, x.grad, w.grad
