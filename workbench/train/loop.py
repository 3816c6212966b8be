"""``run``: tune, then train the model for some steps and return one row per step.

Each row holds the loss (mean over all processes) and the gradient norm (before
clipping), the step's time and the tokens per second of the global batch, model
TFLOP/s and MFU per GPU (:mod:`.flops`), the GPU's memory high-water mark, with
``profile=True`` the profiler's busiest ops, the tuning pass's seconds (``tuning_s``,
the same in every row of a run) and the keys the step ran untimed (``untuned``: the
prior's first candidate, or the performance model's pick).
On the interpreter backend (no GPU) rows still come back, labelled with that backend,
but TFLOP/s and MFU are None: CPU times of interpreted kernels are not performance.

Before the first step, ``kernels.tune`` runs one forward and backward of the first
batch with timing allowed, so the tuned kernels choose their configs there (and data-
parallel ranks take rank 0's); the steps then run in frozen mode and time nothing. The
whole run ranks the tuners' candidates with the performance model
(:mod:`workbench.model.tuning`): the pass times the model's shortlist, and a key the
pass did not meet runs the model's best in the step instead of the prior.

The steps do not wait for the device: a step's loss and grad norm stay device
tensors, and its time is two CUDA events around it on a GPU (the host clock on the
CPU, where an op has finished when its call returns). They are read every
:data:`READ_EVERY` steps and after the last: one device sync and, data parallel, one
all-reduce of the losses for all those steps. So the host runs ahead of the device and
a step's time is the device's, from the start event to the end event.
"""
from __future__ import annotations

import contextlib
import time

import torch

import kernels as _kernels
import roofline
from kernels import tuning

from ..harness import environment
from ..model.tuning import ranked_by_model
from . import checkpoint as ckpt
from . import data, distributed, flops, fp8_layers, ops, store
from .files import FileArgumentError, writable
from .presets import preset as _preset
from .profiler_log import profiled
from .tuning_pass import build, dtype_here, forward_backward, tuning_pass

TOP_OPS = 10
READ_EVERY = 10   # steps between reads of the numbers (a device sync each; ``out`` is saved then)


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
        return roofline.device_spec(backend.device_name, backend.arch, backend.compute_units)
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


class _Span:
    """A step's time, taken without waiting for the device and read after a sync: CUDA
    events on a GPU, the host clock on the CPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.begin, self.end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            self.begin.record()
        else:
            self.begin = time.perf_counter()

    def stop(self) -> None:
        if self.cuda:
            self.end.record()
        else:
            self.end = time.perf_counter()

    def seconds(self) -> float:
        return self.begin.elapsed_time(self.end) / 1e3 if self.cuda else self.end - self.begin


def _step(step_fn, model, optimizer, cfg, tokens, targets, device, dtype):
    optimizer.zero_grad(set_to_none=True)
    loss = forward_backward(step_fn, tokens, targets, device, dtype)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    optimizer.step()
    return loss, norm.full_tensor() if hasattr(norm, "full_tensor") else norm


def _read(pending: list[dict], world: int, device: torch.device, cfg, spec, dtype, gpu: bool,
          fp8_flops: int = 0) -> list[dict]:
    """The rows of the ``pending`` steps: one device sync, one all-reduce of their losses.
    ``fp8_flops``: the part of a step's model FLOPs in FP8 layers (MFU takes them at the FP8 peak)."""
    _sync(device)
    losses = distributed.mean(torch.stack([p.pop("loss") for p in pending]), world).tolist()
    norms = torch.stack([p.pop("grad_norm") for p in pending]).tolist()
    rows = []
    for p, loss, norm in zip(pending, losses, norms):
        seconds = p.pop("span").seconds()
        rows.append(dict(
            step=p.pop("step"), loss=loss, grad_norm=norm,
            step_ms=seconds * 1e3, tokens_per_s=cfg.batch * cfg.seq * world / seconds,
            tflops=flops.step_flops(cfg) / seconds / 1e12 if gpu else None,
            mfu=flops.mfu(flops.step_flops(cfg), seconds, spec, dtype, fp8_flops) if gpu and spec else None,
            **p))
    return rows


@ranked_by_model
def run(preset="cpu-smoke", kernels="torch", steps: int = 10, seed: int = 0, *,
        compile: bool = False, profile: bool = False, out=None, checkpoint=None, resume=None,
        gpu=None, parallel: str | None = None, fp8: str | None = None, fp8_keep=None,
        progress: bool = True) -> list[dict]:
    """Train ``steps`` steps of ``preset`` with ``kernels``; one row (dict) per step.

    ``kernels``: "torch", "workbench" or a mapping per op (:func:`.ops.resolve`);
    ``compile`` applies ``torch.compile`` to the model either way. ``out``: a .json file
    the rows are saved to as they are read (:data:`READ_EVERY`, :mod:`.store`); on resume they are appended to
    the rows it holds. ``checkpoint``: a file to save the state to at the end; ``resume``:
    one to continue from (its step count goes on), saved by a run of the same preset, seed,
    ``fp8`` and ``fp8_keep`` (:data:`.checkpoint.RUN`). These files are checked before the
    first step, so a bad one costs no training (:class:`.files.FileArgumentError`).
    ``gpu``: a ``roofline`` GPU name for MFU (default: this GPU, when roofline knows it).
    The tuning pass runs ``step_fn`` (compiled, with ``compile``), so ``tuning_s`` holds its
    JIT and ``torch.compile`` compiles too.
    Under ``torchrun`` each process runs this; ``parallel`` is "fsdp" or "ddp".
    ``fp8``: an FP8 recipe (:func:`kernels.fp8.names`); the model's Linear layers but those
    ``fp8_keep`` keeps (by default the first, the last and the MoE routers) run their three
    GEMMs in FP8 (:func:`kernels.fp8.convert`), and MFU counts those GEMMs at the FP8 peak. A
    delayed scale that saturated is a warning when the numbers are read
    (:func:`kernels.fp8.warn_saturation`).
    ``fp8_keep``: the layers the recipe leaves in high precision, a list of names or patterns as
    convert's ``keep_high_precision`` takes them (default :data:`kernels.fp8.KEEP_HIGH_PRECISION`,
    which also keeps the MoE layers' shared experts); each row's ``fp8_keep`` is the list the run
    asked convert to keep (:mod:`.fp8_layers`: what convert cannot quantize it keeps with a warning).
    """
    from tqdm.auto import tqdm  # disable=None: a bar on a terminal, none in logs

    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    kept = fp8_layers.applied(fp8, fp8_keep)
    cfg, impls, here = _preset(preset), ops.resolve(kernels), _kernels.backend.current()
    rank, world, device = distributed.setup(here.is_gpu)
    if world > 1 and (checkpoint or resume):
        raise ValueError("checkpoints hold one process's state; run data-parallel jobs without them")
    identity = dict(preset=cfg.name, seed=seed, fp8=fp8, fp8_keep=None if kept is None else list(kept))
    state = ckpt.read(resume, identity) if resume else None
    for argument, path in (("checkpoint", checkpoint), ("out", out)):
        if path is not None:
            writable(argument, path)
    try:
        earlier = store.rows_before(out, state["step"]) if state and out is not None else []
    except ValueError as exc:
        raise FileArgumentError("out", out, f"cannot append the resumed steps ({exc})") from exc
    dtype, spec = dtype_here(here), _gpu_spec(gpu, here)
    model = build(cfg, impls, seed, device, world, parallel, fp8, fp8_keep)
    fp8_flops = flops.fp8_step_flops(model, cfg)
    optimizer = _optimizer(model, cfg)
    start = ckpt.restore(state, resume, model, optimizer) if state else 0
    step_fn = torch.compile(model) if compile else model
    fixed = dict(preset=cfg.name, kernels=ops.label(impls), fp8=fp8, fp8_keep=identity["fp8_keep"],
                 compile=compile, dtype=str(dtype).replace("torch.", ""), world_size=world, seed=seed,
                 backend=here.name, gpu=here.device_name, commit=environment.commit())
    fixed["tuning_s"] = tuning_pass(step_fn, cfg, seed, start, rank, world, device, dtype).seconds
    rows, pending = [], []
    for step in tqdm(range(start, start + steps), desc=f"train {cfg.name}",
                     disable=None if progress and rank == 0 else True):
        tokens, targets = data.batch(cfg, seed, step, rank, world, device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with profiled(activities) if profile else contextlib.nullcontext() as prof, \
                tuning.mode("frozen"), tuning.recording() as chosen:
            span = _Span(device)
            loss, norm = _step(step_fn, model, optimizer, cfg, tokens, targets, device, dtype)
            span.stop()
        pending.append(dict(
            step=step + 1, loss=loss, grad_norm=norm, span=span,
            peak_mem_gib=torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
            op_ms=_op_times(prof, device.type == "cuda") if profile else None,
            untuned=sum(how in ("untuned", "predicted") for how, _ in chosen.values()),
            timestamp=environment.now(), **fixed))
        if len(pending) == READ_EVERY or step == start + steps - 1:
            rows += _read(pending, world, device, cfg, spec, dtype, here.is_gpu, fp8_flops)
            pending = []
            if fp8 is not None:
                _kernels.fp8.warn_saturation(model)
            if out is not None and rank == 0:
                store.save(earlier + rows, out)
    if checkpoint is not None:
        ckpt.save(checkpoint, model, optimizer, start + steps, identity)
    return rows
