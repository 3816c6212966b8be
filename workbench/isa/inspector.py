"""ISA inspector: what a Triton rung becomes on gfx942, gfx950 or sm90, without the GPU.

    >>> from workbench import isa
    >>> report = isa.inspect("gemm", "v2", target="gfx942")        # doctest: +SKIP
    >>> report.matrix_instructions                                  # doctest: +SKIP
    {'v_mfma_f32_32x32x8_bf16': 16}
    >>> print(report.highlighted_loop())                            # doctest: +SKIP

Each rung's ``aot(dtype, backend)`` says which kernels it launches, with which
constexprs and options; Triton compiles them ahead of time for the chosen target
(in a helper process, see :mod:`workbench.isa.compile`), and this module reads the
machine code: matrix instructions, LDS and global traffic, registers, VGPR and SGPR spills,
occupancy and the hot loop. Reports are cached per (op, rung, target, dtype, overrides).

``overrides`` compiles a rung with some settings replaced, for the rungs whose ``aot``
takes them (the GEMM rungs v2-v6, attention v4 and v5; attention v3 and v5 take ``{"VARLEN": True}``,
their packed-sequence launch, v5 also ``{"CAUSAL": False}`` and ``{"KERNEL": "dq"}``):
``isa.inspect("gemm", "v4", overrides={"waves_per_eu": 3})``;
``{"layout": "NT"}`` compiles the launch with K-contiguous B (``torch.nn.Linear``'s weight),
``{"layout": "TN"}`` with M-contiguous A (a weight gradient's ``x.t()``).

``source`` compiles the rung a file declares instead of the package's: a learner's copy
of a rung (:mod:`workbench.exercises`), edited, with its own kernel, config and ``aot``:
``isa.inspect("gemm", "v4", source="exercises/gemm_v4.py", overrides={"waves_per_eu": 3})``.
An edit to the file is seen by the next call (the cache key holds its modification time).
Code that compiles a rung for its own purpose (the performance model) compiles the
learner's copy instead inside ``with isa.compiled_from("gemm", "v4", path):``.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import html
import inspect as inspect_module
from dataclasses import dataclass, field
from pathlib import Path

import torch

import kernels
from kernels.registry import Rung

from . import compile as isa_compile, occupancy as isa_occupancy, parse as isa_parse
from .occupancy import Occupancy

# Target name -> the arguments of triton's GPUTarget(backend, arch, warp_size).
TARGETS = {"gfx942": ("hip", "gfx942", 64), "gfx950": ("hip", "gfx950", 64), "sm90": ("cuda", 90, 32)}
_ALIASES = {"sm_90": "sm90"}
_MARKS = {"matrix": "M", "lds_read": "L", "lds_write": "L", "global_load": "G", "global_store": "G"}
_COLOURS = {"M": "#c0392b", "L": "#1f77b4", "G": "#2ca02c"}
# (op, rung label) -> a file declaring that rung, compiled in its place (:func:`compiled_from`)
_SUBSTITUTES: contextvars.ContextVar[dict] = contextvars.ContextVar("isa_substitutes", default={})
# Assembly in HTML: never wrapped mid-token, scrolled inside a box of bounded height.
SCROLL = "white-space:pre;overflow:auto;max-height:24em;font-size:11px"


@dataclass(frozen=True)
class IsaReport:
    """One compiled kernel of a rung on one target, read for a performance engineer."""

    op: str
    rung: str                       # rung title, e.g. "v2 triton_tile"
    target: str
    dtype: str
    kernel_name: str
    options: dict                   # what the compiler got: num_warps, num_stages, AMD knobs
    dropped_options: tuple[str, ...]  # knobs the target's backend does not take (AMD-only on sm90)
    asm: str = field(repr=False)
    matrix_instructions: dict[str, int]
    lds_bytes: int
    lds_reads: int
    lds_writes: int
    global_loads: dict[str, int]
    vgprs: int | None               # AMD: arch VGPRs; NVIDIA: registers per thread
    agprs: int | None
    sgprs: int | None
    registers_source: str
    spills: int | None              # VGPR spill count (None on NVIDIA: the cubin has bytes only)
    scratch_bytes: int | None       # AMD private segment / NVIDIA stack frame per thread
    sgpr_spills: int | None         # into VGPR lanes (v_writelane/v_readlane), not memory; None on NVIDIA
    occupancy: Occupancy
    hot_loop: str = field(repr=False)
    llvm_attributes: dict[str, str] = field(default_factory=dict)   # "amdgpu-*" attributes of the IR

    @property
    def dialect(self) -> str:
        return "amdgcn" if TARGETS[self.target][0] == "hip" else "ptx"

    @property
    def narrow_lds_ops(self) -> int | None:
        """8- and 16-bit LDS reads and writes in the whole kernel (:func:`isa_parse.narrow_lds`);
        None on NVIDIA."""
        if self.dialect != "amdgcn":
            return None
        return sum(1 for op in map(isa_parse.mnemonic, self.asm.splitlines()) if op and isa_parse.narrow_lds(op))

    @property
    def warp_products(self) -> int | None:
        """One warp's matrix products (``mma.sync``, ``mma.sp``) in the whole kernel: what Triton
        emits on sm_90 where a tile has no 64-row warpgroup shape for ``wgmma``; None on AMD."""
        if self.dialect != "ptx":
            return None
        return sum(n for op, n in self.matrix_instructions.items() if op.startswith("mma."))

    def summary(self) -> dict:
        """Flat row for tables: one value per column."""
        return {
            "op": self.op, "rung": self.rung, "target": self.target, "dtype": self.dtype,
            "kernel": self.kernel_name, "num_warps": self.options.get("num_warps"),
            "num_stages": self.options.get("num_stages"),
            "matrix instructions": _counts(self.matrix_instructions),
            "LDS bytes": self.lds_bytes, "LDS reads": self.lds_reads, "LDS writes": self.lds_writes,
            "global loads": _counts(self.global_loads),
            "VGPRs" if self.dialect == "amdgcn" else "registers": self.vgprs,
            "AGPRs": self.agprs, "SGPRs": self.sgprs,
            "VGPR spills": self.spills, "SGPR spills": self.sgpr_spills,
            "scratch bytes": self.scratch_bytes,
            "occupancy": str(self.occupancy),
            "hot loop lines": len(self.hot_loop.splitlines()),
        }

    def _marked_loop(self):
        for line in self.hot_loop.splitlines():
            op = isa_parse.mnemonic(line)
            yield _MARKS.get(isa_parse.category(op, self.dialect) if op else None, " "), isa_parse.portable_paths(line)

    def highlighted_loop(self) -> str:
        """The hot loop for a terminal: M = matrix, L = LDS, G = global memory."""
        legend = "M matrix core   L LDS (shared memory)   G global memory"
        return "\n".join([legend, *(f"{mark} | {line}" for mark, line in self._marked_loop())])

    def loop_html(self) -> str:
        """The hot loop, coloured by unit, in a box that scrolls rather than wraps or grows."""
        code = "\n".join(
            f'<span style="color:{_COLOURS[mark]};font-weight:bold">{html.escape(line)}</span>'
            if mark in _COLOURS else html.escape(line) for mark, line in self._marked_loop())
        legend = " ".join(f'<span style="color:{c}">&#9632; {name}</span>' for name, c in
                          zip(("matrix core", "LDS", "global memory"), _COLOURS.values()))
        return (f"<p>Hot loop of {html.escape(self.rung)}: {legend}</p>"
                f"<pre style='{SCROLL}'>{code}</pre>")

    def listing_html(self) -> str:
        """The whole kernel body, folded: hundreds of lines a reader opens on purpose."""
        body = isa_parse.code_lines(self.asm, self.dialect)
        listing = html.escape("\n".join(map(isa_parse.portable_paths, body)))
        return (f"<details><summary>Full listing of {html.escape(self.rung)} @ {self.target} "
                f"({len(body)} lines)</summary><pre style='{SCROLL}'>{listing}</pre></details>")

    def _repr_html_(self) -> str:
        rows = [f"<tr><td>{html.escape(str(k))}</td><td>{html.escape(str(v))}</td></tr>"
                for k, v in self.summary().items()]
        return f"<table>{''.join(rows)}</table>{self.loop_html()}{self.listing_html()}"


def _counts(histogram: dict[str, int]) -> str:
    return ", ".join(f"{name} x{count}" for name, count in histogram.items()) or "-"


def normalize_target(target: str) -> str:
    name = _ALIASES.get(target, target)
    if name not in TARGETS:
        raise ValueError(f"unknown target {target!r}; supported: {', '.join([*TARGETS, *_ALIASES])}")
    return name


def why_no_isa(rung: Rung) -> str | None:
    """Why the inspector cannot compile ``rung`` (None when it can): pages and widgets say
    this instead of showing an empty table."""
    if rung.aot is not None:
        return None
    return {"simt": "it is a SIMT Numba kernel, not Triton; the inspector compiles Triton only",
            "library": "it is the vendor library (hipBLASLt/cuBLAS through torch), "
                       "not a kernel of this project"}.get(rung.kind, "it declares no aot()")


def _inspectable(op: str, which: int | str, dtype: torch.dtype) -> Rung:
    rung = kernels.get(op, which)
    why = why_no_isa(rung)
    if why:
        raise ValueError(f"{op} {rung.title} cannot be inspected: {why}")
    if dtype not in rung.dtypes:
        supported = ", ".join(str(d).removeprefix("torch.") for d in rung.dtypes)
        raise TypeError(f"{op} {rung.title} does not support {dtype}; it supports {supported}")
    return rung


def default_dtype(rung: Rung, target: str) -> torch.dtype:
    """bf16 where the rung takes it; else, for an FP8 rung, the FP8 format the target's
    matrix cores take (e4m3fnuz on gfx942, OCP e4m3fn on gfx950 and sm90) when the rung
    takes that; else the rung's own (first) format: MXFP4 for ``gemm_mxfp4``, whose
    second, MXFP8, is inspected when asked for."""
    if torch.bfloat16 in rung.dtypes:
        return torch.bfloat16
    from kernels.gemm_fp8 import FP8_DTYPES, fp8_dtype

    backend, arch, _ = TARGETS[normalize_target(target)]
    native = fp8_dtype(arch if backend == "hip" else f"sm_{arch}")
    return native if rung.dtypes[0] in FP8_DTYPES and native in rung.dtypes else rung.dtypes[0]


def inspect_all(op: str, rung: int | str, target: str = "gfx942",
                dtype: torch.dtype | None = None, overrides: dict | None = None,
                source: str | Path | None = None) -> list[IsaReport]:
    """One report per kernel the rung launches, in launch order (dtype: :func:`default_dtype`);
    ``source``: a file declaring the rung, compiled instead of the package's (see above)."""
    return list(_reports(*_request(op, rung, target, dtype, overrides, source)))


def inspect_launch(op: str, rung: int | str, launch: int, target: str = "gfx942",
                   dtype: torch.dtype | None = None, overrides: dict | None = None,
                   source: str | Path | None = None) -> IsaReport:
    """The report on the rung's launch number ``launch`` (in :func:`inspect_all`'s order) alone:
    one compile where :func:`inspect_all` compiles every launch, for a caller that weighs one
    launch at a time (the performance model), the same report as :func:`inspect_all`'s."""
    return _reports(*_request(op, rung, target, dtype, overrides, source), launch)[0]


def _request(op: str, rung: int | str, target: str, dtype: torch.dtype | None, overrides: dict | None,
             source: str | Path | None) -> tuple:
    """The checked key of a compile request: (op, label, target, dtype name, overrides, source)."""
    name = normalize_target(target)
    dtype = dtype or default_dtype(kernels.get(op, rung), name)
    entry = _inspectable(op, rung, dtype)
    source = source or _SUBSTITUTES.get().get((op, entry.label))
    if overrides and "overrides" not in inspect_module.signature(entry.aot).parameters:
        raise ValueError(f"{op} {entry.title} takes no overrides for ahead-of-time compiles")
    frozen = tuple(sorted((overrides or {}).items()))
    return op, entry.label, name, str(dtype).removeprefix("torch."), frozen, _source_key(source)


@contextlib.contextmanager
def compiled_from(op: str, rung: int | str, source: str | Path):
    """Within the block, compiles of ``op``'s ``rung`` that name no ``source`` compile the
    file ``source`` instead: how a caller that compiles rungs itself (the performance
    model, :mod:`workbench.model.learner`) is pointed at a learner's copy without a
    ``source`` argument of its own. Other rungs compile as usual."""
    label = kernels.get(op, rung).label
    _source_key(source)   # a missing file is named here, not at the first compile
    token = _SUBSTITUTES.set({**_SUBSTITUTES.get(), (op, label): source})
    try:
        yield
    finally:
        _SUBSTITUTES.reset(token)


def _source_key(source: str | Path | None) -> tuple | None:
    if source is None:
        return None
    path = Path(source).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"source {source} is not a file")
    stat = path.stat()
    return str(path), stat.st_mtime_ns, stat.st_size


def inspect(op: str, rung: int | str, target: str = "gfx942",
            dtype: torch.dtype | None = None, overrides: dict | None = None,
            source: str | Path | None = None) -> IsaReport:
    """The rung's main kernel: the one with the most matrix instructions (first on a tie)."""
    reports = inspect_all(op, rung, target, dtype, overrides, source)
    return max(reports, key=lambda r: sum(r.matrix_instructions.values()))


def clear_cache() -> None:
    """Forget compiled reports and restart the compile helper, e.g. after editing a kernel."""
    _reports.cache_clear()
    isa_compile.stop()


@functools.lru_cache(maxsize=None)
def _reports(op: str, label: str, target: str, dtype_name: str, overrides: tuple = (),
             source: tuple | None = None, launch: int | None = None) -> tuple[IsaReport, ...]:
    """Every launch's report, or (``launch``) that one's alone."""
    title = kernels.get(op, label).title + (f" ({Path(source[0]).name})" if source else "")
    compiled = isa_compile.compile_rung(op, label, TARGETS[target], dtype_name, dict(overrides),
                                        source[0] if source else None, launch)
    return tuple(read_kernel(op, title, target, dtype_name, kernel) for kernel in compiled)


def read_kernel(op: str, title: str, target: str, dtype_name: str, kernel: dict) -> IsaReport:
    """A report on one compiled kernel (:func:`workbench.isa.compile.compile_aot`'s data)."""
    dialect = "amdgcn" if TARGETS[target][0] == "hip" else "ptx"
    lines = isa_parse.code_lines(kernel["asm"], dialect)
    counts = isa_parse.histograms(lines, dialect)
    if dialect == "amdgcn":
        res = isa_parse.amdgpu_resources(kernel["asm"])
        registers = (res["vgprs"], res["agprs"], res["sgprs"], "AMDGPU kernel info and metadata")
        spills = (res["vgpr_spills"], res["scratch_bytes"], res["sgpr_spills"])
        occupancy = isa_occupancy.cdna(target, res["vgprs"], res["agprs"], res["sgprs"],
                                       kernel["shared"], kernel["num_warps"],
                                       kernel["options"].get("waves_per_eu", 0), res["occupancy"])
    else:
        res = isa_parse.cubin_resources(kernel["binary"])
        registers = (res["registers"], None, None, "cubin .nv.info EIATTR_REGCOUNT (ptxas)")
        spills = (None, res["frame_bytes"], None)
        occupancy = isa_occupancy.hopper(res["registers"], kernel["shared"], kernel["num_warps"])
    return IsaReport(
        op=op, rung=title, target=target, dtype=dtype_name, kernel_name=kernel["name"],
        options=kernel["options"], dropped_options=tuple(kernel["dropped_options"]),
        asm=kernel["asm"], matrix_instructions=dict(counts["matrix"]), lds_bytes=kernel["shared"],
        lds_reads=sum(counts["lds_read"].values()), lds_writes=sum(counts["lds_write"].values()),
        global_loads=dict(counts["global_load"]), vgprs=registers[0], agprs=registers[1],
        sgprs=registers[2], registers_source=registers[3], spills=spills[0],
        scratch_bytes=spills[1], sgpr_spills=spills[2], occupancy=occupancy,
        hot_loop="\n".join(isa_parse.hot_loop(lines, dialect)),
        llvm_attributes=kernel.get("llvm_attributes", {}))


def compare(a: IsaReport, b: IsaReport) -> list[dict]:
    """Side-by-side rows (metric, first report, second report) for two reports."""
    left, right = f"{a.rung} @ {a.target}", f"{b.rung} @ {b.target}"
    if left == right:
        left, right = f"{left} ({a.dtype})", f"{right} ({b.dtype})"
    if left == right:
        right += " [2]"
    sa, sb = a.summary(), b.summary()
    return [{"metric": key, left: sa.get(key, "-"), right: sb.get(key, "-")}
            for key in dict.fromkeys([*sa, *sb])]
