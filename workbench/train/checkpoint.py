"""Save and resume a training run: model, optimizer, step count and RNG states.

The data need no state (a batch is a function of seed and step, :mod:`.data`), so
these four make a resumed run repeat an uninterrupted one's losses. Written to a
temporary file that then replaces the target, so a crash never leaves half a
checkpoint; loaded with ``weights_only=True`` (tensors and plain containers, no
pickled code). One process's full state: a data-parallel (sharded) run does not
checkpoint here.
"""
from __future__ import annotations

import os
from pathlib import Path

import torch


def save(path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int) -> Path:
    """Write the state after ``step`` optimizer steps to ``path``."""
    path = Path(path)
    state = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "step": step,
        "rng_cpu": torch.get_rng_state(),
        "rng_cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)
    return path


def load(path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Restore a checkpoint into ``model`` and ``optimizer``; returns the steps it had done."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["rng_cpu"])
    if state["rng_cuda"]:
        torch.cuda.set_rng_state_all(state["rng_cuda"])
    return state["step"]
