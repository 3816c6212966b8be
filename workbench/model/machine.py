"""The model's hardware numbers beyond the GPU spec, read once from ``machine.yaml``.

They live in a data file with a source per entry, so that every constant the model
uses can be printed beside its origin (``Prediction.inputs``) and checked by a test
against the datasheet it must agree with (MFMA cycles against the spec's peak).
"""
from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

import yaml

from ..isa.occupancy import SIMDS_PER_CU

_FILE = Path(__file__).with_name("machine.yaml")
_MFMA = re.compile(r"v_mfma_(?:scale_)?f32_(\d+)x(\d+)x(\d+)")
_WGMMA = re.compile(r"wgmma\.mma_async(?:\.sp)?\.sync\.aligned\.m(\d+)n(\d+)k(\d+)\.\w+\.(\w+)\.\w+$")
# Ampere's warp-level product (``mma.sync``), which Triton emits on sm_90 where a tile has
# no 64-row warpgroup shape: (M, N, K, accumulator type, A's type)
_MMA = re.compile(r"mma\.sync\.aligned\.m(\d+)n(\d+)k(\d+)\.row\.col\.(\w+)\.(\w+)\.\w+\.\w+$")


class Constant(NamedTuple):
    value: float
    source: str     # a tag of machine.yaml's sources, or "assumption"
    note: str


@lru_cache(maxsize=None)
def _data() -> dict:
    return yaml.safe_load(_FILE.read_text("utf-8"))


def sources() -> dict[str, str]:
    """Source tag -> citation."""
    return {tag: " ".join(text.split()) for tag, text in _data()["sources"].items()}


def nvidia(arch: str) -> bool:
    """Whether ``arch`` is an NVIDIA target this file has numbers for (``sm_90``)."""
    return arch in _data()["nvidia"]


def constant(name: str, arch: str | None = None) -> Constant:
    """A constant of the model; ``arch``: an NVIDIA target's own value where it has one."""
    own = _data()["nvidia"][arch]["constants"] if arch is not None and nvidia(arch) else {}
    entry = own.get(name) or _data()["constants"][name]
    return Constant(entry["value"], entry["source"], " ".join(entry.get("note", "").split()))


def mfma_cycles(mnemonic: str, arch: str) -> float:
    """Cycles the matrix core of one SIMD is busy with one ``mnemonic`` on ``arch``; on an
    NVIDIA target, cycles the SM's tensor cores take for one warpgroup ``wgmma`` (each of
    its four warps' sub-partitions that long), or one sub-partition's, at a quarter of the
    SM's rate, for one warp's ``mma.sync``."""
    if nvidia(arch):
        share = SIMDS_PER_CU if warp_product(mnemonic) else 1   # an SM's sub-partitions, as a CU's SIMDs
        return mfma_flops(mnemonic) * share / tensor_rate(mnemonic, arch)
    table = _data()["mfma_cycles"]
    if arch not in table:
        raise ValueError(f"no MFMA cycle table for target {arch!r}; known: {', '.join(table)}")
    if mnemonic not in table[arch]:
        raise KeyError(f"{mnemonic} on {arch} is not in {_FILE.name}'s MFMA table; add it with its source")
    return table[arch][mnemonic]


def lds_bytes_per_clk(arch: str) -> Constant:
    """Bytes per clock one CU's LDS serves on ``arch``, with its source."""
    table = _data()["lds_bytes_per_clk"]
    if arch not in table:
        raise ValueError(f"no LDS rate for target {arch!r}; known: {', '.join(table)}")
    entry = table[arch]
    return Constant(entry["value"], entry["source"], entry.get("note", ""))


def mfma_flops(mnemonic: str) -> int:
    """Floating-point operations of one MFMA instruction (batch 1), of one warpgroup
    ``wgmma.mma_async`` or of one warp's ``mma.sync``: 2 x M x N x K."""
    m = _MFMA.match(mnemonic) or _WGMMA.match(mnemonic) or _MMA.match(mnemonic)
    if m is None:
        raise ValueError(f"{mnemonic!r} is not an MFMA, wgmma or mma.sync instruction name")
    rows, cols, depth = map(int, m.groups()[:3])
    return 2 * rows * cols * depth


def tensor_rate(mnemonic: str, arch: str) -> int:
    """Dense FLOP per clock of one SM's tensor cores for a ``wgmma`` or ``mma.sync`` of
    ``mnemonic``'s operand type, on NVIDIA target ``arch`` (``mma.sync`` at the ``wgmma``
    rate: an assumption, see ``machine.yaml``)."""
    wgmma, mma = _WGMMA.match(mnemonic), _MMA.match(mnemonic)
    if not (wgmma or mma):
        raise ValueError(f"{mnemonic!r} is not a wgmma.mma_async or mma.sync instruction name")
    operand = wgmma.group(4) if wgmma else mma.group(5)
    table = _data()["nvidia"][arch]["tensor_flops_per_clk_per_sm"]
    if operand not in table:
        raise KeyError(f"{mnemonic}: no {arch} tensor rate for operand type {operand!r} in {_FILE.name}")
    return table[operand]


def warp_product(mnemonic: str) -> bool:
    """Whether a PTX matrix instruction is one warp's (``mma.sync``), not a warpgroup's (``wgmma``)."""
    return bool(_MMA.match(mnemonic))


def tensor_clock_mhz(gpu: str, arch: str) -> tuple[float, str] | None:
    """(MHz, source) of the clock an NVIDIA ``gpu``'s tensor peaks are quoted at, if listed."""
    table = _data()["nvidia"][arch]["tensor_clock_mhz"]
    return (table[gpu], table["source"]) if gpu in table else None


def mfma_table(arch: str) -> dict[str, int]:
    return dict(_data()["mfma_cycles"][arch])


def load_clock_mhz(gpu: str, dtype: str) -> tuple[float, str] | None:
    """(MHz, source) of ``gpu``'s engine clock under a dense ``dtype`` MFMA load, if measured."""
    table = _data()["mfma_load_clock_mhz"]
    value = table.get(gpu, {}).get(dtype)
    return None if value is None else (value, table["source"])
