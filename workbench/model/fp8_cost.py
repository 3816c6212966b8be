"""What quantization costs an FP8 training step, on the roofline: a model, never a measurement.

An FP8 Linear runs its three GEMMs (forward ``x w^T``, dgrad ``dy w``, wgrad ``dy^T x``) on
the FP8 matrix cores, at twice the bf16 peak on MI300X and MI355X (datasheet), but first
each operand goes through :func:`kernels.gemm_fp8.quantize`: a memory-bound pass that
reads the bf16 tensor and writes its FP8 copy (and the transposed copy a backward GEMM
needs). This module prices both with the roofline, ``time = max(FLOPs / peak, bytes /
HBM bandwidth)`` per kernel, kernels one after another, and answers the question that
decides a recipe: from what GEMM size on does the FP8 step beat the bf16 one?

Traffic comes from the package's own counts: :func:`kernels.gemm.spec.bytes_moved` (bf16
GEMM), :func:`kernels.gemm_fp8.spec.bytes_moved` (FP8 operands, bf16 output) and
:func:`kernels.gemm_fp8.quantize_kernel.bytes_moved` (the fused quantize, per granularity,
with or without the transposed copy, or with a given scale). What each recipe quantizes is
:data:`QUANTIZED`, and which operands' scales it knows ahead :data:`GIVEN_SCALE`.

What the model leaves out, so a GPU will differ: kernels reach their roof (no launch
overhead, tails or latency), nothing overlaps, the blockwise GEMM's scaling VALU work per K
step is free, scales cost no traffic in the GEMMs, and the quantize kernel's LDS transpose
does not bind. Delayed scaling's casts of x, w and dy (a Linear's, :class:`kernels.fp8.Float8Linear`)
read each once: the scale is known ahead, from the amax history, and ``quantize(..., scale=,
amax=True)`` casts and finds the amax the history records in one pass (its tile maxima, one
fp32 per 128 x 128 tile, and their reduction are charged; the amax launch that reads a tensor
while its history is empty, in the first step, is not). The MoE experts are outside this Linear's
model: under delayed, ``Float8MoE`` casts each output gradient twice (dgrad's and wgrad's
layouts) with its history's scale, and so does the expert-parallel layer. The recipes in :mod:`kernels.fp8` today
quantize each backward operand again from the saved high-precision tensor instead of using
the fused transposed copy, so they move more bytes than this model charges: it prices the
fused design.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

import roofline
from kernels.gemm import spec as gemm_spec
from kernels.gemm_fp8 import spec as fp8_spec
from kernels.gemm_fp8.quantize_kernel import bytes_moved as quantize_bytes
from kernels.gemm_fp8.quantize_ref import GRANULARITIES
from kernels.gemm_mxfp4.formats import NATIVE_ARCHS

HIGH = torch.bfloat16                 # the high-precision training dtype the FP8 step replaces
FP8 = torch.float8_e4m3fn             # one byte per element; which e4m3 does not change a byte count

# Per recipe, how the fused kernel quantizes x (T, K), w (N, K) and dy (T, N): (granularity,
# transposed copy). A transposed copy is needed where a backward GEMM reduces along the other
# axis and the scales differ there; with one scale per tensor (tensorwise) and for 128 x 128
# weight blocks (q_t is q.T, scales too) a transposed view serves.
QUANTIZED = {
    "tensorwise": {"x": ("tensor", False), "w": ("tensor", False), "dy": ("tensor", False)},
    "delayed": {"x": ("tensor", False), "w": ("tensor", False), "dy": ("tensor", False)},
    "rowwise": {"x": ("row", True), "w": ("row", True), "dy": ("row", True)},
    "blockwise": {"x": ("block1x128", True), "w": ("block128x128", False), "dy": ("block1x128", True)},
    "mxfp8": {"x": ("mx32", True), "w": ("mx32", True), "dy": ("mx32", True)},
}
GIVEN_SCALE = {"delayed": ("x", "w", "dy")}
"""Per recipe, the operands cast with a scale known before they are read (delayed's, from the
amax histories): no amax pass (:func:`kernels.gemm_fp8.quantize_kernel.bytes_moved`'s
``given_scale``)."""


@dataclass(frozen=True)
class StepCost:
    """Model times in ms of one Linear's forward + backward GEMMs at (T, N, K) on one GPU."""

    gpu: str
    recipe: str
    shape: tuple[int, int, int]
    high_gemm_ms: float      # the three bf16 GEMMs
    fp8_gemm_ms: float       # the three FP8 GEMMs
    quantize_ms: float       # quantizing x, w and dy once each

    @property
    def fp8_ms(self) -> float:
        return self.fp8_gemm_ms + self.quantize_ms

    @property
    def speedup(self) -> float:
        """bf16 step time over FP8 step time: above 1, FP8 wins."""
        return self.high_gemm_ms / self.fp8_ms

    @property
    def quantize_share(self) -> float:
        """Fraction of the FP8 step spent quantizing."""
        return self.quantize_ms / self.fp8_ms


def _quantized(recipe: str) -> dict[str, tuple[str, bool]]:
    if recipe not in QUANTIZED:
        raise ValueError(f"recipe must be one of {tuple(QUANTIZED)}, got {recipe!r}")
    return QUANTIZED[recipe]


def fp8_peak(gpu, recipe: str) -> float:
    """The FP8 GEMM's compute roof in TFLOP/s: the FP8 peak, but MXFP8 only where the GPU's
    matrix cores take MX scales (:data:`kernels.gemm_mxfp4.formats.NATIVE_ARCHS`: gfx950,
    datacenter Blackwell); elsewhere Triton emulates it on the bf16 matrix cores."""
    _quantized(recipe)
    gpu = roofline.spec(gpu)
    native = recipe != "mxfp8" or gpu.target in NATIVE_ARCHS
    return gpu.peak("fp8" if native else "bf16")


def kernel_ms(gpu, flops: float, nbytes: float, peak_tflops: float) -> float:
    """Roofline time of one kernel: the slower of its compute (at ``peak_tflops``) and its
    HBM traffic."""
    return max(flops / (peak_tflops * 1e12), nbytes / (roofline.spec(gpu).bandwidth("hbm") * 1e12)) * 1e3


def gemm_shapes(shape) -> dict[str, tuple[int, int, int]]:
    """(M, N, K) of the three GEMMs of a Linear with T tokens, N outputs and K inputs."""
    t, n, k = shape
    return {"forward": (t, n, k), "dgrad": (t, k, n), "wgrad": (n, k, t)}


def operand_shapes(shape) -> dict[str, tuple[int, int]]:
    """x (T, K), w (N, K) and dy (T, N): the tensors a step quantizes."""
    t, n, k = shape
    return {"x": (t, k), "w": (n, k), "dy": (t, n)}


def quantize_traffic(recipe: str, shape) -> float:
    """Bytes the fused quantize kernel moves for x, w and dy of one step (bf16 in)."""
    given = GIVEN_SCALE.get(recipe, ())
    return sum(quantize_bytes(operand_shapes(shape)[name], HIGH, granularity, transpose, name in given)
               for name, (granularity, transpose) in _quantized(recipe).items())


def step_cost(gpu, recipe: str, shape) -> StepCost:
    """The model's bf16 and FP8 times for one Linear's forward + backward at ``shape`` (T, N, K)."""
    _quantized(recipe)
    spec = roofline.spec(gpu)
    shape = tuple(int(s) for s in shape)
    if len(shape) != 3 or min(shape) < 1:
        raise ValueError(f"shape must be three positive sizes (T, N, K), got {shape}")
    gemms = gemm_shapes(shape).values()
    high = sum(kernel_ms(spec, gemm_spec.flops(s), gemm_spec.bytes_moved(s, HIGH), spec.peak(HIGH)) for s in gemms)
    fp8 = sum(kernel_ms(spec, gemm_spec.flops(s), fp8_spec.bytes_moved(s, FP8), fp8_peak(spec, recipe))
              for s in gemms)
    return StepCost(spec.name, recipe, shape, high, fp8, kernel_ms(spec, 0.0, quantize_traffic(recipe, shape), 1.0))


def break_even(gpu, recipe: str, shape_of=lambda n: (n, n, n), limit: int = 1 << 17) -> int | None:
    """The size n where the FP8 step starts to beat bf16 (model), for the Linear
    ``shape_of(n)`` (default a square n x n x n): found by halving from ``limit`` while FP8
    still wins, then bisecting, so it assumes one crossing (the gain grows with n wherever
    FP8 can win; tests check both sides of the answer). None if FP8 does not win at
    ``limit``: quantization eats the whole gain (e.g. MXFP8 where it is emulated)."""
    def wins(n):
        return step_cost(gpu, recipe, shape_of(n)).speedup > 1
    if not wins(limit):
        return None
    hi = limit                       # FP8 wins at hi; halve while it still wins
    while hi > 1 and wins(hi // 2):
        hi //= 2
    lo = hi // 2                     # it loses at lo (or lo is 0): bisect between
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if wins(mid) else (mid, hi)
    return hi


def quantize_point(gpu, granularity: str, shape=(8192, 8192), transpose: bool = True) -> roofline.Point:
    """The fused quantize kernel on ``gpu``'s roofline at its model time (bytes / HBM): its
    ceiling, named "... (ceiling)" (:func:`roofline.ceiling_point`), since that time is a
    roofline's, not a prediction of the kernel.

    A roofline point needs a FLOP count; this one counts 2 per element written (the amax
    compare and the scale multiply), 0.4 to 1 FLOP/byte: any count this small sits on the
    HBM roof, and its time, bytes / bandwidth, is the only number the model uses."""
    m, k = shape
    nbytes = quantize_bytes(shape, HIGH, granularity, transpose)
    flops = 2.0 * m * k * (2 if transpose else 1)
    return roofline.ceiling_point(gpu, f"quantize {granularity}{' +T' if transpose else ''}", flops, nbytes, HIGH,
                                  op="quantize", shape=f"{m}x{k}")


def gemm_point(gpu, shape=(8192, 8192, 8192), recipe: str | None = None) -> roofline.Point:
    """The bf16 GEMM (``recipe`` None) or the recipe's FP8 GEMM at its roofline ceiling, the
    time this module charges it, named "... (ceiling)": the step's model, not a prediction
    of a rung (``workbench.predict`` predicts the rungs it covers)."""
    gpu = roofline.spec(gpu)
    flops = gemm_spec.flops(shape)
    if recipe is None:
        nbytes, dtype, name = gemm_spec.bytes_moved(shape, HIGH), "bf16", "gemm bf16"
    else:
        native = fp8_peak(gpu, recipe) == gpu.peak("fp8")
        nbytes, dtype, name = fp8_spec.bytes_moved(shape, FP8), ("fp8" if native else "bf16"), f"gemm fp8 ({recipe})"
    return roofline.ceiling_point(gpu, name, flops, nbytes, dtype, op="gemm", shape="x".join(map(str, shape)))


def quantize_rows(gpus=("MI300X", "MI355X"), shape=(8192, 8192)) -> list[dict]:
    """Per granularity, with and without the transposed copy: bytes per element of a bf16
    ``shape`` and the kernel's model time (bytes / HBM bandwidth) on each GPU, in µs."""
    m, k = shape
    rows = []
    for granularity in GRANULARITIES:
        for transpose in (False, True):
            nbytes = quantize_bytes(shape, HIGH, granularity, transpose)
            row = dict(granularity=granularity, transposed_copy=transpose, bytes_per_element=nbytes / (m * k))
            row.update({f"{roofline.spec(g).name}_us": kernel_ms(g, 0.0, nbytes, 1.0) * 1e3 for g in gpus})
            rows.append(dict(row, source="model"))
    return rows


def cost_rows(gpus=("MI300X", "MI355X"), shape=(8192, 8192, 8192), width: int = 4096) -> list[dict]:
    """Per GPU and recipe: the step's model times at ``shape``, the quantize share, the
    square break-even size and the tokens a ``width`` x ``width`` Linear needs to break even."""
    rows = []
    for gpu in gpus:
        for recipe in QUANTIZED:
            cost = step_cost(gpu, recipe, shape)
            rows.append(dict(gpu=cost.gpu, recipe=recipe, shape="x".join(map(str, shape)),
                             bf16_ms=cost.high_gemm_ms, fp8_gemm_ms=cost.fp8_gemm_ms,
                             quantize_ms=cost.quantize_ms, quantize_share=cost.quantize_share,
                             speedup=cost.speedup, break_even_n=break_even(gpu, recipe),
                             **{f"break_even_tokens_{width}": break_even(gpu, recipe, lambda t: (t, width, width))},
                             source="model"))
    return rows


def speedup_curve(gpus=("MI300X", "MI355X"), sizes=tuple(2 ** i for i in range(7, 16))) -> list[dict]:
    """Model speed-up of the FP8 step over bf16 for square Linears of each size: chart rows."""
    return [dict(gpu=roofline.spec(gpu).name, recipe=recipe, n=n, speedup=step_cost(gpu, recipe, (n, n, n)).speedup)
            for gpu in gpus for recipe in QUANTIZED for n in sizes]
