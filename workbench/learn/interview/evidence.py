"""The evidence behind the interview cards: rows computed from compiles, specs and tables.

Each function returns plain rows (dicts) that a card turns into prose and HTML tables and
that tests check against independent sources. Compiles are cached per process (the ISA
inspector caches too), so a deck revealed twice compiles once.
"""
from __future__ import annotations

import functools
import re
from collections import Counter
from pathlib import Path

import torch

import kernels
import roofline
from kernels import tuning
from kernels.comm.cost_model import ALGORITHMS
from kernels.gemm.v4_lds_pipeline import config as v4_config
from kernels.gemm_fp8 import fp8_dtype

from ...comm import model as comm_model
from ... import isa
from ...isa import compile as isa_compile

GPUS = ("MI300X", "MI355X", "H200")
# RDNA3 (a Radeon target, not in isa.TARGETS): compiled once to show WMMA and wave32 next to CDNA.
RDNA3 = ("hip", "gfx1100", 32)
BANK_BYTES = 4   # LDS bank width: rocprof-compute counts LDS bytes as accesses x 4 B x 32 banks [S7c]
CROSS_LANE = r"ds_bpermute_b32|ds_permute_b32|ds_swizzle_b32|v_permlane\w+|v_readlane_b32|shfl\.sync\.\w+"


def _amd_wave(asm: str) -> int:
    return int(re.search(r"\.wavefront_size:\s*(\d+)", asm).group(1))


def _cross_lane(asm: str) -> str:
    found = Counter(m.group(0) for m in re.finditer(CROSS_LANE, asm))
    return ", ".join(f"{name} x{count}" for name, count in found.most_common()) or "-"


@functools.cache
def lanes(target: str) -> dict:
    """What attention v4 (a softmax: row reductions across lanes) compiles to on ``target``:
    the lanes per wave and the instructions that move data between lanes."""
    report = isa.inspect("attention", "v4", target)
    if report.dialect == "amdgcn":
        wave = _amd_wave(report.asm)
        where = ".wavefront_size in the kernel metadata"
    else:  # PTX: .reqntid is threads per block; the block is num_warps warps
        threads = int(re.search(r"\.reqntid\s+(\d+)", report.asm).group(1))
        wave = threads // report.options["num_warps"]
        where = f".reqntid {threads} / num_warps {report.options['num_warps']}"
    # A lane mask is 64 bits on a 64-lane wave: a compare writes it to an SGPR pair, a branch
    # saves exec (its buffer loads check bounds themselves, so v4 has no such branch).
    masks = Counter(re.findall(r"\b(v_cmp\w*_e64(?=\s+s\[\d+:\d+\])|s_and_saveexec_b64)", report.asm))
    example = next(line for line in report.asm.splitlines() if re.search(CROSS_LANE, line))
    return {"target": target, "lanes per wave": wave, "from": where,
            "cross-lane instructions": _cross_lane(report.asm),
            "first of them": " ".join(example.split()),
            "lane-mask instructions": ", ".join(f"{k} x{v}" for k, v in masks.most_common(3)) or "-"}


@functools.cache
def matrix_instructions() -> list[dict]:
    """GEMM v4's matrix instructions and wave size on CDNA3, CDNA4, RDNA3 and Hopper."""
    rows = []
    for target in ("gfx942", "gfx950", "sm90"):
        report = isa.inspect("gemm", "v4", target)
        wave = _amd_wave(report.asm) if report.dialect == "amdgcn" else isa.TARGETS[target][2]
        rows.append({"target": target, "lanes per wave": wave,
                     "matrix instructions": ", ".join(report.matrix_instructions)})
    asm = "\n".join(kernel["asm"] for kernel in isa_compile.compile_rung("gemm", "v4", RDNA3, "bfloat16"))
    wmma = Counter(re.findall(r"\bv_wmma_\w+", asm))
    rows.append({"target": RDNA3[1], "lanes per wave": _amd_wave(asm),
                 "matrix instructions": ", ".join(wmma)})
    return rows


def lds_rows() -> list[dict]:
    """LDS per CU from the specs; bytes per clock per CU from the LDS roof, hence banks."""
    rows = []
    for name in GPUS:
        gpu = roofline.spec(name)
        row = {"GPU": gpu.name, "target": gpu.target, "lanes per wave": gpu.wave_size,
               "LDS KiB per CU (SM)": gpu.lds_kib_per_cu, "LDS B/clk/CU": None, "banks": None}
        if "lds" in gpu.memory_levels:
            per_clock = gpu.memory_levels["lds"] * 1e12 / (gpu.compute_units * gpu.clock_ghz * 1e9)
            row["LDS B/clk/CU"] = round(per_clock)
            row["banks"] = round(per_clock) // BANK_BYTES
        rows.append(row)
    return rows


def ridges() -> list[dict]:
    return [{"GPU": roofline.spec(n).name, **{d: round(roofline.spec(n).ridge(d))
                                              for d in ("bf16", "fp8")}} for n in GPUS]


def v3_v4() -> tuple:
    return isa.inspect("gemm", "v3", "gfx942"), isa.inspect("gemm", "v4", "gfx942")


def instruction_shape(instruction: str) -> tuple[int, int, int]:
    """M, N, K of a matrix instruction named ..._MxNxK_..."""
    return tuple(int(x) for x in re.search(r"_(\d+)x(\d+)x(\d+)", instruction).groups())


def mfma_size(report) -> int:
    return max(instruction_shape(name)[0] * instruction_shape(name)[1] for name in report.matrix_instructions)


FP8 = {"e4m3fnuz": torch.float8_e4m3fnuz, "e4m3fn (OCP)": torch.float8_e4m3fn}


def _byte_value(dtype, byte: int) -> float:
    return torch.tensor([byte], dtype=torch.uint8).view(dtype).float().item()


def fp8_rows() -> list[dict]:
    rows = []
    for name, dtype in FP8.items():
        info = torch.finfo(dtype)
        rows.append({"format": name, "max": info.max, "smallest normal": info.tiny,
                     "byte 0x40": _byte_value(dtype, 0x40), "byte 0x80": _byte_value(dtype, 0x80),
                     "-0.0 cast, byte": hex(torch.tensor([-0.0]).to(dtype).view(torch.uint8).item()),
                     "1000 cast": torch.tensor([1000.0]).to(dtype).float().item(),
                     "native on": ", ".join(a for a in ("gfx942", "gfx950", "sm_90") if fp8_dtype(a) == dtype)})
    return rows


BUCKET_BYTES = 1 << 30   # one gradient bucket: 1 GiB


ALPHA_S = 10e-6   # a per-message latency for the comparisons; no spec gives one


def all_reduce_rows(gpu: str = "MI300X") -> list[dict]:
    """Every all-reduce algorithm on 8 GPUs at ``ALPHA_S`` per step (on a full mesh ring and
    two-shot move the same bytes and differ only in steps), then a ring on one link."""
    rows = [comm_model.predict(gpu, "all_reduce", alg, BUCKET_BYTES, alpha=ALPHA_S)
            for alg in ALGORITHMS["all_reduce"]]
    rows.append(comm_model.predict(gpu, "all_reduce", "ring", BUCKET_BYTES, alpha=ALPHA_S, links_used=1))
    return [{"label": r["label"], "GPU": r["gpu"], "algorithm": r["algorithm"], "links used": r["links_used"],
             "GB/s per rank": r["send_gbps"], "alpha (us)": r["alpha_s"] * 1e6, "ms": r["seconds"] * 1e3}
            for r in rows]


# The phrases of workbench.isa.tune_space.verdict; nothing there times a config, so the
# last reason counts zero, computed like the others.
REASONS = {"spills VGPRs": r"spills \d+ VGPRs", "spills SGPRs": r"spills \d+ SGPRs",
           "uses scratch memory": r"bytes of scratch",
           "needs more LDS than a workgroup may have": r"bytes of LDS >", "was slow when timed": r"timed|slow"}


def tuning_rows(op: str) -> list[dict]:
    """Per target of ``op``'s shipped table: configs kept, dropped, and why they were dropped."""
    table = _table(op)
    rows = []
    for target, verdicts in table.items():
        why = [entry["why"] for entry in verdicts["dropped"]]
        rows.append({"target": target, "kept": len(verdicts["kept"]), "dropped": len(why),
                     **{reason: sum(bool(re.search(p, w)) for w in why) for reason, p in REASONS.items()}})
    return rows


def gemm_roof_row(shape_name: str, gpu: str = "MI300X") -> dict:
    """Where a bf16 GEMM preset falls against ``gpu``'s bf16 ridge (model)."""
    gemm, spec = kernels.spec("gemm"), roofline.spec(gpu)
    shape = gemm.bench_shapes[shape_name]
    intensity = gemm.flops(shape) / gemm.bytes_moved(shape, torch.bfloat16)
    return {"shape": f"{shape_name} {shape}", "FLOP/byte": round(intensity),
            f"{spec.name} bf16 ridge": round(spec.ridge("bf16")),
            "bound (model)": roofline.bound(spec, intensity, "bf16")}


def dropped_configs(op: str, target: str = "gfx942") -> list[dict]:
    """The configs ``op``'s shipped table dropped on ``target``, with why."""
    return [{**entry["config"], "why": entry["why"]} for entry in _table(op)[target]["dropped"]]


def _table(op: str) -> dict:
    return tuning.shipped(Path(kernels.__file__).parent / op / "tuned_space.json")



def gemm_v4_config() -> dict:
    """GEMM v4's gfx942 tile and pipeline settings (what ``isa.inspect`` compiles)."""
    return v4_config("hip", "gfx942")


@functools.cache
def v4_lds_by_stages() -> list[dict]:
    """GEMM v4 (bf16) compiled for gfx942 at num_stages 1, 2 and 3: LDS against the bytes of
    one A tile plus one B tile, registers and occupancy."""
    cfg = gemm_v4_config()
    pair = (cfg["BLOCK_M"] + cfg["BLOCK_N"]) * cfg["BLOCK_K"] * torch.bfloat16.itemsize
    rows = []
    for stages in (1, 2, 3):
        report = isa.inspect("gemm", "v4", "gfx942",
                             overrides=None if stages == cfg["num_stages"] else {"num_stages": stages})
        rows.append({"num_stages": stages, "LDS bytes": report.lds_bytes, "A+B tile pairs": report.lds_bytes / pair,
                     "VGPRs": report.vgprs, "occupancy": str(report.occupancy)})
    return rows
