"""ref: the library baseline, the plain-PyTorch layer (:class:`kernels.moe.MoEReference`'s
math, :func:`~kernels.moe.reference.moe_reference`) run eagerly in the rung's dtype.

Idea: what a user writes without a kernel, the shape of Hugging Face's Mixtral block:
router logits, softmax, ``torch.topk``, then for each expert find its tokens, run its
MLP on them and ``index_add`` the weighted result into a float32 accumulator. Every
rung's output and gradients are judged against the same math in float64 with this
baseline's error as the yardstick, and every rung's speed is a ratio to it.
"""
from __future__ import annotations

from ...registry import rung
from ..reference import moe_reference
from .checks import moe_operands
from .spec import DTYPES


@rung(op="moe", rung=None, name="ref", backends=("hip", "cuda", "interpreter"),
      dtypes=DTYPES, interpreter=True, kind="library", backward=True)
def moe_ref(x, router, gate, up, down, top_k):
    moe_operands(x, router, gate, up, down, top_k, DTYPES)
    return moe_reference(x, router, gate, up, down, top_k)
