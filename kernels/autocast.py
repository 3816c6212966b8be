"""Autocast for the package's custom ops: they run in the autocast dtype, as
``torch.matmul`` and SDPA do.

A public op casts its operands (:func:`operands`) before it checks them, where
:func:`active` says a region is open: torch's ops take operands of different floating
dtypes there (bf16 activations with float32 weights: what autocast is for), and the
checks, which want one dtype, would refuse them before the custom op's autocast rule ran;
cast, the call needs no custom op and runs as an eager one (:func:`kernels.eager.path`).

Autocast casts only the ops it knows. ``torch.library.register_autocast`` teaches it a
custom op, but with one dtype fixed when the op is registered, where torch's own
lower-precision ops take the dtype of the region they run in (bf16 or fp16 per
``torch.autocast(device, dtype=...)``). :func:`lower_precision` registers the latter:
in an autocast region, each floating-point tensor argument on the region's device
(float64 excepted, as torch does) is cast to the region's dtype, and the op runs with
autocast off. The casts are autograd ops, so gradients reach the original tensors in
their own dtypes.

:func:`operands` is the same cast for code that launches kernels outside a custom op
(``kernels.MoE``'s fused experts).
"""
from __future__ import annotations

from itertools import repeat

import torch

_LIBRARY = torch.library.Library("kernels", "FRAGMENT")   # lives as long as the registrations
_KEYS = {"cpu": "AutocastCPU", "cuda": "AutocastCUDA"}      # ROCm runs under "cuda" too
"""The device types whose autocast regions the package follows: the ones its kernels run on. Asked as
``device in _KEYS`` before ``torch.is_autocast_enabled(device)`` (which raises for a device type with
no autocast, such as ``meta``), not as ``torch.amp.is_autocast_available(device)``: torch 2.11's dynamo
cannot trace that call, so each compiled call under autocast broke its graph there and ``fullgraph=True``
failed (the training step's PyTorch MoE layer broke 4 times more than under 2.13); 2.13 traces both."""


def _casts(value, device: str, dtype: torch.dtype) -> bool:
    """Whether a region of ``dtype`` on ``device`` casts ``value``: a floating-point tensor of another
    dtype on that device, float64 excepted (as torch's autocast)."""
    return (isinstance(value, torch.Tensor) and value.is_floating_point() and value.device.type == device
            and value.dtype not in (torch.float64, dtype))


def _cast(value, device: str, dtype: torch.dtype):
    return value.to(dtype) if _casts(value, device, dtype) else value


def _region_cast(tensors: tuple) -> tuple[tuple, str | None, torch.dtype | None]:
    """:func:`operands`' and :func:`master_operands`' one body: the tensors cast, with the region's
    device type and dtype; the tensors as they are, with None, where no region is open for the first
    tensor's device (or that is not a tensor). ``map``, not a generator: a Python call per tensor
    less (``workbench bench overhead``)."""
    if not isinstance(tensors[0], torch.Tensor):
        return tensors, None, None
    device = tensors[0].device.type
    # region_dtype's test, inline: a Python call less per op call (``workbench bench overhead``)
    if not (device in _KEYS and torch.is_autocast_enabled(device)):
        return tensors, None, None
    dtype = torch.get_autocast_dtype(device)
    return tuple(map(_cast, tensors, repeat(device), repeat(dtype))), device, dtype


def operands(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The tensors in the autocast dtype where autocast is on for their device, else as they are
    (also where the first is not a tensor: the op's checks then name it)."""
    return _region_cast(tensors)[0]


def master_operands(weight: torch.Tensor, *tensors: torch.Tensor
                    ) -> tuple[tuple[torch.Tensor, ...], torch.dtype | None]:
    """:func:`operands` of ``tensors``, and the dtype the same region casts ``weight`` to (an fp32
    master weight under a bf16 region: its gradient can be made in its own dtype,
    :mod:`kernels.gemm.wgrad`), or None where it leaves the weight as it is (or no region is open
    for the first tensor's device, or that is not a tensor: the op's checks name it). One question
    to torch for both, where :func:`operands` and a second question would ask twice."""
    tensors, device, dtype = _region_cast(tensors)
    return tensors, (dtype if dtype is not None and _casts(weight, device, dtype) else None)


def stand_in(weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A tensor with the metadata of ``weight.to(dtype)`` (``empty_like`` lays it out as ``.to``
    does), needing no gradient: an op checks a master weight's cast on it, where the cast itself
    is made later, inside the autograd node that reads it. An allocation, no device op."""
    return torch.empty_like(weight, dtype=dtype, requires_grad=False)


def region_dtype(device: str) -> torch.dtype | None:
    """The autocast dtype of the region open for ``device`` (a device type such as ``"cpu"``), or
    None where none is (or on a device type whose regions the package does not follow: :data:`_KEYS`)."""
    if device in _KEYS and torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return None


active = torch._C._is_any_autocast_enabled
"""Whether any autocast region is open: one C call, what a public op asks before :func:`operands`."""


def lower_precision(name: str) -> None:
    """Register autocast for the custom op ``kernels::<name>``: its floating-point tensor
    arguments are cast to the autocast dtype of the region, on every device with autocast."""
    op = getattr(torch.ops.kernels, name).default
    for device, key in _KEYS.items():
        def kernel(*args, device=device):
            dtype = torch.get_autocast_dtype(device)
            with torch.autocast(device, enabled=False):
                return op(*(_cast(a, device, dtype) for a in args))
        _LIBRARY.impl(name, kernel, key)
