"""Save and resume a training run: model, optimizer, step count and RNG states.

The data need no state (a batch is a function of seed and step, :mod:`.data`), so
these four make a resumed run repeat an uninterrupted one's losses, if it is the same run:
the checkpoint also records what defines the run (:data:`RUN`), and a resume that asks for
another preset, seed, FP8 recipe or set of layers kept in high precision is refused. Several
of those would load without complaint (a tensorwise model's state is a plain one's) and go on
training another experiment under the saved one's rows. Written whole or
not at all (:func:`kernels.atomic.write_atomic`); loaded with ``weights_only=True``
(tensors and plain containers, no pickled code). A file that is missing, truncated,
empty or not such a checkpoint is refused by :func:`read` before anything is trained,
naming ``resume`` and the file. One process's full state: a data-parallel (sharded)
run does not checkpoint here.
"""
from __future__ import annotations

from pathlib import Path

import torch

from kernels.atomic import write_atomic
from .files import FileArgumentError

KEYS = ("model", "optimizer", "step", "rng_cpu", "rng_cuda")
RUN = ("preset", "seed", "fp8", "fp8_keep")
"""What a resumed run must share with the saved one, as :func:`.loop.run` records it in the rows.
The kernels and ``compile`` may change: they compute the same steps."""


def save(path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int, run: dict) -> Path:
    """Write the state after ``step`` optimizer steps of the run ``run`` (:data:`RUN`'s values) to ``path``."""
    state = {
        "run": {key: run[key] for key in RUN},
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "step": step,
        "rng_cpu": torch.get_rng_state(),
        "rng_cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }
    return write_atomic(path, lambda fh: torch.save(state, fh))


def _is_state(state) -> bool:
    # "run": absent from checkpoints written before it was recorded, which resume unchecked
    return (isinstance(state, dict) and set(KEYS) <= set(state) <= {*KEYS, "run"}
            and isinstance(state.get("run", {}), dict)
            and isinstance(state["model"], dict) and isinstance(state["optimizer"], dict)
            and type(state["step"]) is int and state["step"] >= 0
            and isinstance(state["rng_cpu"], torch.Tensor) and state["rng_cpu"].dtype == torch.uint8
            and isinstance(state["rng_cuda"], list))


def read(path, run: dict) -> dict:
    """The checkpoint in ``path``, checked to be one and to be of the run ``run`` (:data:`RUN`'s
    values, where it records them); nothing is restored yet."""
    path = Path(path)
    if not path.is_file():
        raise FileArgumentError("resume", path, "no such file" if not path.exists() else "not a file")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - a damaged or foreign file raises RuntimeError,
        # EOFError, UnpicklingError, KeyError, ... depending on where torch.load gives up
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else "no data"
        raise FileArgumentError("resume", path, f"not a readable checkpoint: truncated, empty or "
                                                f"foreign ({type(exc).__name__}: {why})") from exc
    if not _is_state(state):
        raise FileArgumentError("resume", path, f"not a workbench training checkpoint (a dict of "
                                                f"{', '.join(KEYS)})")
    saved = state.get("run", run)
    differ = [key for key in RUN if saved.get(key) != run[key]]
    if differ:
        raise FileArgumentError("resume", path, "a checkpoint of another run: " + "; ".join(
            f"{key} {saved.get(key)!r} there, {run[key]!r} here" for key in differ)
            + " (resume with the saved run's values, or start a new run)")
    return state


def restore(state: dict, path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Put a :func:`read` state into ``model`` and ``optimizer``; returns the steps it had done."""
    try:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    except (RuntimeError, ValueError, KeyError) as exc:
        why = str(exc).strip().splitlines()[0]
        raise FileArgumentError("resume", path, f"a checkpoint of another model or optimizer "
                                                f"({type(exc).__name__}: {why})") from exc
    torch.set_rng_state(state["rng_cpu"])
    if state["rng_cuda"]:
        torch.cuda.set_rng_state_all(state["rng_cuda"])
    return state["step"]
