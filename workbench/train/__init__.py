"""An end-to-end training step on the workbench kernels: a small GPT with MoE.

A decoder-only transformer (RMSNorm, RoPE, GQA attention, SwiGLU FFNs, dense or MoE
with shared experts) trained with AdamW on synthetic tokens, where every hot op
(GEMM, attention, MoE, RMSNorm, RoPE, the dense SwiGLU, the loss) runs on PyTorch or on the
workbench kernels by one switch::

    from workbench import train
    rows = train.run(preset="cpu-smoke", kernels="torch", steps=2, seed=0)
    rows = train.run(preset="cpu-smoke", kernels={"gemm": "workbench", "attention": "workbench"})

Each row: loss, grad norm, step ms, tokens/s, model TFLOP/s and MFU (on a GPU),
peak memory, optionally a per-op profile, and the seconds of the tuning pass that runs
before the first step (``train.tune`` runs it alone; ``workbench tune``). ``workbench train`` is the same from the
command line; ``torchrun --nproc-per-node N -m workbench.cli train ...`` runs it data
parallel (FSDP2).

May import: kernels, roofline, workbench.harness, .isa, .model (the tuning pass ranks with
the model). Never learn or widgets: the training comparison widgets import this package.
"""
from .loop import run
from .model import GPT
from .ops import OPS, resolve
from .presets import PRESETS, Config, preset
from .tuning_pass import tune

__all__ = ["GPT", "OPS", "PRESETS", "Config", "preset", "resolve", "run", "tune"]
