"""Which hardware counters would confirm each rung's story, and the commands that collect them.

The workbench argues every rung from compiled code and a model; a profiler on a GPU is how
the argument is checked. This table names, for each story, the counters (names as the ROCm
documentation spells them for MI300/gfx942) whose values would confirm or refute it, and how
to read them. It holds no values: no GPU has run these commands here, and a number is only
shown once a GPU has produced it.

Sources (``SOURCES``): [C1] the ROCm docs' counter list for MI300/MI200; [C2] ROCprofiler-SDK's
derived counter definitions (FETCH_SIZE and WRITE_SIZE: kilobytes read from and written to
video memory, built from the L2's TCC_EA_RDREQ/TCC_EA_WRREQ requests); [C3] the rocprofv3
quick reference (``--pmc``, ``--kernel-trace``, ``rocprofv3-avail pmc-check``); [C4] ROCm
Compute Profiler's basic usage (``rocprof-compute profile -n NAME -- CMD``, ``analyze -p DIR``).
"""
from __future__ import annotations

from dataclasses import dataclass

SOURCES = {
    "C1": "https://rocm.docs.amd.com/en/latest/conceptual/gpu-arch/mi300-mi200-performance-counters.html",
    "C2": "https://github.com/ROCm/rocprofiler-sdk (derived counter definitions)",
    "C3": "https://rocm.docs.amd.com/projects/rocprofiler-sdk/en/latest/quick_guide.html",
    "C4": "https://rocm.docs.amd.com/projects/rocprofiler-compute/en/latest/how-to/use.html",
}

# What each counter counts, in the words of its source (unit in brackets), and the source tag.
COUNTERS = {
    "SQ_WAVES": ("wavefronts dispatched to the sequencers [waves]", "C1"),
    "SQ_INSTS_VALU": ("VALU instructions issued, MFMA included [instr]", "C1"),
    "SQ_INSTS_MFMA": ("MFMA instructions issued [instr]", "C1"),
    "SQ_INSTS_VALU_MFMA_MOPS_BF16": ("BF16 MFMA ops in units of 512 [FLOP]", "C1"),
    "SQ_INSTS_VALU_TRANS_F32": ("VALU F32 transcendental instructions issued [instr]", "C1"),
    "SQ_VALU_MFMA_BUSY_CYCLES": ("cycles the MFMA ALU is busy [cycles]", "C1"),
    "SQ_ACTIVE_INST_VALU": ("quad-cycles the arbiter works on VALU instructions [qcycles]", "C1"),
    "SQ_BUSY_CU_CYCLES": ("quad-cycles each CU is busy [qcycles]", "C1"),
    "SQ_WAVE_CYCLES": ("quad-cycles spent by waves in the CUs [qcycles]", "C1"),
    "SQ_WAIT_ANY": ("quad-cycles waves spend waiting for anything [qcycles]", "C1"),
    "SQ_INSTS_LDS": ("LDS instructions issued, FLAT included [instr]", "C1"),
    "SQ_LDS_BANK_CONFLICT": ("cycles LDS is stalled by bank conflicts [cycles]", "C1"),
    "SQ_WAIT_INST_LDS": ("quad-cycles waiting for an LDS instruction to issue [qcycles]", "C1"),
    "SQ_INSTS_VMEM_RD": ("vector memory read instructions, FLAT included [instr]", "C1"),
    "SQ_INSTS_VMEM_WR": ("vector memory write instructions, FLAT included [instr]", "C1"),
    "TCC_HIT_sum": ("L2 hits over all TCC instances [count]", "C1"),
    "TCC_MISS_sum": ("L2 misses over all TCC instances [count]", "C1"),
    "FETCH_SIZE": ("kilobytes fetched from video memory, after the caches [KiB]", "C2"),
    "WRITE_SIZE": ("kilobytes written to video memory [KiB]", "C2"),
    "GRBM_GUI_ACTIVE": ("GPU active cycles [cycles]", "C1"),
}


@dataclass(frozen=True)
class Story:
    """A rung's claim, the counters that test it and what values would confirm it."""

    op: str
    rung: str
    claim: str
    counters: tuple[str, ...]
    read: str


STORIES = (
    Story("gemm", "v1", "SIMT tiles: LDS and VALU bound, no matrix cores",
          ("SQ_INSTS_MFMA", "SQ_INSTS_VALU", "SQ_INSTS_LDS", "SQ_LDS_BANK_CONFLICT", "SQ_WAIT_INST_LDS",
           "SQ_WAVE_CYCLES"),
          "SQ_INSTS_MFMA = 0; SQ_INSTS_LDS of the order of the multiply-adds' VALU instructions "
          "(v1 reads both operands from LDS for each one); SQ_WAIT_INST_LDS a large share of "
          "SQ_WAVE_CYCLES; bank-conflict cycles per LDS instruction say how much of it is layout"),
    Story("gemm", "v3", "grouped order: fewer L2 misses and HBM bytes than v2 on large shapes",
          ("TCC_HIT_sum", "TCC_MISS_sum", "FETCH_SIZE"),
          "v3's TCC_MISS_sum and FETCH_SIZE below v2's at the same shape; FETCH_SIZE against "
          "spec.bytes_moved says how many times A and B were re-read from HBM"),
    Story("gemm", "v4", "does the pipeline pay? prefetch against half of v3's waves (the model says no)",
          ("SQ_VALU_MFMA_BUSY_CYCLES", "SQ_BUSY_CU_CYCLES", "SQ_WAIT_ANY", "SQ_WAVE_CYCLES",
           "SQ_INSTS_VALU_MFMA_MOPS_BF16"),
          "against v3: MFMA busy cycles a larger share of CU busy time and SQ_WAIT_ANY / SQ_WAVE_CYCLES "
          "smaller mean the prefetch pays; the reverse is what the model and v4's docstring expect "
          "(gfx942 waits for the prefetch in the same iteration, and waves_per_eu=2 leaves 2 waves "
          "per SIMD against v3's 4); at a shape the tiles divide exactly, MOPS x 512 = 2MNK (the "
          "counter covers the kernel)"),
    Story("gemm", "v6", "persistent programs: one wave of programs, no partial last wave",
          ("SQ_WAVES", "GRBM_GUI_ACTIVE"),
          "SQ_WAVES = programs x num_warps (the launch, not the tile count); the model predicts "
          "fewer active cycles than v5 where v5's tiles / CUs leaves a small last wave"),
    Story("attention", "v1", "whole rows in registers: spills, scratch traffic",
          ("SQ_INSTS_VMEM_WR", "SQ_INSTS_VMEM_RD", "WRITE_SIZE"),
          "VMEM writes above what the output alone needs (spills go to scratch through VMEM "
          "instructions); rocprofv3 --kernel-trace reports each dispatch's private (scratch) "
          "segment size"),
    Story("attention", "v4", "exp2 and rescaling on the VALU compete with the matrix cores",
          ("SQ_INSTS_MFMA", "SQ_INSTS_VALU", "SQ_INSTS_VALU_TRANS_F32", "SQ_ACTIVE_INST_VALU",
           "SQ_VALU_MFMA_BUSY_CYCLES"),
          "transcendental instructions near the computed score elements / 64 (one exp2 per "
          "element and lane); VALU active cycles close to or above MFMA busy cycles mean the "
          "softmax, not the MFMAs, sets the pace"),
    Story("attention", "v5", "the backward's dK/dV loop is VALU-bound (llvm-mca: VALU > XDL)",
          ("SQ_ACTIVE_INST_VALU", "SQ_VALU_MFMA_BUSY_CYCLES", "SQ_INSTS_VALU", "SQ_INSTS_MFMA"),
          "VALU active cycles above MFMA busy cycles confirms it; the reverse refutes mca's "
          "single-wave view (other waves hid the VALU work)"),
    Story("moe", "v2", "permuted copies of x and of the (T·k, hidden) activations cost HBM traffic",
          ("FETCH_SIZE", "WRITE_SIZE", "TCC_HIT_sum", "TCC_MISS_sum"),
          "each permute kernel reads and writes about rows x hidden x itemsize, so its FETCH_SIZE "
          "and WRITE_SIZE are each near that; the fused v3 has no such kernels in its trace"),
)


def story(op: str, rung: str) -> Story:
    """The story of ``op``'s ``rung``; a ValueError lists the ones there are."""
    for s in STORIES:
        if (s.op, s.rung) == (op, rung):
            return s
    known = ", ".join(f"{s.op} {s.rung}" for s in STORIES)
    raise ValueError(f"no counter story for op={op!r} rung={rung!r}; stories: {known}")


def rocprofv3_command(s: Story, app: str) -> str:
    """One rocprofv3 pass collecting the story's counters for ``app``, with a kernel trace.

    The hardware collects a limited number of counters per pass: check a set first with
    ``rocprofv3-avail pmc-check`` and split it if refused [C3].
    """
    if not app.strip():
        raise ValueError("app must be the command to profile, got an empty string")
    return f"rocprofv3 --kernel-trace --pmc {' '.join(s.counters)} -d counters/{s.op}_{s.rung} -- {app}"


def rocprof_compute_commands(s: Story, app: str, gpu: str = "MI300X") -> tuple[str, str]:
    """ROCm Compute Profiler's full collection and its analysis [C4]: the profile replays
    kernels to collect every counter its panels need, and writes under workloads/NAME/GPU."""
    if not app.strip():
        raise ValueError("app must be the command to profile, got an empty string")
    name = f"{s.op}_{s.rung}"
    return (f"rocprof-compute profile -n {name} -- {app}",
            f"rocprof-compute analyze -p workloads/{name}/{gpu}")


def table() -> list[dict]:
    """Rows for a notebook: story, counters with their meaning, how to read them. No values."""
    return [{"op": s.op, "rung": s.rung, "claim": s.claim,
             "counters": ", ".join(s.counters), "read": s.read,
             "sources": ", ".join(sorted({COUNTERS[c][1] for c in s.counters}))} for s in STORIES]
