"""The training benchmark's tuning pass: ``kernels.tune`` on the first batch, as the steps run it.

The tuned kernels choose a config per shape bucket and dtype, so the pass must meet the
keys the steps will: the same model (compiled when the steps are), the same batch shape
and the same autocast. :func:`tuning_pass` is what ``run`` does before its first step;
:func:`tune` is that alone for a preset (``workbench tune``), to fill the tuning cache
ahead of a job. Both rank the tuners' candidates with the performance model
(:mod:`workbench.model.tuning`) and time its shortlist.
"""
from __future__ import annotations

import warnings

import torch

import kernels as _kernels

from ..model.tuning import ranked_by_model

from . import data, distributed, fp8_layers, ops
from .model import GPT
from .presets import preset as _preset


def dtype_here(backend) -> torch.dtype:
    """The steps' autocast dtype: bf16 on a GPU, none (fp32) on the CPU."""
    return torch.bfloat16 if backend.is_gpu else torch.float32


def build(cfg, impls: dict[str, str], seed: int, device, world: int, parallel: str | None,
          fp8: str | None = None, fp8_keep=None) -> torch.nn.Module:
    """The model as a run starts it: seeded, on ``device``, its Linear layers converted to
    the FP8 recipe ``fp8`` (:func:`kernels.fp8.convert`) but those ``fp8_keep`` keeps in high
    precision (:func:`.fp8_layers.applied`: by default convert's; a pattern of the caller's that
    names no layer, a warning), then wrapped for data parallel."""
    kept = fp8_layers.applied(fp8, fp8_keep)
    torch.manual_seed(seed)
    model = GPT(cfg, impls).to(device)
    if fp8 is not None:
        missing = fp8_layers.unmatched(model, kept) if fp8_keep is not None else []
        if missing:   # a typo would quantize the layer it meant to keep
            warnings.warn(f"layers kept in high precision: {fp8_layers.text(missing)} name no layer of "
                          f"this model (its Linears, MoE layers and their shared experts)", RuntimeWarning,
                          stacklevel=2)
        _kernels.fp8.convert(model, fp8, keep_high_precision=kept)
    return distributed.wrap(model, world, parallel)


def forward_backward(step_fn, tokens, targets, device, dtype) -> torch.Tensor:
    """The loss (detached) of one forward under the steps' autocast, after its backward."""
    with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
        loss = step_fn(tokens, targets)
    loss.backward()
    return loss.detach()


def tuning_pass(step_fn, cfg, seed: int, step: int, rank: int, world: int, device, dtype):
    """``kernels.tune`` on a forward and backward of ``step``'s batch: a :class:`kernels.tuning_pass.TuningReport`."""
    tokens, targets = data.batch(cfg, seed, step, rank, world, device)
    return _kernels.tune(lambda: forward_backward(step_fn, tokens, targets, device, dtype))


@ranked_by_model
def tune(preset="cpu-smoke", kernels="workbench", seed: int = 0, *, compile: bool = False,
         parallel: str | None = None, fp8: str | None = None, fp8_keep=None):
    """The tuning pass of a ``run`` of ``preset`` with ``kernels``, alone (no optimizer step)."""
    fp8_layers.applied(fp8, fp8_keep)   # refused before the process group is set up
    cfg, impls, here = _preset(preset), ops.resolve(kernels), _kernels.backend.current()
    rank, world, device = distributed.setup(here.is_gpu)
    model = build(cfg, impls, seed, device, world, parallel, fp8, fp8_keep)
    return tuning_pass(torch.compile(model) if compile else model, cfg, seed, 0, rank, world, device,
                       dtype_here(here))
