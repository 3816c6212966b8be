"""The in-memory form of one GPU's datasheet: ``GpuSpec``.

It is frozen and its tables are read-only views so a spec shared by a notebook, a chart and
a benchmark cannot be edited in one place and silently differ in another. Every number
keeps its provenance (source tags, notes, whether it is derived or uncertain), because a
roofline is only as credible as the datasheet it is drawn from.
"""

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping, Optional

from .dtypes import dtype_name

#: Memory levels, slowest first; a spec lists only the ones with a known bandwidth.
LEVELS = ("hbm", "llc", "l2", "l1", "lds")


@dataclass(frozen=True)
class Provenance:
    """Where one number came from: source tags plus the caveats the reference attached."""

    source: tuple
    note: Optional[str] = None
    derived: Optional[str] = None
    uncertain: Optional[str] = None


@dataclass(frozen=True)
class GpuSpec:
    """One GPU's peaks, bandwidths and capacities, each traceable to a source.

    ``peak_tflops`` holds the dense peak of the fastest path (matrix/tensor cores where they
    exist) for every dtype in ``roofline.DTYPES``; ``None`` means the hardware lacks that
    type. int8 is in TOPS. ``memory_levels`` maps a level of ``LEVELS`` to TB/s.
    ``provenance`` maps a field path such as ``"peak_tflops.bf16"`` to its ``Provenance``;
    ``sources`` maps each tag used to its citation. ``interconnect`` describes the GPU-to-GPU
    fabric (Infinity Fabric, NVLink) per GPU: ``links``, ``link_gbps`` (one link) and
    ``total_gbps`` (all links), bandwidths bidirectional in GB/s as datasheets quote them;
    empty when unknown.
    """

    name: str
    vendor: str
    arch: str
    target: str
    aliases: tuple
    wave_size: int
    compute_units: int
    clock_ghz: float
    peak_tflops: Mapping[str, Optional[float]]
    memory_levels: Mapping[str, float]
    provenance: Mapping[str, Provenance]
    sources: Mapping[str, str]
    peak_tflops_vector: Mapping[str, float]
    formats: Mapping[str, str]
    xcds: Optional[int] = None
    hbm_gb: Optional[float] = None
    l2_mib: Optional[float] = None
    llc_mib: Optional[float] = None
    lds_kib_per_cu: Optional[float] = None
    l1_kib_per_cu: Optional[float] = None
    regfile_kib_per_cu: Optional[float] = None
    notes: tuple = ()
    path: Optional[str] = None
    interconnect: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def hbm_tbps(self) -> float:
        return self.memory_levels["hbm"]

    @property
    def uncertain(self) -> Mapping[str, str]:
        """Field path -> why the reference doubts it. Shown so users weigh those roofs."""
        return {k: p.uncertain for k, p in self.provenance.items() if p.uncertain}

    @property
    def derived(self) -> Mapping[str, str]:
        """Field path -> formula, for numbers computed from per-clock rates, not quoted."""
        return {k: p.derived for k, p in self.provenance.items() if p.derived}

    def peak(self, dtype) -> float:
        """Dense peak for ``dtype``; a type the chip cannot run is an error, not a zero."""
        name = dtype_name(dtype)
        value = self.peak_tflops.get(name)
        if value is None:
            raise ValueError(f"{self.name} has no {name} support (known peaks: "
                             f"{', '.join(k for k, v in self.peak_tflops.items() if v)})")
        return value

    def bandwidth(self, level: str = "hbm") -> float:
        if level not in self.memory_levels:
            raise ValueError(f"{self.name} has no bandwidth for level {level!r}; "
                             f"known: {', '.join(self.memory_levels)}")
        return self.memory_levels[level]

    def ridge(self, dtype, level: str = "hbm") -> float:
        """Arithmetic intensity (FLOP/byte) where the memory roof meets the compute roof."""
        return self.peak(dtype) / self.bandwidth(level)
