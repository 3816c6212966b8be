"""``run``: train the model for some steps and return one row per step.

Each row holds the loss (mean over all processes) and the gradient norm (before
clipping), the step's wall time between two device synchronizations and the tokens
per second of the global batch, model TFLOP/s and MFU per GPU (:mod:`.flops`), the
GPU's memory high-water mark, and with ``profile=True`` the profiler's busiest ops.
On the interpreter backend (no GPU) rows still come back, labelled with that backend,
but TFLOP/s and MFU are None: CPU times of interpreted kernels are not performance.
"""
from __future__ import annotations

import contextlib
import time

import torch

import kernels as _kernels
import roofline

from .. import environment
from . import checkpoint as ckpt
from . import data, distributed, flops, ops, store
from .files import FileArgumentError, writable
from .model import GPT
from .presets import preset as _preset

TOP_OPS = 10


def _optimizer(model: torch.nn.Module, cfg) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not on norm gains)."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas)


def _gpu_spec(gpu, backend):
    """The roofline spec to take MFU against: ``gpu`` if given, else this GPU if it is known."""
    if gpu is not None:
        return roofline.spec(gpu)
    if backend.is_interpreter:
        return None
    try:
        return roofline.spec(backend.device_name)
    except KeyError:
        return None


def _op_times(prof, gpu: bool) -> dict[str, float]:
    """The profiler's ``TOP_OPS`` ops by self time (device time on a GPU), in ms."""
    key = "self_device_time_total" if gpu else "self_cpu_time_total"
    events = sorted(prof.key_averages(), key=lambda e: getattr(e, key), reverse=True)
    return {e.key: round(getattr(e, key) / 1e3, 4) for e in events[:TOP_OPS] if getattr(e, key) > 0}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _step(step_fn, model, optimizer, cfg, tokens, targets, device, dtype):
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
        loss = step_fn(tokens, targets)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    optimizer.step()
    return loss.detach(), norm.full_tensor() if hasattr(norm, "full_tensor") else norm


def run(preset="cpu-smoke", kernels="torch", steps: int = 10, seed: int = 0, *,
        compile: bool = False, profile: bool = False, out=None, checkpoint=None, resume=None,
        gpu=None, parallel: str | None = None, progress: bool = True) -> list[dict]:
    """Train ``steps`` steps of ``preset`` with ``kernels``; one row (dict) per step.

    ``kernels``: "torch", "workbench" or a mapping per op (:func:`.ops.resolve`);
    ``compile`` applies ``torch.compile`` to the model either way. ``out``: a .json file
    the rows are saved to after every step (:mod:`.store`); on resume they are appended to
    the rows it holds. ``checkpoint``: a file to save the state to at the end; ``resume``:
    one to continue from (its step count goes on). These files are checked before the
    first step, so a bad one costs no training (:class:`.files.FileArgumentError`).
    ``gpu``: a ``roofline`` GPU name for MFU (default: this GPU, when roofline knows it).
    Under ``torchrun`` each process runs this; ``parallel`` is "fsdp" or "ddp".
    """
    from tqdm.auto import tqdm  # disable=None: a bar on a terminal, none in logs

    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    cfg, impls, here = _preset(preset), ops.resolve(kernels), _kernels.backend.current()
    rank, world, device = distributed.setup(here.is_gpu)
    if world > 1 and (checkpoint or resume):
        raise ValueError("checkpoints hold one process's state; run data-parallel jobs without them")
    state = ckpt.read(resume) if resume else None
    for argument, path in (("checkpoint", checkpoint), ("out", out)):
        if path is not None:
            writable(argument, path)
    try:
        earlier = store.rows_before(out, state["step"]) if state and out is not None else []
    except ValueError as exc:
        raise FileArgumentError("out", out, f"cannot append the resumed steps ({exc})") from exc
    dtype = torch.bfloat16 if here.is_gpu else torch.float32
    spec = _gpu_spec(gpu, here)
    torch.manual_seed(seed)
    model = distributed.wrap(GPT(cfg, impls).to(device), world, parallel)
    optimizer = _optimizer(model, cfg)
    start = ckpt.restore(state, resume, model, optimizer) if state else 0
    step_fn = torch.compile(model) if compile else model
    fixed = dict(preset=cfg.name, kernels=ops.label(impls), compile=compile,
                 dtype=str(dtype).replace("torch.", ""), world_size=world, seed=seed,
                 backend=here.name, gpu=here.device_name, commit=environment.commit())
    rows = []
    for step in tqdm(range(start, start + steps), desc=f"train {cfg.name}",
                     disable=None if progress and rank == 0 else True):
        tokens, targets = data.batch(cfg, seed, step, rank, world, device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=activities) if profile else contextlib.nullcontext() as prof:
            _sync(device)
            began = time.perf_counter()
            loss, norm = _step(step_fn, model, optimizer, cfg, tokens, targets, device, dtype)
            _sync(device)
            seconds = time.perf_counter() - began
        model_tflops = flops.step_flops(cfg) / seconds / 1e12 if here.is_gpu else None
        rows.append(dict(
            step=step + 1, loss=distributed.mean(loss, world).item(), grad_norm=norm.item(),
            step_ms=seconds * 1e3, tokens_per_s=cfg.batch * cfg.seq * world / seconds,
            tflops=model_tflops,
            mfu=flops.mfu(flops.step_flops(cfg), seconds, spec, dtype) if here.is_gpu and spec else None,
            peak_mem_gib=torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
            op_ms=_op_times(prof, device.type == "cuda") if profile else None,
            timestamp=environment.now(), **fixed))
        if out is not None and rank == 0:
            store.save(earlier + rows, out)
    if checkpoint is not None:
        ckpt.save(checkpoint, model, optimizer, start + steps)
    return rows
