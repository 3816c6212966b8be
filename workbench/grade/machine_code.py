"""Machine code: every Triton kernel the file's callable launched, compiled ahead of time
for gfx942, gfx950 and sm90 as :mod:`workbench.isa` compiles a rung, beside the ladder's
top rung on the same target.

The launches come from :mod:`.launches` (recorded at the op's benchmark shape, the
kernels stubbed), the compile runs in a fresh process of the file's own
(:mod:`.worker`'s ``compile`` stage: a kernel that hangs the compiler is killed like any
other step), and the reading is the inspector's (:func:`workbench.isa.read_kernel`).
"""
from __future__ import annotations

from .. import isa
from .session import run_worker
from .speed import top_rung

TARGETS = ("gfx942", "gfx950", "sm90")


def row(report: isa.IsaReport) -> dict:
    """The inspector's summary, the 16-bit LDS count and the hot loop: what the JSON keeps."""
    return {**report.summary(), "16-bit LDS ops": report.narrow_lds_ops,
            "waves per SIMD": report.occupancy.value, "hot loop": report.hot_loop}


def compile_file(request: dict, records: list, module: str, targets, run_s: float) -> tuple[dict, str | None]:
    """{target: [compiled kernel data or {"error": ...}]} for the recorded launches."""
    outcome = run_worker({**request, "stage": "compile", "records": records, "module": module,
                          "targets": [(t, isa.TARGETS[isa.normalize_target(t)]) for t in targets]},
                         import_s=run_s, run_s=run_s)
    return {c["target"]: c["kernels"] for c in outcome.all("compiled")}, outcome.failure


def reports(op: str, compiled: dict, dtype_name: str, name: str) -> dict:
    """{target: [IsaReport or error string]} for the file's kernels."""
    return {target: [k["error"] if "error" in k else
                     isa.read_kernel(op, f"yours ({name})", target, dtype_name, k) for k in kernels]
            for target, kernels in compiled.items()}


def top_reports(op: str, dtype, targets) -> tuple[str | None, dict]:
    """The ladder's top rung compiled for each target: (its title, {target: [IsaReport] or an error})."""
    top = top_rung(op, dtype, compiles=True)
    if top is None:
        return None, {}
    found = {}
    for target in targets:
        try:
            found[target] = isa.inspect_all(op, top.label, target, dtype)
        except Exception as error:   # the inspector's failure is a finding of the page, not a stop
            found[target] = f"{type(error).__name__}: {error}"
    return top.title, found
