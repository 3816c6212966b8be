"""Named model and optimizer sizes for the training step, all in this one file.

``cpu-smoke`` is tiny so the Triton interpreter can run both kernel paths in tests;
the GPU presets are sized to one GPU with AdamW in fp32 master weights (16 bytes per
parameter plus activations). Every preset is a frozen :class:`Config`; change one
field with ``dataclasses.replace(PRESETS["cpu-smoke"], batch=4)``.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Config:
    """A decoder-only transformer (RMSNorm, RoPE, GQA, SwiGLU) and its AdamW step.

    ``experts == 0`` makes every FFN dense; otherwise the first ``dense_layers`` layers
    are dense and the rest are MoE with ``experts`` routed experts (``top_k`` per token)
    plus ``shared_experts`` always-on ones, each a SwiGLU of width ``expert_hidden``.
    ``batch`` is per process: a data-parallel run of W processes sees ``W * batch``.
    """

    name: str
    vocab: int
    dim: int
    layers: int
    heads: int
    kv_heads: int
    seq: int
    batch: int
    ffn_hidden: int
    experts: int = 0
    top_k: int = 0
    expert_hidden: int = 0
    shared_experts: int = 0
    dense_layers: int = 0
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6
    lr: float = 1e-3
    weight_decay: float = 0.1
    betas: tuple = (0.9, 0.95)
    grad_clip: float = 1.0
    aux_loss_coef: float = 0.01

    def __post_init__(self):
        if self.dim % self.heads or self.heads % self.kv_heads:
            raise ValueError(f"{self.name}: dim {self.dim} must split into {self.heads} heads, "
                             f"and heads into {self.kv_heads} kv heads")
        if self.experts and not 0 < self.top_k <= self.experts:
            raise ValueError(f"{self.name}: top_k must be in 1..{self.experts}, got {self.top_k}")

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads

    def is_moe(self, layer: int) -> bool:
        return self.experts > 0 and layer >= self.dense_layers


PRESETS = {c.name: c for c in (
    # Seconds per step on two CPU cores under the interpreter; layer 0 dense, layer 1 MoE.
    Config("cpu-smoke", vocab=64, dim=32, layers=2, heads=4, kv_heads=2, seq=16, batch=2,
           ffn_hidden=64, experts=4, top_k=2, expert_hidden=32, shared_experts=1,
           dense_layers=1, lr=3e-3),
    # ~0.9 B parameters in all, ~0.2 B active per token: 32 experts, top-4, one shared.
    Config("gpu-moe-small", vocab=32000, dim=1024, layers=16, heads=16, kv_heads=4, seq=2048,
           batch=8, ffn_hidden=2816, experts=32, top_k=4, expert_hidden=512, shared_experts=1,
           dense_layers=1, lr=3e-4),
    # Llama-like 1.1 B: Llama 3.2 1B's width and depth with a 32k vocabulary, untied head.
    Config("gpu-dense-1b", vocab=32000, dim=2048, layers=16, heads=32, kv_heads=8, seq=2048,
           batch=4, ffn_hidden=8192, rope_theta=500000.0, lr=3e-4),
)}


def preset(name_or_config) -> Config:
    """A preset by name, or a :class:`Config` as it is."""
    if isinstance(name_or_config, Config):
        return name_or_config
    try:
        return PRESETS[name_or_config]
    except KeyError:
        raise KeyError(f"unknown preset {name_or_config!r}; known: {', '.join(PRESETS)}") from None
