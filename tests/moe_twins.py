"""A MoE layer's twin in another class or dtype and a run's gradients: the layer's tests and its fuzz compare so."""
from __future__ import annotations

import torch


def run(module, x):
    """Output and the gradients of x and every parameter, for a fixed output gradient."""
    x = x.detach().clone().requires_grad_()
    module.zero_grad()
    out = module(x)
    out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.dtype))
    return {"out": out.detach(), "dx": x.grad,
            **{f"d{n.removeprefix('_orig_mod.')}": p.grad for n, p in module.named_parameters()}}


def twin(layer, cls, dtype):
    twin = cls(layer.dim, layer.hidden, layer.num_experts, layer.top_k, layer.shared_experts,
               normalize=layer.normalize).to(dtype)
    twin.load_state_dict(layer.state_dict())
    return twin
