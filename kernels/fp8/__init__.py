"""FP8 training: recipes, the FP8 linear layer and ``convert(model, recipe)``.

    import kernels.fp8
    kernels.fp8.convert(model, "rowwise")      # every Linear but first/last/router -> FP8
    kernels.fp8.names()                         # tensorwise, delayed, rowwise, blockwise, mxfp8
    kernels.fp8.convert(other, "mxfp8", scale_rule="ocp")   # mxfp8's e8m0 rule, kept by other's layers

A recipe (:mod:`.recipe`) says how each of a linear layer's three GEMMs (forward, dgrad,
wgrad) quantizes its operands and in which format the output gradient goes (``"hybrid"``:
e5m2, the per-tensor recipes' default; ``"e4m3"``: the fine-grained ones'; ``convert(...,
grad_format=)`` overrides); the forward keeps x and w in FP8 for the backward, which
quantizes only dy. :class:`Float8Linear` runs them through the custom op
``kernels::fp8_linear`` (:mod:`.linear`), so autograd, ``torch.compile`` and FSDP2 see
one op. Delayed scaling's saturation is counted on the device and reported by
:func:`warn_saturation`; its amax histories are shared by data-parallel ranks in one
all-reduce per step (:func:`sync_amax`); :func:`checkpoint` is activation checkpointing
under which a delayed-scaling layer recomputes with its own forward's scales, whatever the
schedule.
"""
from . import recipes  # noqa: F401  (registers every recipe)
from .amax_sync import sync_amax
from .convert import KEEP_HIGH_PRECISION, convert, converted
from .linear import Float8Linear, fp8_linear, side_by_side
from .recipe import get, names
from .recompute import checkpoint
from .saturation import saturation, warn_saturation

__all__ = ["KEEP_HIGH_PRECISION", "Float8Linear", "checkpoint", "convert", "converted", "fp8_linear", "get", "names",
           "saturation", "side_by_side", "sync_amax", "warn_saturation"]
