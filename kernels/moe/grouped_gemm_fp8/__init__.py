"""FP8 grouped GEMM ladder: per group g, y[rows of g] = (x_g * sx_g) @ (w[g] * sw[g]).

The MoE expert GEMM of FP8 training and inference: x and w in the e4m3 format the
GPU's matrix cores take (or one of them in the e5m2 of that family: an output gradient
of the hybrid format), one float32 scale per token (row of x) and one per output
channel of each expert (column of w[g]). Importing this package registers the problem
(:mod:`.spec`) and every rung, in ladder order; :func:`kernels.grouped_gemm_fp8` is the
public op (:mod:`.ops`). Training runs the experts' GEMMs and both gradients in FP8
through :func:`.training.grouped_gemm_fp8_train` (dX on the forward kernel with wᵀ, dW on
:mod:`.dw`), with operands quantized per recipe by :mod:`.quantize`.
"""
from . import spec  # noqa: F401  (registers the op)
from . import ref, v0_one_launch  # noqa: F401
from .training import grouped_gemm_fp8_dw, grouped_gemm_fp8_train  # noqa: F401
