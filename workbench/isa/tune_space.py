"""Prune the tuning spaces ahead of time: a config that spills on the target is never timed.

    python -m workbench.isa.tune_space                   # compile and print, every op, all targets
    python -m workbench.isa.tune_space --op attention --write   # 9 minutes on 2 cores (2026-11-30)
    python -m workbench.isa.tune_space --op attention --target gfx950 --write
    python -m workbench.isa.tune_space --op attention_backward --write   # 17 minutes on 2 busy cores (2026-12-02)
    python -m workbench.isa.tune_space --op grouped_gemm --write
    python -m workbench.isa.tune_space --op gemm --write    # bf16 and float32: 9 minutes on 2 cores (2026-12-04)
    python -m workbench.isa.tune_space --op moe --write      # after grouped_gemm: its kept configs
    python -m workbench.isa.tune_space --op gemm_fp8 --write   # 29 minutes under nice on 2 shared cores (2026-12-05)

Every candidate of an op's ``configs.candidates`` is compiled with the ISA inspector
for its target, at bf16 and at float32 (each target's ``:fp32`` section, which a float32 call
tunes among: :func:`kernels.tuning.section`), with the rung its users get: the
GEMM with v6 (the rung ``kernels.matmul`` runs) once per operand layout of
:data:`kernels.gemm.configs.LAYOUTS` and once as ``kernels.nn.Linear`` runs it (NT with the
bias epilogue, ``NT_bias``), attention with v4 (``kernels.flash_attention``'s forward) at the config's head dim
(``BLOCK_D``, 64 or 128), causal, attention's backward with v5 (each config names its kernel,
dK/dV or dQ, compiled at its head dim, causal), the grouped GEMM with v4 (``kernels.grouped_gemm``)
three times: its forward, its backward's dX launch and its dW kernel, the MoE layer with
v3 (``kernels.MoE``'s experts) twice, its gate/up and its down kernel, on the configs the
grouped GEMM's table keeps, the FP8 GEMM with each binary its launches run (v1; v2 with
DeepSeek-V3's per-K-block scales, ``v2_blockwise``, and with B's per 128 x 1, the weight
gradient's, ``v2_blockwise_128x1``; v2 with scales constant along K, per row and column,
``v2_rowwise``, and per tensor, ``v2_tensorwise``) at each operand layout its recipes' launches run
(:data:`kernels.gemm_fp8.configs.PARTS`: NT for every binary, NN for the blockwise and per-tensor
dgrad, TN for the per-tensor wgrad; v1 and ``v2_rowwise`` at plain calls' NN and TN) at each target's e4m3 format (its one section per target,
split per binary and layout, ``binary:layout``: each launch tunes among the configs its own
binary's compile at its own layout keeps, ``per_binary``). A config is dropped when,
in any of its compiles, it spills VGPRs or (AMD) SGPRs, uses scratch (AMD private segment, NVIDIA
stack frame), or needs more LDS / shared memory than one workgroup may have, unless every
config of its group spills (:func:`least_spilling`: then those that can launch are kept, least
spilling first, marked ``"spilling"``). Attention's forward and backward, the MoE layer and
the FP8 GEMM also record their 8- and 16-bit LDS ops (:func:`workbench.isa.parse.narrow_lds`)
and drop a config that has some where its group keeps one that has none (:func:`clean_lds`);
attention's backward also records, on sm90, its ``mma.sync`` products (``mma_sync_ops``: a tile
with no warpgroup shape) and puts each group's prior, the config a launch runs untimed, first
(:func:`prior_first`). ``--write`` stores the verdicts,
with the resources behind them, in the table ``kernels`` ships
(``<op's package>/tuned_space.json``), replacing only the targets compiled.
"""
from __future__ import annotations

import argparse
import json
from types import ModuleType
from typing import Callable, NamedTuple

import torch
import triton

from kernels import tuning
from kernels.attention import configs as attention_configs
from kernels.attention import configs_backward as attention_backward_configs
from kernels.gemm import configs as gemm_configs
from kernels.gemm_fp8 import configs as gemm_fp8_configs
from kernels.moe.grouped_gemm import configs as grouped_gemm_configs
from kernels.moe.layer_ladder import configs as moe_configs

from .. import isa
from . import occupancy as isa_occupancy

DTYPE = torch.bfloat16
WORKGROUP_LDS_BYTES = {
    **isa_occupancy.LDS_BYTES_PER_CU,  # a CDNA workgroup may take the whole CU's LDS
    "sm90": isa_occupancy.HOPPER_SHARED_BYTES_PER_SM - isa_occupancy.HOPPER_SHARED_RESERVED_PER_BLOCK,
}


BOTH = (DTYPE, torch.float32)   # the 2-byte dtypes' verdicts and float32's


class Op(NamedTuple):
    """How one op's space is compiled."""

    rung: str
    configs: ModuleType   # TABLE, candidates(target)
    compiles: Callable[[dict], dict[str, dict]]   # a config -> {compile name: extra overrides}
    about: str
    registry_op: str | None = None   # the op of the rung compiled, when the table is not the op's own
    narrow_lds: bool = False   # record 8/16-bit LDS ops (AMD) too, pruned by clean_lds
    prior_order: bool = False   # each group's kept configs in prior_first's order, not candidate order
    dtypes: tuple = BOTH   # compiled at each; float32 is a section of its own (kernels.tuning.section)
    group: Callable[[dict], tuple] = lambda cfg: ()   # configs a launch chooses among (least_spilling)
    compile_rung: Callable[[str], str] | None = None   # a compile's rung, by its name, where compiles differ in it
    per_binary: bool = False   # each compile is a binary launched apart: a section per compile, pruned on its own


OPS = {
    "gemm": Op("v6", gemm_configs,
               lambda cfg: {**{layout: {"layout": layout} for layout in gemm_configs.LAYOUTS},
                            "NT_bias": {"layout": "NT", "HAS_BIAS": True}},
               f"layouts {', '.join(gemm_configs.LAYOUTS)}, and NT with nn.Linear's bias epilogue (NT_bias)"),
    "attention": Op("v4", attention_configs, lambda cfg: {f"D{cfg['BLOCK_D']}": {}},
                    "causal, at the head dim of each config (BLOCK_D), with its 8/16-bit LDS ops "
                    "(narrow_lds_ops: dropped where the head dim keeps a config without any)",
                    narrow_lds=True, group=lambda cfg: (cfg["BLOCK_D"],)),
    "attention_backward": Op("v5", attention_backward_configs,
                             lambda cfg: {f"{cfg['KERNEL']}_D{cfg['BLOCK_D']}": {},
                                          f"{cfg['KERNEL']}_D{cfg['BLOCK_D']}_packed": {"VARLEN": True}},
                             "causal, each config its kernel (KERNEL) at its head dim (BLOCK_D), dense "
                             "and packed (VARLEN: flash_attention_varlen's backward runs the same config), "
                             "with its 8/16-bit LDS ops (narrow_lds_ops: dropped where the kernel and head dim keep a config "
                             "without any) and (sm90) its mma.sync products (mma_sync_ops), each group's prior "
                             "first (no spills, then on AMD no narrow LDS ops and more waves, on sm90 wgmma only)",
                             registry_op="attention", narrow_lds=True, prior_order=True,
                             group=lambda cfg: (cfg["KERNEL"], cfg["BLOCK_D"])),
    "grouped_gemm": Op("v4", grouped_gemm_configs,
                       lambda cfg: {kernel: {"kernel": kernel} for kernel in grouped_gemm_configs.KERNELS},
                       "DeepSeek-V3's down projection, its forward, dX and dW kernels"),
    "moe": Op("v3", moe_configs, lambda cfg: {kernel: {"kernel": kernel} for kernel in moe_configs.KERNELS},
              "DeepSeek-V3's 32 local experts, its gate/up and down kernels, over the configs the "
              "grouped GEMM's table keeps, with their 8/16-bit LDS ops (narrow_lds_ops: dropped where "
              "a config without any is kept)", narrow_lds=True),
    # None: the rung's own dtype on each target (isa.default_dtype: e4m3fnuz on gfx942, e4m3fn elsewhere)
    "gemm_fp8": Op("v1 and v2", gemm_fp8_configs,
                   lambda cfg: {part: {"binary": name, "layout": layout}
                                for part, (name, layout) in gemm_fp8_configs.PARTS.items()},
                   "each binary a launch runs, named by its rung: v1 (scales constant along K, in the "
                   "epilogue), v2_blockwise (v2 with DeepSeek-V3's 1x128 / 128x128 scales on the "
                   "accumulator per K block; v2_blockwise_128x1 with B's per 128x1, the weight gradient's), "
                   "v2_rowwise and v2_tensorwise (v2 with scales constant "
                   "along K, in the epilogue, per row and column as the rowwise recipe passes them, "
                   "per tensor as the tensorwise and delayed recipes do), each at every operand layout "
                   "its recipes' launches run (binary:layout, e.g. v2_blockwise:NN, the blockwise dgrad's "
                   "N-contiguous B); a section per binary and layout, each launch tuning among the configs "
                   "its own binary's compile at its own layout keeps",
                   narrow_lds=True, dtypes=(None,),
                   compile_rung=lambda part: gemm_fp8_configs.BINARIES[gemm_fp8_configs.PARTS[part][0]].rung,
                   per_binary=True),
}


def measure(op: str, target: str, overrides: dict, dtype: torch.dtype | None = DTYPE,
            rung: str | None = None) -> dict:
    """The resources of the op's main kernel compiled with ``overrides`` on ``target`` at ``dtype``
    (None: the rung's own on ``target``, :func:`workbench.isa.inspector.default_dtype`), of
    ``rung`` (default: the op's)."""
    report = isa.inspect(OPS[op].registry_op or op, rung or OPS[op].rung, target, dtype, overrides=overrides)
    # SGPRs are AMD's scalar registers: sm90 has none, so its entries have no such count.
    extra = {"sgpr_spills": report.sgpr_spills} if report.dialect == "amdgcn" else {}
    if OPS[op].narrow_lds and report.dialect == "amdgcn":
        extra["narrow_lds_ops"] = report.narrow_lds_ops
    if OPS[op].prior_order and report.dialect == "ptx":   # prior_key ranks sm90's priors by it
        extra["mma_sync_ops"] = report.warp_products
    return {"vgprs": report.vgprs, "agprs": report.agprs, "spills": report.spills, **extra,
            "scratch_bytes": report.scratch_bytes, "lds_bytes": report.lds_bytes,
            "occupancy": report.occupancy.value}


def compiled(op: str, target: str, cfg: dict, dtype: torch.dtype | None = DTYPE) -> dict[str, dict]:
    """The resources of each of the op's compiles of ``cfg`` on ``target`` at ``dtype``, by compile name."""
    rung = OPS[op].compile_rung or (lambda name: None)
    return {name: measure(op, target, {**cfg, **extra}, dtype, rung(name))
            for name, extra in OPS[op].compiles(cfg).items()}


def verdict(target: str, resources: dict) -> str | None:
    """Why the compiled kernel must not be timed on ``target``, or None when it may."""
    if resources["spills"]:
        return f"spills {resources['spills']} VGPRs"
    if resources.get("sgpr_spills"):   # into VGPR lanes: no scratch, but v_writelane/readlane traffic
        return f"spills {resources['sgpr_spills']} SGPRs"
    if resources["scratch_bytes"]:
        return f"{resources['scratch_bytes']} bytes of scratch per thread"
    if not launchable(target, resources):
        return f"{resources['lds_bytes']} bytes of LDS > {WORKGROUP_LDS_BYTES[target]}"
    return None


def compiles(entry: dict) -> dict[str, dict]:
    """A table entry's resources per compile (its other fields are the config and the verdicts)."""
    return {name: value for name, value in entry.items() if name not in ("config", "why", "spilling")}


def launchable(target: str, resources: dict) -> bool:
    """Whether a workgroup of the compiled kernel fits on ``target`` at all (LDS / shared memory)."""
    return resources["lds_bytes"] <= WORKGROUP_LDS_BYTES[target]


def spill_bytes(resources: dict) -> int:
    """What a compile spills per thread, in bytes: 4 per VGPR or SGPR spilled, and its scratch."""
    return 4 * ((resources["spills"] or 0) + resources.get("sgpr_spills", 0)) + resources["scratch_bytes"]


def least_spilling(target: str, table: dict, group: Callable[[dict], tuple]) -> dict:
    """``table`` with, for each group of configs a launch chooses among (an op's ``group``: the
    head dim class, the backward's kernel) that keeps none, the group's configs that can launch
    moved to "kept", least spilling first and marked ``"spilling": true`` (their verdicts stay in
    "why"). At float32 every candidate of some groups spills (the grouped GEMM on gfx950, attention's
    forward on sm90: twice bf16's bytes per element); a float32 call must still run one, and the
    tuner then times those that spill least. A group none of whose configs can launch keeps nothing."""
    groups = {group(e["config"]) for e in table["kept"] + table["dropped"]}
    for g in sorted(groups - {group(e["config"]) for e in table["kept"]}):
        rescued = sorted((e for e in table["dropped"] if group(e["config"]) == g
                          and all(launchable(target, r) for r in compiles(e).values())),
                         key=lambda e: sum(spill_bytes(r) for r in compiles(e).values()))
        table["dropped"] = [e for e in table["dropped"] if e not in rescued]
        table["kept"] += [{**e, "spilling": True} for e in rescued]
    return table


def _recorded(entry: dict, count: str) -> int:
    """A count a table entry's compiles record, summed (0 where none is recorded)."""
    return sum(r.get(count) or 0 for r in compiles(entry).values())


def narrow_lds_ops(entry: dict) -> int:
    """A table entry's 8- and 16-bit LDS ops over its compiles (0 where none are recorded)."""
    return _recorded(entry, "narrow_lds_ops")


def clean_lds(table: dict, group: Callable[[dict], tuple]) -> dict:
    """``table`` without the kept configs that move 8- or 16-bit elements through LDS (a layout
    change the tile and warp split force through LDS an element at a time,
    :func:`workbench.isa.parse.narrow_lds`) in a group that keeps a config moving none: they
    go to "dropped", each compile's count in "why". A group whose every config has some keeps them."""
    clean = {group(e["config"]) for e in table["kept"] if not narrow_lds_ops(e)}
    smelly = [e for e in table["kept"] if narrow_lds_ops(e) and group(e["config"]) in clean]
    table["kept"] = [e for e in table["kept"] if e not in smelly]
    table["dropped"] += [{**e, "why": "; ".join(f"{name}: {r['narrow_lds_ops']} 8/16-bit LDS ops"
                                                for name, r in compiles(e).items() if r.get("narrow_lds_ops"))}
                         for e in smelly]
    return table


def warp_products(entry: dict) -> int:
    """A table entry's ``mma.sync`` products over its compiles (0 where none are recorded: AMD)."""
    return _recorded(entry, "mma_sync_ops")


def waves(entry: dict) -> int:
    """A table entry's occupancy: the least over its compiles (waves/SIMD on AMD)."""
    return min(r["occupancy"] for r in compiles(entry).values())


def prior_key(target: str, entry: dict) -> tuple:
    """How a kept config ranks as its group's prior, lowest first: the bytes it spills (none,
    but for :func:`least_spilling`'s rescued), then on AMD whether it has 8/16-bit LDS ops
    and its waves/SIMD, more first; on sm90 whether it has ``mma.sync`` products (a tile with
    no 64-row warpgroup shape: Hopper's dense tensor peak is reached only through ``wgmma``),
    then candidate order."""
    spilled = sum(map(spill_bytes, compiles(entry).values()))
    if isa.TARGETS[target][0] == "hip":
        return spilled, bool(narrow_lds_ops(entry)), -waves(entry)
    return spilled, bool(warp_products(entry))


def prior_first(target: str, table: dict, group: Callable[[dict], tuple]) -> dict:
    """``table`` with each group's kept configs in the order a launch without timings takes
    them (the first that fits its shape is the prior, :func:`kernels.tuning.kept`): by
    :func:`prior_key`, i.e. no spills, then on AMD no 8- or 16-bit LDS ops, then more waves per
    SIMD (a latency an MFMA or LDS op waits out is hidden by the other waves), on sm90 no
    ``mma.sync``; ties keep candidate order, and the groups keep theirs."""
    order = list(dict.fromkeys(group(e["config"]) for e in table["kept"]))
    table["kept"] = [e for g in order for e in sorted((e for e in table["kept"] if group(e["config"]) == g),
                                                      key=lambda e: prior_key(target, e))]
    return table


def prune_target(op: str, target: str, progress=print, dtype: torch.dtype | None = DTYPE) -> dict:
    """Compile every candidate of ``target`` at ``dtype`` in each of its compiles:
    {"kept": [...], "dropped": [...]}, the table section ``kernels.tuning.section(target, dtype)``;
    for an op whose compiles are binaries launched apart (``per_binary``, the FP8 GEMM), one such
    table per compile name, each judged on that compile alone (:func:`prune`)."""
    entries, space = [], OPS[op].configs.candidates(target)
    for i, candidate in enumerate(space):
        cfg = tuning.as_dict(candidate)
        entries.append({"config": cfg, **compiled(op, target, cfg, dtype)})
        why = "; ".join(f"{name}: {w}" for name, r in compiles(entries[-1]).items() if (w := verdict(target, r)))
        progress(f"{op} {tuning.section(target, dtype)} {i + 1}/{len(space)} {cfg} -> {why or 'kept'}")
    if not OPS[op].per_binary:
        return prune(op, target, entries)
    return {name: prune(op, target, [{"config": e["config"], name: e[name]} for e in entries])
            for name in compiles(entries[0])}


def prune(op: str, target: str, entries: list[dict]) -> dict:
    """{"kept": [...], "dropped": [...]} of compiled ``entries`` (a config and its compiles'
    resources): dropped where a compile fails a :func:`verdict`, then :func:`clean_lds` (ops that
    record narrow LDS ops), :func:`least_spilling` and, for ops that order their groups for the
    prior, :func:`prior_first`."""
    table = {"kept": [], "dropped": []}
    for entry in entries:
        why = [f"{name}: {w}" for name, resources in compiles(entry).items() if (w := verdict(target, resources))]
        if why:
            table["dropped"].append({**entry, "why": "; ".join(why)})
        else:
            table["kept"].append(entry)
    group = OPS[op].group
    table = least_spilling(target, clean_lds(table, group) if OPS[op].narrow_lds else table, group)
    return prior_first(target, table, group) if OPS[op].prior_order else table


def write(op: str, tables: dict[str, dict]) -> None:
    """Replace the given targets in the op's shipped table, keep the others."""
    path = OPS[op].configs.TABLE
    old = json.loads(path.read_text()) if path.exists() else {"targets": {}}
    document = {
        "about": "Generated by `python -m workbench.isa.tune_space --write`; do not edit by hand. "
                 f"{op} {OPS[op].rung} at {_names(OPS[op].dtypes)}, triton {triton.__version__}, "
                 f"{OPS[op].about}: configs kept (never spill) and dropped, "
                 "with VGPRs (registers per thread on sm90), AGPRs, VGPR and (AMD) SGPR spills, scratch, "
                 "LDS bytes and occupancy (waves/SIMD on AMD, blocks/SM on sm90) per compile.",
        "targets": {**old["targets"], **tables},
    }
    path.write_text(json.dumps(document, indent=1) + "\n")
    tuning.shipped.cache_clear()


def _names(dtypes) -> str:
    """"bfloat16" or "bfloat16 (float32: the targets' ':fp32' sections)"; None: each target's own."""
    first, *rest = ("each target's e4m3 (e4m3fnuz on gfx942, e4m3fn elsewhere)" if d is None
                    else str(d).removeprefix("torch.") for d in dtypes)
    return first + "".join(f" ({name}: the targets' '{tuning.WIDE}' sections)" for name in rest)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--op", action="append", choices=list(OPS),
                        help="compile this op's space only (repeatable; default: all)")
    parser.add_argument("--target", action="append", choices=list(isa.TARGETS),
                        help="compile for this target only (repeatable; default: all)")
    parser.add_argument("--write", action="store_true", help="store the result in the shipped table")
    args = parser.parse_args(argv)
    for op in args.op or OPS:
        tables = {tuning.section(target, dtype): prune_target(op, target, dtype=dtype)
                  for target in args.target or isa.TARGETS for dtype in OPS[op].dtypes}
        for target, table in tables.items():
            for binary, part in (table.items() if OPS[op].per_binary else [("", table)]):
                print(f"{op} {target}{' ' + binary if binary else ''}: "
                      f"{len(part['kept'])} kept, {len(part['dropped'])} dropped")
        if args.write:
            write(op, tables)


if __name__ == "__main__":
    main()
