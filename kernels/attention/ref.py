"""ref: the library baseline, ``torch.nn.functional.scaled_dot_product_attention``.

Idea: what a user gets without writing a kernel: the flash or memory-efficient backend
on a GPU, the math backend on the CPU. Every rung's output and gradients are judged
against a float64 reference with this baseline's error as the yardstick, and every
rung's speed is reported as a ratio to it, timed in the same run.
"""
from __future__ import annotations

import torch.nn.functional as F

from .. import validate
from ..registry import rung
from .spec import DTYPES, MAX_HEAD_DIM


@rung(op="attention", rung=None, name="ref", backends=("hip", "cuda", "interpreter"),
      dtypes=DTYPES, interpreter=True, kind="library", backward=True)
def attention_ref(q, k, v, causal=False, scale=None):
    scale = validate.attention_operands(q, k, v, scale, DTYPES, MAX_HEAD_DIM)
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale,
                                          enable_gqa=q.shape[1] != k.shape[1])
