"""What every Triton attention rung computes the same way before a launch."""
from __future__ import annotations

from ..triton_support import next_power_of_2


def head_block(d: int) -> int:
    """The padded head dim a kernel works on: a power of two >= 16 (``tl.dot``'s minimum);
    the padding lanes are masked on load and never stored."""
    return max(16, next_power_of_2(d))


def scale_sign(scale: float) -> int:
    """sign(scale), the forward and backward kernels' SCALE_SIGN constexpr, so that the usual
    positive scale compiles to code with no sign flip (0 and negative scales get their own)."""
    return (scale > 0) - (scale < 0)


def strides(t) -> tuple[int, int, int, int]:
    """(batch, head, sequence, dim) strides of a 4-D tensor, in elements."""
    return tuple(t.stride())


def aot_ints(b=4, hq=32, hkv=8, s=4096, sk=4096, d=128) -> dict:
    """The int (and float) arguments of a contiguous Llama-3-8B launch, for the ISA inspector."""
    ints = dict(scale=d ** -0.5, S=s, SK=sk, D=d, GROUP=hq // hkv, HQ=hq)
    for name, (h, n) in (("q", (hq, s)), ("k", (hkv, sk)), ("v", (hkv, sk)), ("o", (hq, s))):
        ints.update({f"stride_{name}b": h * n * d, f"stride_{name}h": n * d,
                     f"stride_{name}s": d, f"stride_{name}d": 1})
    return ints
