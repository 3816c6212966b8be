"""An independent count of a hot loop's issue pressure: LLVM's ``llvm-mca`` on the loop.

``llvm-mca`` carries LLVM's AMDGPU scheduling model (MFMA pass counts on the HWXDL
resource, VALU on HWVALU, ...). It checks the per-iteration cycles this model reads
from ``machine.yaml`` against a second source. It needs LLVM 19 or later for gfx942
(Debian's ``llvm-19``: ``llvm-mca-19``); LLVM 19 knows no gfx950, and it models one
wave alone, so occupancy and latency stay this model's job. Buffer loads and stores are
left out of its input: ``llvm-mca-19`` aborts on ``buffer_load_dwordx4 ... offen``
(malloc error, seen 2026-12-02), and they occupy no matrix or VALU resource.
"""
from __future__ import annotations

import re
import shutil
import subprocess

from ..isa import parse as isa_parse

CANDIDATES = ("llvm-mca-19", "llvm-mca-20", "llvm-mca-21")
_ROW = re.compile(r"^\s*\[(\d+)\]\s+-\s+(HW\w+)")


def binary() -> str | None:
    """The first ``llvm-mca`` new enough for gfx942 on the PATH, else None."""
    return next((path for name in CANDIDATES if (path := shutil.which(name))), None)


def loop_body(loop_text: str) -> str:
    """The loop's instructions alone: labels, directives, comments, branches and buffer
    loads and stores removed."""
    keep = []
    for line in loop_text.splitlines():
        op = isa_parse.mnemonic(line)
        if (op is None or op.startswith((".", "buffer_"))
                or isa_parse.branch_target(line, "amdgcn")):
            continue
        keep.append(line.split(";", 1)[0].strip())
    return "\n".join(keep) + "\n"


def pressure(loop_text: str, mcpu: str = "gfx942", tool: str | None = None) -> dict[str, float]:
    """Cycles per iteration on each AMDGPU resource, as ``llvm-mca`` reports them."""
    tool = tool or binary()
    if tool is None:
        raise FileNotFoundError(f"no llvm-mca for {mcpu} on the PATH (tried {', '.join(CANDIDATES)})")
    out = subprocess.run([tool, "-mtriple=amdgcn", f"-mcpu={mcpu}", "-iterations=100"],
                         input=loop_body(loop_text), capture_output=True, text=True, check=True).stdout
    lines = out.splitlines()
    names = {int(m.group(1)): m.group(2) for line in lines if (m := _ROW.match(line))}
    at = next(i for i, line in enumerate(lines) if line.startswith("Resource pressure per iteration"))
    header, values = lines[at + 1].split(), lines[at + 2].split()
    return {names[int(h.strip("[]"))]: 0.0 if v == "-" else float(v) for h, v in zip(header, values)}
