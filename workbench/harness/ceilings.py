"""Measured ceilings: what this GPU really sustains, drawn beside the datasheet roofs.

Datasheet peaks are seldom reached (clocks drop under load, HBM never runs at its pin
rate), so a ladder is fairer judged against what a plain copy and the vendor's matmul
achieve on the same chip. Measuring takes seconds and wants the GPU to itself, so the
result is cached per GPU name. Without a GPU nothing is measured and nothing is made up:
``measure_ceilings`` raises. The dict format is the one ``roofline.chart(ceilings=...)``
draws and ``roofline.check_ceilings`` validates.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import re
import statistics
from pathlib import Path

import torch

import roofline

from kernels.atomic import write_atomic

CACHE_ENV = "WORKBENCH_CACHE_DIR"
COPY_BYTES = 1 << 30        # 1 GiB: far larger than any L2 or Infinity Cache (256 MiB)
MATMUL_N = 8192
MATMUL_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
WARMUP, REPS = 5, 20


def cache_dir() -> Path:
    """``$WORKBENCH_CACHE_DIR/ceilings``, by default ``~/.cache/amd-kernel-workbench/ceilings``."""
    root = os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "amd-kernel-workbench"
    return Path(root) / "ceilings"


def cache_path(gpu_name: str) -> Path:
    slug = re.sub(r"[^a-z0-9]+", "-", gpu_name.lower()).strip("-")
    return cache_dir() / f"{slug}.json"


def load_cached_ceilings(gpu_name: str) -> dict | None:
    """The cached ceilings of ``gpu_name`` (``torch.cuda.get_device_name()``), or None."""
    path = cache_path(gpu_name)
    if not path.is_file():
        return None
    advice = "delete it or run measure_ceilings(force=True) on that GPU"
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as err:   # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ValueError(f"corrupt ceilings cache {path}: not JSON ({err}); {advice}") from err
    try:
        data = roofline.check_ceilings(raw, where=f"corrupt ceilings cache {path}")
    except ValueError as err:
        raise ValueError(f"{err}; {advice}") from err
    if data["gpu"] != gpu_name:
        raise ValueError(f"ceilings cache {path} is for {data['gpu']!r}, not {gpu_name!r}; "
                         f"{advice}")
    return data


def save_ceilings(ceilings: dict) -> Path:
    """Validate and cache ``ceilings`` under its GPU name; written whole or not at all."""
    data = roofline.check_ceilings(ceilings)
    path = cache_path(data["gpu"])
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def _require_gpu() -> None:
    if os.environ.get("TRITON_INTERPRET") == "1" or not torch.cuda.is_available():
        raise RuntimeError(
            "measure_ceilings needs a GPU: this machine has none (or runs the Triton "
            "interpreter), and ceilings are never estimated. Use the datasheet roofs, or "
            "ceilings measured on a GPU machine via load_cached_ceilings(gpu_name).")


def _median_ms(fn) -> float:
    """Median device time of ``fn`` over REPS launches, after WARMUP untimed ones."""
    for _ in range(WARMUP):
        fn()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(REPS)]
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in events)


def _copy_tbps() -> float:
    free, _ = torch.cuda.mem_get_info()
    nbytes = min(COPY_BYTES, free // 4)       # source and destination, with headroom
    src = torch.ones(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = _median_ms(lambda: dst.copy_(src))
    return 2 * nbytes / (ms * 1e-3) / 1e12    # every byte is read once and written once


def _matmul_tflops(dtype) -> float:
    a, b = (torch.randn(MATMUL_N, MATMUL_N, dtype=dtype, device="cuda") for _ in range(2))
    out = torch.empty_like(a)
    ms = _median_ms(lambda: torch.matmul(a, b, out=out))
    return 2 * MATMUL_N**3 / (ms * 1e-3) / 1e12


def measure_ceilings(force: bool = False) -> dict:
    """Copy bandwidth and large-matmul TFLOP/s of GPU 0, cached per GPU name.

    ``force=True`` measures again even when a cached result exists. Run it on an otherwise
    idle GPU: anything sharing the chip lowers the numbers.
    """
    _require_gpu()
    gpu = torch.cuda.get_device_name()
    cached = None if force else load_cached_ceilings(gpu)
    if cached is not None:
        return cached
    ceilings = {
        "gpu": gpu,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "runtime": f"hip {torch.version.hip}" if torch.version.hip else
                   f"cuda {torch.version.cuda}",
        "hbm_tbps": _copy_tbps(),
        "peak_tflops": {name: _matmul_tflops(dtype) for name, dtype in MATMUL_DTYPES.items()},
        "method": {
            "hbm_tbps": f"device-to-device copy of up to {COPY_BYTES >> 20} MiB, read + "
                        f"write bytes, median of {REPS} after {WARMUP} warm-ups, device events",
            "peak_tflops": f"torch.matmul {MATMUL_N}^3 (hipBLASLt/cuBLAS), median of {REPS} "
                           f"after {WARMUP} warm-ups, device events",
        },
    }
    save_ceilings(ceilings)
    return roofline.check_ceilings(ceilings)
