"""How many XCDs (chiplets with a private L2) the GPU's program ids are spread over.

CDNA3 and CDNA4 GPUs are built from XCDs, each with its own L2, and the command
processor deals consecutive workgroup ids to them round robin. The GEMM rungs remap
program ids so that each XCD gets a contiguous run of tiles (``v3_grouped_order``);
the remap needs the XCD count of the device *as the process sees it*:

* the CUs per XCD are fixed per architecture: 38 enabled on gfx942 (MI300X/MI325X
  and MI300A, 40 physical with 2 disabled), 32 on gfx950 (MI350X/MI355X), per
  ``shared/reference/gpu-specs.md`` [S1], [S2], [S15];
* so the count follows from the CUs torch reports: 304 / 38 = 8 on MI300X, 228 / 38
  = 6 on MI300A, 256 / 32 = 8 on MI355X; in a partition mode a process sees only its
  partition (CPX: one XCD, 38 CUs -> 1; DPX: 76 CUs -> 2);
* any other GPU (NVIDIA, older AMD) and the interpreter: 1, no remap.

``KERNELS_NUM_XCDS`` in the environment overrides the derived value (for a part this
table does not know), and every rung also takes ``overrides={"NUM_XCDS": n}``.
"""
from __future__ import annotations

import os

from . import backend as _backend

CUS_PER_XCD = {"gfx942": 38, "gfx950": 32}
ENV_VAR = "KERNELS_NUM_XCDS"


def xcds_for(backend: str, arch: str, compute_units: int) -> int:
    """The XCD count of a device given by backend name, arch and CU count (no override)."""
    per_xcd = CUS_PER_XCD.get(arch)
    if backend != "hip" or per_xcd is None or compute_units <= 0:
        return 1
    return max(1, round(compute_units / per_xcd))


def num_xcds(device: _backend.Backend | None = None) -> int:
    """XCDs of ``device`` (default: this process's backend); ``KERNELS_NUM_XCDS`` wins."""
    forced = os.environ.get(ENV_VAR)
    if forced:
        if not forced.isdigit() or int(forced) < 1:
            raise ValueError(f"{ENV_VAR}={forced!r}: expected a positive integer")
        return int(forced)
    device = device or _backend.current()
    return xcds_for(device.name, device.arch, device.compute_units)


def full_chip_xcds(backend: str, arch: str) -> int:
    """XCDs of the whole chip of ``arch`` (8 on gfx942 and gfx950): what ahead-of-time
    compiles show, since no device is there to ask."""
    return 8 if backend == "hip" and arch in CUS_PER_XCD else 1
