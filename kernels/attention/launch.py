"""What every Triton attention rung computes the same way before a launch."""
from __future__ import annotations

import torch

from ..triton_support import next_power_of_2


def head_block(d: int) -> int:
    """The padded head dim a kernel works on: a power of two >= 16 (``tl.dot``'s minimum);
    the padding lanes are masked on load and never stored."""
    return max(16, next_power_of_2(d))


def scale_sign(scale: float) -> int:
    """sign(scale), the forward and backward kernels' SCALE_SIGN constexpr, so that the usual
    positive scale compiles to code with no sign flip (0 and negative scales get their own)."""
    return (scale > 0) - (scale < 0)


def even(s: int, sk: int, d: int, cfg: dict, packed: bool = False) -> dict:
    """The forward kernel's EVEN and EVEN_D constexprs: whether S and S_k fill whole query and
    key tiles, and D the head block, so the key loop needs no bounds masks. A packed batch's
    lengths are read on the device, so nothing about them is proven: EVEN is False there."""
    return dict(EVEN=not packed and s % cfg["BLOCK_M"] == 0 and sk % cfg["BLOCK_N"] == 0,
                EVEN_D=d == cfg["BLOCK_D"])


NO_BF16_CONVERSION = ("gfx940", "gfx941", "gfx942")   # CDNA3: no v_cvt_pk_bf16_f32 (gfx950 has it)


def p_bits(dtype: torch.dtype, backend: str, arch: str) -> bool:
    """The forward kernel's P_BITS constexpr: round P to bf16 in integer operations, on the
    AMD targets without a conversion instruction (see ``_bf16_by_bits`` in v3)."""
    return dtype == torch.bfloat16 and backend == "hip" and arch in NO_BF16_CONVERSION


def k_rows(backend: str, arch: str) -> bool:
    """The forward kernel's K_ROWS constexpr: read K as rows and transpose it on chip, on CDNA3
    only, where it saves the VGPRs that made v4's packed prior spill. On CDNA4 the Kᵀ tile
    keeps lane permutes (``ds_bpermute_b32``) out of the hot loop, where the rows read was
    measured to add two (tests/test_attention_isa.py checks the first); elsewhere nothing
    asks for it, and the interpreter must keep
    the Kᵀ product's rounding, which the backward's recomputed scores match (v5's large-score
    test, whose NumPy dots round by operand orientation)."""
    return backend == "hip" and arch.startswith("gfx94")


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


def aot_even(ints: dict, cfg: dict, flags: dict) -> dict:
    """:func:`even` for an ahead-of-time launch of ``ints`` (:func:`aot_ints`), packed when
    ``flags`` (``varlen.aot_args``) say VARLEN: the constexprs the JIT would pick."""
    return even(ints["S"], ints["SK"], ints["D"], cfg, packed=flags["VARLEN"])
