"""Input checks shared by every rung and public op.

A kernel that is handed a tensor it cannot take must refuse with an error that names
the argument, never read out of bounds or return a wrong answer. These checks run
before any launch.
"""
from __future__ import annotations

import math
import struct
from typing import Sequence

import torch

from . import backend as _backend


def tensor(name: str, value, *, ndim: int | None = None,
           dtypes: Sequence[torch.dtype] | None = None, allow_empty: bool = False) -> torch.Tensor:
    """Check one tensor argument: type, rank, dtype, device, and non-empty unless
    ``allow_empty`` (public ops take empty tensors as torch does; a kernel launch does not)."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if ndim is not None and value.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(value.shape)}")
    if dtypes is not None and value.dtype not in dtypes:
        allowed = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{name} has dtype {str(value.dtype).replace('torch.', '')}; "
                        f"this kernel takes {allowed}")
    if value.numel() == 0 and not allow_empty:
        raise ValueError(f"{name} is empty (shape {tuple(value.shape)}); nothing to compute")
    here = _backend.current()
    if value.device.type != here.device:
        raise ValueError(f"{name} is on {value.device}, but the {here.name} backend "
                         f"needs tensors on {here.device!r}")
    return value


def index(name: str, value, *, ndim: int, dtypes: Sequence[torch.dtype]) -> torch.Tensor:
    """Check an integer tensor a kernel reads as numbers to address memory with (group
    offsets, cu_seqlens) and return it packed (``.contiguous()``: a copy only for a strided
    or expanded view).

    The kernels read such a tensor as a flat array, element i at its first element + i.
    The host checks its values through its strides, so a sliced or strided view would
    pass the check and then be read as other numbers (the padding between its
    elements), which the kernel would use as row indices. The packed copy is what the
    host checked; an offset into the storage needs no copy (the kernel gets the
    address of the first element). Empty is allowed: zero groups is a legal problem.
    """
    tensor(name, value, ndim=ndim, dtypes=dtypes, allow_empty=True)
    return value.contiguous()


def same_dtype(**named: torch.Tensor) -> torch.dtype:
    # A plain loop, no comprehension: this runs on every call of every public op.
    first, *rest = named.values()
    for t in rest:
        if t.dtype != first.dtype:
            desc = ", ".join(f"{n}: {str(t.dtype).replace('torch.', '')}" for n, t in named.items())
            raise TypeError(f"dtypes differ ({desc}); cast them to one dtype first")
    return first.dtype


def same_device(**named: torch.Tensor) -> None:
    first, *rest = named.values()
    for t in rest:
        if t.device != first.device:
            desc = ", ".join(f"{n}: {t.device}" for n, t in named.items())
            raise ValueError(f"tensors are on different devices ({desc})")


def matmul_operands(a, b, dtypes: Sequence[torch.dtype],
                    allow_empty: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Check a (M, K) @ b (K, N): the common signature of every GEMM rung."""
    tensor("a", a, ndim=2, allow_empty=allow_empty)
    tensor("b", b, ndim=2, allow_empty=allow_empty)
    same_device(a=a, b=b)
    same_dtype(a=a, b=b)
    tensor("a", a, dtypes=dtypes, allow_empty=allow_empty)
    inner_dims(a, b)
    return a, b


def inner_dims(a: torch.Tensor, b: torch.Tensor) -> None:
    """a (M, K) and b (K, N) share K."""
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"inner dimensions differ: a is {tuple(a.shape)} (M, K), "
                         f"b is {tuple(b.shape)} (K, N)")


def attention_operands(q, k, v, scale, dtypes: Sequence[torch.dtype], max_head_dim: int,
                       allow_empty: bool = False) -> float:
    """Check q (B, Hq, S, D), k and v (B, Hkv, S_k, D): the common signature of every
    attention rung. Returns the softmax scale (1/sqrt(D) when ``scale`` is None)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        tensor(name, t, ndim=4, allow_empty=allow_empty)
    same_device(q=q, k=k, v=v)
    same_dtype(q=q, k=k, v=v)
    tensor("q", q, dtypes=dtypes, allow_empty=allow_empty)
    if k.shape != v.shape:
        raise ValueError(f"k and v must have one shape (B, Hkv, S_k, D), got k {tuple(k.shape)}, "
                         f"v {tuple(v.shape)}")
    (b, hq, _, d), (bk, hkv, _, dk) = q.shape, k.shape
    if b != bk:
        raise ValueError(f"batch differs: q has B={b}, k and v have B={bk}")
    if d != dk:
        raise ValueError(f"head dim differs: q has D={d}, k and v have D={dk}")
    if not 1 <= d <= max_head_dim:
        raise ValueError(f"head dim D={d} is not supported: q, k, v need 1 <= D <= {max_head_dim}")
    if (hq % hkv) if hkv else hq:      # Hq = Hkv = 0 is empty, as in SDPA
        raise ValueError(f"q's {hq} heads are not a multiple of k and v's {hkv} heads (GQA needs Hq % Hkv == 0)")
    if scale is None:
        return d ** -0.5
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"scale must be a float or None, got {type(scale).__name__}")
    return fp32_argument("scale", float(scale))


def dtype_choice(name: str, value, allowed: Sequence[torch.dtype], optional: bool = False) -> None:
    """Refuse ``value`` unless it is one of the ``allowed`` dtypes (or None, where ``optional``): an
    op's ``out_dtype`` and the like, with the choices named in the error."""
    if optional and value is None:
        return
    choices, none = ", ".join(str(d).replace("torch.", "") for d in allowed), " or None" if optional else ""
    if not isinstance(value, torch.dtype):
        raise TypeError(f"{name} must be a torch.dtype ({choices}){none}, got {value!r}")
    if value not in allowed:
        raise TypeError(f"{name} must be one of {choices}{none}, got {value}")


_FP32_TINY = torch.finfo(torch.float32).tiny


def fp32_argument(name: str, value: float) -> float:
    """``value`` as a kernel's float argument is on a GPU: Triton's JIT types every Python float
    ``fp32``, so a launch rounds it to fp32. The interpreter instead folds it into a constant,
    fp64 where fp32 cannot hold it as a normal number, and a kernel then computes in fp64, a
    type no GPU launch has (its bf16 rounding refuses fp64). So the value is rounded to fp32
    here; one below fp32's smallest normal number becomes 0 (its products with the scores
    underflow on a GPU too), and one past fp32's largest is refused."""
    rounded = struct.unpack("f", struct.pack("f", value))[0]
    if math.isinf(rounded) and not math.isinf(value):
        raise ValueError(f"{name}={value!r} is outside float32's range (the kernels take it as float32)")
    return math.copysign(0.0, rounded) if abs(rounded) < _FP32_TINY else rounded


def grouped_gemm_operands(x, w, offsets, dtypes: Sequence[torch.dtype], allow_empty: bool = False,
                          check_values: bool = True, same_dtypes: bool = True) -> torch.Tensor:
    """Check x (T, K), w (G, K, N) and int32 offsets (G,): the common signature of every
    grouped GEMM rung; returns the offsets packed (:func:`index`), the tensor to launch
    with. ``check_values`` also reads the offsets (one host sync of G ints) to refuse
    ends that decrease or do not finish at T; a caller that built them itself
    (``kernels.moe.permute``) skips that. ``same_dtypes=False``: x and w may differ (FP8
    formats of one family, an e5m2 gradient beside e4m3), each checked against ``dtypes``
    and the pair by the caller."""
    tensor("x", x, ndim=2, allow_empty=allow_empty)
    tensor("w", w, ndim=3, allow_empty=allow_empty)
    if isinstance(offsets, torch.Tensor) and offsets.dtype != torch.int32:
        raise TypeError(f"offsets must be int32 (cumulative row ends per group), got "
                        f"{str(offsets.dtype).replace('torch.', '')}")
    offsets = index("offsets", offsets, ndim=1, dtypes=(torch.int32,))
    same_device(x=x, w=w, offsets=offsets)
    if same_dtypes:
        same_dtype(x=x, w=w)
    tensor("x", x, dtypes=dtypes, allow_empty=allow_empty)
    if not same_dtypes:
        tensor("w", w, dtypes=dtypes, allow_empty=allow_empty)
    if x.shape[1] != w.shape[1]:
        raise ValueError(f"inner dimensions differ: x is {tuple(x.shape)} (T, K), "
                         f"w is {tuple(w.shape)} (G, K, N)")
    if offsets.shape[0] != w.shape[0]:
        raise ValueError(f"offsets has {offsets.shape[0]} entries but w has {w.shape[0]} groups "
                         f"(G); offsets[g] is the end row of group g")
    if check_values:
        group_ends(offsets, x.shape[0])
    return offsets


def group_ends(offsets: torch.Tensor, rows: int) -> None:
    """Read int32 offsets (G,) on the host (one sync) and refuse ends that decrease, start
    below 0 or do not finish at ``rows``. One ``tolist`` and a Python pass: a check that runs
    on every call that asks for it, and G (the experts) is small."""
    ends = offsets.tolist()
    if ends and (ends[0] < 0 or ends != sorted(ends)):   # sorted: non-decreasing, checked in C
        raise ValueError(f"offsets must be non-decreasing row ends starting at >= 0, got {ends[:16]}")
    last = ends[-1] if ends else 0
    if last != rows:
        raise ValueError(f"offsets[-1] must equal x's row count T={rows}, got {last}")
