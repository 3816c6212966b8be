"""Synthetic token batches: learnable, reproducible, and nothing to download.

Each sequence follows a fixed random successor table (token t is followed by
``successor[t]`` with probability 3/4, else by a uniform token), so the loss has
something to learn and falls from ln(vocab) towards the chain's entropy. A batch is a
pure function of (seed, step): no data-loader state to checkpoint, and a
data-parallel run of W processes draws the same global batch as one process with W
times the batch, each process taking its own rows.
"""
from __future__ import annotations

import torch

FOLLOW = 0.75


def batch(cfg, seed: int, step: int, rank: int = 0, world: int = 1,
          device="cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and next-token targets (``cfg.batch``, ``cfg.seq``) of ``rank``'s share of ``step``."""
    table = torch.Generator().manual_seed(seed)
    successor = torch.randperm(cfg.vocab, generator=table)
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step + 1)
    rows = cfg.batch * world
    tokens = torch.empty(rows, cfg.seq + 1, dtype=torch.long)
    tokens[:, 0] = torch.randint(cfg.vocab, (rows,), generator=gen)
    noise = torch.randint(cfg.vocab, (rows, cfg.seq), generator=gen)
    follow = torch.rand(rows, cfg.seq, generator=gen) < FOLLOW
    for t in range(cfg.seq):
        tokens[:, t + 1] = torch.where(follow[:, t], successor[tokens[:, t]], noise[:, t])
    mine = tokens[rank * cfg.batch:(rank + 1) * cfg.batch].to(device)
    return mine[:, :-1], mine[:, 1:]
