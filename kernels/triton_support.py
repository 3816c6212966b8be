"""Small facts every Triton rung needs, kept in one place.

Every GEMM rung calls ``tl.dot(..., input_precision="ieee")``: for fp32 operands that keeps
full precision (TF32/XF32 would drop 13 mantissa bits, which ``torch.matmul`` does not do
by default); for 16-bit operands it changes nothing, and it is the one value every target
accepts (Triton's AMD backend takes "tf32" on gfx942 only and rejects it on gfx950).

The interpreter bf16 workarounds (constexpr ``INTERP_BF16`` in each kernel). Triton's
interpreter gets bfloat16 wrong twice:

1. ``tl.dot`` on bf16 multiplies raw bit patterns (upstream triton issue 11584), so
   the rung upcasts its bf16 tiles to fp32 before ``tl.dot``. That is exact: a bf16
   value is an fp32 value with the low 16 mantissa bits zero, the product of two fits
   in fp32's 24-bit significand, and bf16 MFMA/wgmma accumulate in fp32 too.
2. fp32 -> bf16 conversion truncates instead of rounding to nearest even, so the
   rung rounds the accumulator by hand (:func:`round_to_bf16`) before the store.
   (Subnormal results below 1.2e-38 stay wrong: the interpreter's converter
   mishandles them whatever the input; no GEMM check produces them.)

The interpreter's fp32 -> FP8 (e4m3) conversion has a bug of its own: a value that rounds
up to the next power of two loses the carry into the exponent (127.98 -> 64, not 128),
so a kernel that stores FP8 rounds by hand first (:func:`round_to_fp8`), after which the
conversion has nothing left to round.

With these, the CPU check covers the bf16 loads, masks, accumulation and output
rounding of the real kernel, while on a GPU (and in the ISA inspector) the constexpr
is False and the native bf16 dot and conversion are used. ``tests/test_interpreter_bf16.py``
pins both upstream bugs, so the day they are fixed a test says the workaround can go.
"""
from __future__ import annotations

import math
import re

import torch
import triton
import triton.language as tl

from . import backend as _backend
from .registry import AotKernel

TRITON_DTYPE_NAMES = {
    torch.float32: "fp32",
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
    torch.float8_e4m3fn: "fp8e4nv",
    torch.float8_e4m3fnuz: "fp8e4b8",
    torch.float8_e5m2: "fp8e5",
    torch.float8_e5m2fnuz: "fp8e5b16",
    torch.uint8: "u8",            # packed MXFP4 codes and e8m0 scales
}


def interp_bf16(dtype: torch.dtype) -> bool:
    """Whether the interpreter bf16 workarounds apply to a launch on ``dtype`` here."""
    return dtype == torch.bfloat16 and _backend.current().is_interpreter


@triton.jit
def accumulated(x):
    """``x`` in the type its sums and products accumulate in: float64 stays float64 (a float32
    accumulator would drop its last 29 bits), every other float widens to float32. The test is
    on the dtype, a constant when the kernel is compiled, so only the taken branch is compiled."""
    if x.dtype == tl.float64:
        wide = x
    else:
        wide = x.to(tl.float32)
    return wide


@triton.jit
def round_to_bf16(x):
    """fp32 -> nearest-even bf16 value (still fp32), for the truncating interpreter."""
    bits = x.to(tl.uint32, bitcast=True)
    # Add half an ulp (ties to even), then clear the 16 bits bf16 drops, so the
    # interpreter's own conversion has nothing left to truncate.
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).to(tl.float32, bitcast=True)
    finite = tl.abs(x) < float("inf")
    # A NaN whose payload lies in the dropped bits alone would truncate to +-inf: set
    # the quiet bit, which bf16 keeps (torch's cast gives a NaN there too).
    quiet = tl.where(x != x, (bits | 0x400000).to(tl.float32, bitcast=True), x)
    return tl.where(finite, rounded, quiet)


@triton.jit
def stored_as(acc, ptr, INTERP_BF16: tl.constexpr):
    """The fp32 tile ``acc`` in the element type of ``ptr``, rounded once. Where the interpreter
    would truncate it into a bf16 output, rounded by hand first; ``INTERP_BF16`` says the operands
    are bf16, and the output may not be: an fp32 one (a weight gradient's, :mod:`kernels.gemm.wgrad`)
    takes the sum as it is."""
    if INTERP_BF16:
        if ptr.dtype.element_ty == tl.bfloat16:
            acc = round_to_bf16(acc)
    return acc.to(ptr.dtype.element_ty)


@triton.jit
def store_rows(ptr, rows, cols, stride_t, stride_n, values, mask, INTERP_BF16: tl.constexpr):
    """A (rows, cols) tile of fp32 ``values`` rounded once to the buffer's dtype (:func:`stored_as`);
    int64 offsets."""
    ptrs = ptr + rows.to(tl.int64)[:, None] * stride_t + cols.to(tl.int64)[None, :] * stride_n
    tl.store(ptrs, stored_as(values, ptr, INTERP_BF16), mask=mask)


@triton.jit
def cols_if(cols, C, cond):
    """The columns < C where the scalar ``cond`` holds, else none: a mask built by one compare.
    ``mask & cond`` would say the same, but the interpreter turns a vector mask and'ed with a
    scalar condition into integers, which a load refuses as a mask."""
    return cols < tl.where(cond, C, 0)


@triton.jit
def round_to_fp8(y, MANT: tl.constexpr, EMIN: tl.constexpr):
    """fp32 ``y`` (|y| <= the format's max; the caller saturates) rounded to nearest even on
    an FP8 grid of ``MANT`` mantissa bits whose smallest normal is 2^``EMIN``, still fp32
    (:func:`fp8_grid` gives both for a torch dtype).

    The grid spacing at y is 2^(e - MANT), e = y's binade (at least EMIN, below which the
    format's subnormals keep that spacing). Adding C = 1.5 * 2^(e - MANT + 23) makes the
    fp32 add round at exactly that spacing (the sum lies in [2^(u+23), 2^(u+24)) for
    |y| < 2^(u+22)), to nearest even since C's own last bits are even; subtracting C is exact.
    The sign is put back afterwards, so -0 and small negatives keep it as a cast would.
    ``tests/test_interpreter_bf16.py`` pins the upstream bug and checks this against torch's cast."""
    bits = y.to(tl.int32, bitcast=True)
    binade = tl.maximum(((bits >> 23) & 0xFF) - 127, EMIN)
    magic = (((binade - MANT + 23 + 127) << 23) | (1 << 22)).to(tl.float32, bitcast=True)
    rounded = (tl.abs(y) + magic) - magic
    return tl.where(bits < 0, -rounded, rounded)


def fp8_grid(dtype: torch.dtype) -> dict[str, int]:
    """:func:`round_to_fp8`'s constexprs for an FP8 dtype: mantissa bits and the smallest
    normal's exponent (e4m3fn 3, -6; e4m3fnuz 3, -7; e5m2 2, -14; e5m2fnuz 2, -15). The
    mantissa bits are read from the format's name: torch 2.13's ``finfo(float8_e5m2fnuz).eps``
    is 0.125, a 3-bit epsilon for a 2-bit mantissa (``tests/test_interpreter_bf16.py``)."""
    mant = int(re.fullmatch(r"float8_e\dm(\d)\w*", str(dtype).removeprefix("torch.")).group(1))
    return dict(MANT=mant, EMIN=int(math.log2(torch.finfo(dtype).smallest_normal)))


def pointer_type(dtype: torch.dtype) -> str:
    """Triton signature type of a pointer to ``dtype`` (for ahead-of-time compiles)."""
    return "*" + TRITON_DTYPE_NAMES[dtype]


def cdiv(x: int, y: int) -> int:
    return (x + y - 1) // y


def next_power_of_2(n: int) -> int:
    """``triton.next_power_of_2`` for a host int (0 for 0), without its constexpr wrapper:
    Triton's version costs five Python calls, and tuning keys take it per dim per call."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


def run_kwargs(grid: tuple, constexprs: dict) -> dict:
    """The keyword arguments ``kernel[grid](*args, **constexprs)`` gives ``kernel.run`` (Triton's
    ``KernelInterface.__getitem__``: the grid, ``warmup=False`` and the constexprs), merged once.
    A launch plan keeps them and calls ``kernel.run(*args, **kept)``: the ``kernel[grid]`` proxy
    repacks every argument twice per launch (its lambda, then ``run``), host time that grows
    with the argument count (attention's launch has 29). ``run``
    is looked up at each launch, so whatever replaces it (a stub, a counter) sees every one."""
    return {"grid": grid, "warmup": False, **constexprs}


def run_args(kernel, tensors: int, scalars: tuple, grid: tuple, settings: dict) -> tuple[tuple, dict]:
    """``kernel.run``'s arguments after its ``tensors`` leading tensor arguments, kept by a launch
    plan as ``(args, kwargs)`` for ``kernel.run(*tensors, *args, **kwargs)``: ``scalars``, then the
    kernel's parameters that ``settings`` names (its constexprs) by position, in the kernel's
    order; :func:`run_kwargs` of the rest of ``settings`` (compile options such as ``num_warps``).
    Triton binds a parameter given by position as it binds it by name (the interpreter's and the
    JIT's binders: ``tests/test_launch_plans.py``), but each keyword argument goes into the dict
    ``run(..., **kwargs)`` builds per launch (``workbench bench overhead`` shows the packing
    time per op). The named parameters must be the kernel's last ones,
    right after the scalars, and only they: anything else raises here, when the plan is built,
    not at a launch."""
    names = list(kernel.arg_names)
    first = tensors + len(scalars)
    if set(names[first:]) - set(settings) or set(names[:first]) & set(settings) or first > len(names):
        raise ValueError(f"{kernel.__name__}: {tensors} tensors and {len(scalars)} scalars leave "
                         f"{names[first:]} to name, settings name {sorted(settings)}")
    constexprs = names[first:]
    return ((*scalars, *(settings[name] for name in constexprs)),
            run_kwargs(grid, {k: v for k, v in settings.items() if k not in constexprs}))


def unspecialized(jit_fn) -> frozenset[str]:
    """The arguments ``jit_fn`` declares with ``@triton.jit(do_not_specialize=...)``, by name: the
    JIT makes no constant of one equal to 1, so one binary serves every value (a count that
    varies with the shape). A JIT function's parameters say it; an interpreted one keeps the
    decorator's arguments on its rewriter (as :mod:`workbench.isa.compile` rebuilds it); a wrapper
    (``triton.autotune``'s) answers for the function it wraps."""
    if not hasattr(jit_fn, "params") and not hasattr(jit_fn, "rewriter"):
        return unspecialized(jit_fn.fn)
    if hasattr(jit_fn, "params"):
        return frozenset(p.name for p in jit_fn.params if p.do_not_specialize)
    given = jit_fn.rewriter.kwargs.get("do_not_specialize") or ()
    return frozenset(jit_fn.arg_names[n] if isinstance(n, int) else n for n in given)


def aot_launch(jit_fn, dtype: torch.dtype, cfg: dict, ints: dict[str, int],
               constexprs: dict | None = None, pointers: dict[str, str] | None = None) -> AotKernel:
    """Describe one launch the way Triton's JIT specializes it, for an ahead-of-time compile.

    At launch the JIT turns every int argument equal to 1 into a constant (here: a
    constexpr of the signature), except those the kernel names in ``do_not_specialize``
    (:func:`unspecialized`), and marks the ones divisible by 16, 16-byte aligned
    pointers and, on AMD, pointers into less than 2 GB, which is what lets it vectorise
    loads, use buffer loads and software-pipeline the K loop. An ahead-of-time compile
    must be told the same, or the ISA shows loads and a loop that no GPU runs: the int
    and float values are kept (``scalars``) so that the compile asks Triton itself for
    those attributes (:mod:`workbench.isa.compile`).

    ``cfg`` holds the rung's settings: upper-case keys are constexprs, the rest compile
    options (``num_warps``, ``num_stages``, AMD knobs). ``ints`` are the int arguments'
    values at the launch shown (for GEMMs an 8192^3 row-major problem; a float, such as
    attention's softmax scale, is an fp32 argument); pointers are
    ``dtype`` unless ``pointers`` says otherwise (e.g. an fp32 workspace).
    """
    names = list(jit_fn.arg_names)
    unit = unspecialized(jit_fn)
    fixed = {**{k: v for k, v in cfg.items() if k.isupper()}, **(constexprs or {}),
             **{k: 1 for k, v in ints.items() if v == 1 and k not in unit}}
    signature = {}
    for name in names:
        if name in fixed:
            signature[name] = "constexpr"
        elif name in ints:
            signature[name] = "fp32" if isinstance(ints[name], float) else "i32"
        elif name.endswith("_ptr"):
            signature[name] = (pointers or {}).get(name, pointer_type(dtype))
        else:
            raise ValueError(f"{jit_fn.__name__}: no value for argument {name!r} in the AOT launch")
    return AotKernel(
        jit_fn, signature,
        constexprs={k: fixed[k] for k in names if signature[k] == "constexpr"},
        options={k: v for k, v in cfg.items() if not k.isupper()},
        scalars={k: ints[k] for k in names if signature[k] in ("i32", "fp32")})
