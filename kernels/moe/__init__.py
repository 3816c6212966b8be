"""Mixture of experts: the grouped GEMM ladder (:mod:`.grouped_gemm`, the public
``kernels.grouped_gemm``), the pieces of an MoE layer built on it, and the layer.

- :func:`route`, :func:`aux_loss`, :func:`expert_counts` (:mod:`.routing`): softmax
  top-k routing with deterministic ties, the load-balancing loss, tokens per expert;
  :func:`route_fused` (:mod:`.routing_fused`), the three in two Triton launches, as the
  layers route.
- :func:`permute`, :func:`unpermute` (:mod:`.permutation`): token-slots into expert order for
  the grouped GEMM and back, deterministic, with autograd.
- :class:`MoE` (:mod:`.layer`, also ``kernels.MoE``) and its plain-PyTorch twin
  :class:`MoEReference` (:mod:`.reference`); the ``moe`` op's ladder is :mod:`.layer_ladder`.
- :class:`ExpertParallelMoE` (:mod:`.ep_layer`): ``kernels.MoE(..., ep_group=group)``, the
  experts split over ranks; it and :class:`MoE` share the base :class:`MoELayer`
  (:mod:`.layer_base`) and neither imports the other's module back.

Names load on first use, so importing the grouped GEMM does not import the layer.
"""
import importlib

_LAZY = {
    "route": ".routing", "aux_loss": ".routing", "expert_counts": ".routing", "route_fused": ".routing_fused",
    "permute": ".permutation", "unpermute": ".permutation",
    "MoE": ".layer", "MoELayer": ".layer_base", "MoEReference": ".reference", "ExpertParallelMoE": ".ep_layer",
}

__all__ = list(_LAZY)


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'kernels.moe' has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name], __name__), name)
