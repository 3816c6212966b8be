"""The one switch between PyTorch and the workbench kernels for every hot op.

``kernels`` is ``"torch"``, ``"workbench"``, or a mapping per op such as
``{"attention": "workbench", "moe": "torch"}`` (ops left out run on PyTorch). The ops:

- ``gemm``: every dense projection (attention q/k/v/o, dense FFN, LM head):
  ``torch.nn.Linear`` or ``kernels.nn.Linear``;
- ``attention``: SDPA or ``kernels.flash_attention`` (causal, GQA);
- ``moe``: the plain-PyTorch MoE of :mod:`.ffn` or ``kernels.MoE``;
- ``norm``: every RMSNorm (:class:`.layers.RMSNorm`): its eager fp32 formula or
  ``kernels.rms_norm``, the same formula in one launch forward, and with the residual add before
  it (:meth:`.layers.RMSNorm.add`) ``kernels.add_rms_norm``, the add in the same launch;
- ``rope``: the rotary embedding of q and k (:func:`.layers.apply_rope` or ``kernels.rope``);
- ``swiglu``: the dense FFN's ``silu(gate) * up`` (:class:`.layers.SwiGLU`): two torch ops, or
  ``kernels.moe.swiglu_op.swiglu``, one pass (the MoE FFN's SwiGLU follows ``moe``);
- ``loss``: the next-token cross-entropy (:class:`.model.GPT`): ``F.cross_entropy`` of the
  logits cast to fp32, or ``kernels.cross_entropy``, which reads them in their own dtype.

Each workbench side computes what its torch side does, in fp32 where that does, rounded once
where torch rounds after each op; these last four exist to cut the eager step's device ops
and its fp32 round trips through memory (``workbench bench overhead`` counts the ops per step).

Under autocast the workbench ops run in the dtype PyTorch's own would: their custom ops
register it (:mod:`kernels.autocast`).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

import kernels as _kernels
from kernels.joint_gemm import joint_gemm

OPS = ("gemm", "attention", "moe", "norm", "rope", "swiglu", "loss")
IMPLS = ("torch", "workbench")


def resolve(choice) -> dict[str, str]:
    """``"torch"`` / ``"workbench"`` / a partial mapping -> an implementation for every op."""
    if isinstance(choice, str):
        choice = dict.fromkeys(OPS, choice)
    unknown = set(choice) - set(OPS)
    if unknown:
        raise ValueError(f"unknown op(s) {sorted(unknown)} in kernels=; the ops are {OPS}")
    impls = {op: choice.get(op, "torch") for op in OPS}
    for op, impl in impls.items():
        if impl not in IMPLS:
            raise ValueError(f"kernels[{op!r}] must be one of {IMPLS}, got {impl!r}")
    return impls


def label(impls: dict[str, str]) -> str:
    """One word when every op agrees, else ``gemm=workbench,attention=torch,...``."""
    values = set(impls.values())
    return values.pop() if len(values) == 1 else ",".join(f"{k}={v}" for k, v in impls.items())


def wrappable(label: str) -> str:
    """A :func:`label` with a space after each comma: a table cell or a chart legend can
    break it there instead of running one long word past its column."""
    return label.replace(",", ", ")


def linear_class(impl: str) -> type[torch.nn.Linear]:
    """The projections' class: both have torch's parameters and initialization."""
    return _kernels.nn.Linear if impl == "workbench" else torch.nn.Linear


def linear(impl: str, in_features: int, out_features: int) -> torch.nn.Linear:
    """A bias-free projection of :func:`linear_class`."""
    return linear_class(impl)(in_features, out_features, bias=False)


def side_by_side(projections: tuple[torch.nn.Linear, ...], x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Each projection of the same x, those of one class and bias-free as one GEMM on their weights
    side by side, as fused projections run (Megatron's ``linear_qkv`` and ``linear_fc1``): separate,
    they would read x once each, and the backward would run one dgrad GEMM each and add their
    gradients of x (:func:`kernels.joint_gemm.joint_gemm`). The concatenated weight costs one copy per
    step; its gradient's rows are views, one per weight. The modules stay apart, so checkpoints and
    ``kernels.fp8.convert`` see each.

    The class decides the GEMM, as the layer's own forward would: ``torch.nn.Linear`` runs
    ``F.linear``, ``kernels.nn.Linear`` ``kernels.nn.linear``, and FP8 layers from
    ``kernels.fp8.convert`` one FP8 linear where their settings allow (:func:`kernels.fp8.side_by_side`).
    Projections of different classes join their own kind: block 0's q, kept in high precision,
    runs alone while its converted k and v run as one. A projection with a bias, or of a class
    that cannot join, runs its own forward."""
    groups: dict[object, list[int]] = {}
    for i, p in enumerate(projections):
        groups.setdefault(i if p.bias is not None else type(p), []).append(i)
    out: list[torch.Tensor | None] = [None] * len(projections)
    for members in groups.values():
        for i, y in zip(members, _together(tuple(projections[i] for i in members), x)):
            out[i] = y
    return tuple(out)


def _together(projections: tuple[torch.nn.Linear, ...], x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Projections of one class (or one with a bias) as one GEMM where the class allows."""
    if len(projections) > 1:
        gemm = _plain_gemm(type(projections[0]))
        if gemm is not None:
            return joint_gemm(gemm, x, [p.weight for p in projections])
        joint = _kernels.fp8.side_by_side(projections, x)
        if joint is not None:
            return joint
    return tuple(p(x) for p in projections)


def _plain_gemm(cls: type):
    """The GEMM of a high-precision projection class's forward (None for any other class); a model of
    torch's Linears alone never loads ``kernels.nn``."""
    if cls is torch.nn.Linear:
        return F.linear
    return _kernels.nn.linear if cls is _kernels.nn.Linear else None


def attention(impl: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention, q (B, Hq, S, D), k and v (B, Hkv, S, D) -> (B, Hq, S, D)."""
    if impl == "workbench":
        return _kernels.flash_attention(q, k, v, causal=True)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
