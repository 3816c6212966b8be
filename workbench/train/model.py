"""The decoder-only transformer: embeddings, pre-norm blocks, final norm, LM head."""
from __future__ import annotations

import torch
import torch.nn.functional as F

import kernels as _kernels

from . import ops
from .ffn import moe_ffn
from .layers import Attention, RMSNorm, SwiGLU, rope_tables


class Block(torch.nn.Module):
    """``x + attn(norm(x))``, then ``+ ffn(norm(x))``; the FFN is dense or MoE.

    A block takes the residual stream and the branch the block before it returned (None in the
    first) and returns the stream and its own FFN's output: each residual add then happens where
    its sum is normed (:meth:`RMSNorm.add`: one launch on the workbench side), the last one in
    :class:`GPT`'s final norm. The same sums as ``x = x + ffn(...)`` at the end of each block."""

    def __init__(self, cfg, impls: dict[str, str], layer: int):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps, impls["norm"])
        self.attn = Attention(cfg, impls)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps, impls["norm"])
        self.moe = cfg.is_moe(layer)
        self.ffn = (moe_ffn(cfg, impls["moe"]) if self.moe
                    else SwiGLU(cfg.dim, cfg.ffn_hidden, impls["gemm"], impls["swiglu"]))

    def forward(self, x, branch, cos, sin):
        x, normed = self.attn_norm.add(x, branch)
        x, normed = self.ffn_norm.add(x, self.attn(normed, cos, sin))
        return x, self.ffn(normed)


class GPT(torch.nn.Module):
    """Tokens (B, S) -> logits (B, S, vocab), or with targets the loss."""

    def __init__(self, cfg, kernels="torch"):
        super().__init__()
        self.cfg, self.impls = cfg, ops.resolve(kernels)
        self.embed = torch.nn.Embedding(cfg.vocab, cfg.dim)
        self.blocks = torch.nn.ModuleList(Block(cfg, self.impls, i) for i in range(cfg.layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps, self.impls["norm"])
        self.head = ops.linear(self.impls["gemm"], cfg.dim, cfg.vocab)
        # RoPE's cos and sin for every position up to the preset's length, made once: a forward
        # slices them (a view) where recomputing them cost 8 device ops per step on either side.
        # Not persistent, so checkpoints stay as they were; they move with the model's device.
        cos, sin = rope_tables(cfg.seq, cfg.head_dim, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def rope(self, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin (seq, head_dim/2) for positions 0..seq-1: rows of the tables made at
        construction, or made now for a sequence longer than the preset's."""
        if seq <= self.rope_cos.shape[0]:
            return self.rope_cos[:seq], self.rope_sin[:seq]
        return rope_tables(seq, self.cfg.head_dim, self.cfg.rope_theta, self.rope_cos.device)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (B, S, vocab); given ``targets``, the training loss instead.

        The loss is the mean next-token cross-entropy plus ``aux_loss_coef`` times each
        MoE layer's balancing loss. It is computed here, in ``forward``, so DDP and
        ``torch.compile`` see the whole step's graph through one call.
        """
        cos, sin = self.rope(tokens.shape[1])
        x, branch = self.embed(tokens), None
        for block in self.blocks:
            x, branch = block(x, branch, cos, sin)
        _, normed = self.norm.add(x, branch)
        logits = self.head(normed)
        if targets is None:
            return logits
        if self.impls["loss"] == "workbench":   # the logits in their own dtype, computed in fp32
            loss = _kernels.cross_entropy(logits.flatten(0, 1), targets.flatten())
        else:
            loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
        for block in self.blocks:
            if block.moe:
                loss = loss + self.cfg.aux_loss_coef * block.ffn.aux_loss
        return loss
