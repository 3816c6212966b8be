"""``kernels.tune``: the tuning pass, so that no training step ever stops to time a kernel.

The tuned rungs choose a config per key (shape bucket, dtype, layout) and time the
candidates of a key the first time they meet it (:func:`kernels.tuning.choice`; with a
ranker installed, :func:`kernels.tuning.set_ranker`, only its shortlist). In a
training loop that first time would be a step, and a GPU that is data parallel would
then wait on its slowest rank's timing. So a job runs the pass first: one forward and
backward of the model on an example batch, with timing allowed, which meets every key
the steps will meet; the steps then run frozen (``kernels.tuning.mode("frozen")``) and
time nothing. The choices persist in the tuning cache (:mod:`kernels.tuning_cache`), so
the next job's pass times only what is new.

Data parallel: ranks that time on their own can disagree (timing noise), and then run
different configs, with different rounding and speed. So after the pass, when
``torch.distributed`` is initialized, rank 0's choices are broadcast
(``broadcast_object_list``) and every rank takes them; a key only another rank met keeps
that rank's choice.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from . import backend, tuning, tuning_cache


@dataclass(frozen=True)
class TuningReport:
    """What the pass met: ``keys`` maps (op, key text) to (how, config), how being "timed"
    (the candidates, or a ranker's shortlist of them), "cached", "only" (one candidate: the
    interpreter's case), "predicted" (a ranker's pick, untimed: graph capture, or a shortlist
    of one) or "untuned" (graph capture without a ranker);
    ``seconds`` is the pass's wall time (the device synchronized), rank 0's broadcast included."""

    seconds: float
    keys: dict

    def count(self, how: str) -> int:
        return sum(1 for h, _ in self.keys.values() if h == how)

    def rows(self) -> list[dict]:
        """One row per key, for a table: op, key, how, config."""
        return [dict(op=op, key=key, how=how, config=cfg) for (op, key), (how, cfg) in self.keys.items()]


def _loss(out):
    """The tensor to differentiate in ``out``: itself, or the first tensor of a tuple or list."""
    if isinstance(out, (tuple, list)):
        out = next((o for o in out if isinstance(o, torch.Tensor)), None)
    return out if isinstance(out, torch.Tensor) and out.requires_grad else None


def share_rank0() -> None:
    """Every rank takes rank 0's choices (nothing to do without torch.distributed)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    box = [tuning_cache.store().choices() if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    tuning.adopt(box[0])


def tune(model_or_fn, *example_inputs) -> TuningReport:
    """Run ``model_or_fn(*example_inputs)`` and the backward of its output once, timing every
    key it meets, then share rank 0's choices (:func:`share_rank0`).

    The output (or its first tensor) gets ``.sum().backward()`` when it requires grad, so
    the backward kernels are tuned too; a function that runs its own backward returns
    nothing to differentiate. Gradients land in ``.grad`` as in a step: zero them before
    the next (a step's ``zero_grad`` does). Call it under the autocast the steps use, with
    inputs of the steps' shapes: keys are shape buckets and dtypes.
    """
    began = time.perf_counter()
    with tuning.mode("time"), tuning.recording() as seen:
        loss = _loss(model_or_fn(*example_inputs))
        if loss is not None:
            loss.sum().backward()
        if backend.current().is_gpu:
            torch.cuda.synchronize()
    share_rank0()
    return TuningReport(time.perf_counter() - began, dict(seen))
