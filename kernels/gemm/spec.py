"""The GEMM problem, stated once: C (M, N) = A (M, K) @ B (K, N).

Every GEMM rung, the benchmark, the roofline and the notebooks read shapes, work and
traffic from here, so the numbers they print are computed one way.
"""
from __future__ import annotations

import torch

from ..registry import OpSpec, register_op

DTYPES = (torch.float32, torch.float16, torch.bfloat16)

# Small, odd, prime, degenerate: none a multiple of any block size.
SMOKE_SHAPES = (
    (1, 1, 1),
    (37, 29, 53),
    (5, 67, 3),
    (64, 48, 32),
    (19, 1, 131),
)

# Benchmark presets (GPU only): names kernel engineers recognise. (M, N, K)
BENCH_SHAPES = {
    "square 1024": (1024, 1024, 1024),
    "square 2048": (2048, 2048, 2048),
    "square 4096": (4096, 4096, 4096),
    "square 8192": (8192, 8192, 8192),
    "square 16384": (16384, 16384, 16384),
    "llama3-8b mlp up (4096 tok)": (4096, 14336, 4096),
    "llama3-8b mlp down (4096 tok)": (4096, 4096, 14336),
    "llama3-70b mlp up (8192 tok)": (8192, 28672, 8192),
    "llama3-70b mlp down (8192 tok)": (8192, 8192, 28672),
    "decode M=16 (4096x14336)": (16, 14336, 4096),
    "decode M=128 (4096x14336)": (128, 14336, 4096),
}


def make_inputs(shape, dtype=torch.float32, device="cpu", seed=0, layout="row"):
    """Fresh random A and B; ``layout`` "col" gives column-major (transposed-stride) views,
    "NT" a row-major A and B as the transpose of a row-major (N, K), K-contiguous: ``x @ w.t()``,
    nn.Linear's forward (:func:`with_layout`)."""
    m, n, k = shape
    gen = torch.Generator(device="cpu").manual_seed(seed)
    a = torch.randn(m, k, generator=gen, dtype=torch.float32)
    b = torch.randn(k, n, generator=gen, dtype=torch.float32)
    a, b = with_layout(a, b, layout)
    return a.to(device=device, dtype=dtype), b.to(device=device, dtype=dtype)


INPUT_LAYOUTS = ("row", "col", "NT")   # make_inputs' layouts: as :func:`layout` names them, NN, TT and NT


def with_layout(a: torch.Tensor, b: torch.Tensor, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``a`` and ``b`` (the same values) laid out as ``layout`` of :data:`INPUT_LAYOUTS` says: "row"
    as they are, "col" both column-major, "NT" only B column-major (K-contiguous)."""
    if layout not in INPUT_LAYOUTS:
        raise ValueError(f"layout must be one of {INPUT_LAYOUTS}, got {layout!r}")
    if layout == "col":
        a = a.t().contiguous().t()
    if layout != "row":
        b = b.t().contiguous().t()
    return a, b


def reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """float64 on the CPU: the error of every rung and of the baseline is measured against it.
    It keeps autograd's graph, so a GEMM with a backward is judged on its gradients too
    (``workbench grade``)."""
    return a.cpu().double() @ b.cpu().double()


def launch_ints(shape=(8192, 8192, 8192), layout="NN") -> dict[str, int]:
    """The int arguments of a GEMM launch (what the ISA inspector compiles for).

    ``layout`` in BLAS terms (:func:`layout`), one letter per operand: "N" for a row-major
    operand, "T" for a transposed one. "NN" is ``a @ b`` of plain tensors and a Linear's
    dgrad (``grad_y @ weight``), "NT" ``torch.nn.Linear``'s ``x @ weight.t()`` (K-contiguous
    B), "TN" every weight gradient (``x.t() @ grad_y``: M-contiguous A).
    """
    m, n, k = shape
    a_strides = {"N": dict(stride_am=k, stride_ak=1), "T": dict(stride_am=1, stride_ak=m)}
    b_strides = {"N": dict(stride_bk=n, stride_bn=1), "T": dict(stride_bk=1, stride_bn=k)}
    if len(layout) != 2 or layout[0] not in a_strides or layout[1] not in b_strides:
        raise ValueError(f"layout must be two letters N or T (NN, NT, TN, TT), got {layout!r}")
    return dict(M=m, N=n, K=k, **a_strides[layout[0]], **b_strides[layout[1]], stride_cm=n, stride_cn=1)


def aot_launch_settings(overrides: dict | None) -> tuple[dict[str, int], dict]:
    """Split an ISA inspector's ``overrides`` into the launch ints and the rung settings:
    ``layout`` picks the launch (:func:`launch_ints`), the rest replace config settings."""
    settings = dict(overrides or {})
    return launch_ints(layout=settings.pop("layout", "NN")), settings


def layout(a: torch.Tensor, b: torch.Tensor) -> str:
    """BLAS letters for how A and B lie in memory: "N" when a row is contiguous
    (unit stride along K for A, along N for B), "T" otherwise; ``x @ w.t()`` is "NT"."""
    return ("N" if a.stride(1) == 1 else "T") + ("N" if b.stride(1) == 1 else "T")


def flops(shape) -> float:
    m, n, k = shape
    return 2.0 * m * n * k


def bytes_moved(shape, dtype: torch.dtype) -> float:
    """Minimum traffic: A and B read once, C written once."""
    m, n, k = shape
    return float((m * k + k * n + m * n) * torch.empty((), dtype=dtype).element_size())


SPEC = register_op(OpSpec(
    name="gemm",
    make_inputs=make_inputs,
    reference=reference,
    flops=flops,
    bytes_moved=bytes_moved,
    smoke_shapes=SMOKE_SHAPES,
    bench_shapes=BENCH_SHAPES,
    dtypes=DTYPES,
    shape_names=("M", "N", "K"),
    quick_shapes=("square 4096", "llama3-8b mlp down (4096 tok)", "decode M=16 (4096x14336)"),
))
