"""Launch plumbing shared by the Triton FP8 rungs: tile configs, the grid, AOT signatures.

The rungs differ only inside their ``@triton.jit`` kernel (the lesson); the kernels take the
same arguments, so the host side that fills them in lives here once. The tuned rungs (v1, v2)
choose their config per key (:func:`settings`, :func:`kernels.tuning.choice`) among the
candidates the ahead-of-time table keeps for the binary the launch runs at its operand layout
(:mod:`.configs`, :func:`.configs.binary`) and remap program ids over the device's XCDs (``NUM_XCDS``,
:mod:`kernels.xcd`); v0, the upcast baseline, runs the blockwise binary's prior (:data:`V0_PRIOR`).
"""
from __future__ import annotations

import torch

from .. import backend as _backend
from ..gemm.spec import launch_ints, layout
from ..outputs import new_output
from ..registry import AotKernel
from ..triton_support import aot_launch, cdiv, interp_bf16, next_power_of_2, pointer_type, run_args
from ..tuning import Problem, as_dict, choice, with_overrides
from ..xcd import full_chip_xcds, num_xcds
from . import configs, operands

AOT_SIZE = 8192   # the GEMM the ISA inspector compiles: 8192^3
# v0's untuned tile: the prior of the binary heaviest in registers. v0's own binary (fp16
# upcast tiles) is not in the table and needs a stack frame at v1's sm90 prior, 128x256x128.
V0_PRIOR = "v2_blockwise"


def aot_config(backend: str, arch: str, remap: bool, which: str, layout: str = "NT",
               given: dict | None = None) -> dict:
    """What an ahead-of-time compile of binary ``which`` (:data:`.configs.BINARIES`; v0 takes
    :data:`V0_PRIOR`'s) at operand ``layout`` runs: its prior there at 8192^3
    (:func:`.configs.prior`: a layout's own, which on gfx942 is not always NT's), with the whole
    chip's XCDs for a rung that remaps (``remap``). Settings ``given`` that name every setting of
    a candidate (how ``workbench.isa.tune_space`` compiles each candidate) replace the prior
    whole, so it is not read: a part the table has no section for yet (a binary or layout being
    added, :data:`.configs.PARTS`) compiles, and its section can be built."""
    whole = as_dict(configs.candidates("sm90" if backend == "cuda" else arch)[0])   # a candidate's settings
    cfg = whole if set(whole) <= set(given or ()) else configs.prior(backend, arch, AOT_SIZE, AOT_SIZE, AOT_SIZE,
                                                                     which, layout)
    return {**cfg, "NUM_XCDS": full_chip_xcds(backend, arch)} if remap else cfg


def aot(kernel, dtype: torch.dtype, backend: str, arch: str, overrides: dict | None = None,
        prior: str | None = None, out_dtype: torch.dtype = torch.bfloat16) -> list[AotKernel]:
    """v1's launch for the ISA inspector (binary "v1"), or v0's: ``prior`` names the binary
    whose prior v0, which is not tuned, does not remap and takes v1's arguments, runs
    (:data:`V0_PRIOR`). :func:`aot_binaries`' GEMM."""
    return aot_binaries(kernel, "v1", dtype, backend, arch, overrides, out_dtype, prior)


def aot_blockwise(kernel, dtype: torch.dtype, backend: str, arch: str, overrides: dict | None = None,
                  out_dtype: torch.dtype = torch.bfloat16) -> list[AotKernel]:
    """v2's launches for the ISA inspector (:func:`aot_binaries`), by default
    :data:`.configs.AOT`'s: first DeepSeek-V3's forward scales, A per 1 x 128 ((M, K/128),
    K-block-contiguous) and B per 128 x 128 ((K/128, N/128)), so the compile shows the
    per-K-block scaling in the loop (binary ``v2_blockwise``). B's scales lie as the blockwise
    recipe's forward passes them: the transpose of the weight's (N/128, K/128), unit stride along
    K (Triton folds that stride to a constant). Second the rowwise recipe's scales, A per
    row (M, 1) and B per column (1, N), constant along K (``SCALES_ALONG_K`` False: v1's loop,
    the scales in the epilogue; binary ``v2_rowwise``): the binary the rowwise recipe's GEMMs
    run. The blockwise launch is the main kernel (first of equal MFMA counts).
    ``{"binary": name}`` compiles one binary's launch alone (how ``workbench.isa.tune_space``
    compiles each), ``"v2_tensorwise"`` the per-tensor recipes' (scale strides 0: its epilogue
    reads the scales through strides Triton cannot fold), ``"v2_blockwise_128x1"`` the blockwise
    recipe's weight gradient's (B's scales per 128 x 1, ``GROUP_N`` 1: a scale per column and K
    block, laid out as the transposed x's)."""
    return aot_binaries(kernel, "v2", dtype, backend, arch, overrides, out_dtype)


def aot_binaries(kernel, rung: str, dtype: torch.dtype, backend: str, arch: str, overrides: dict | None = None,
                 out_dtype: torch.dtype = torch.bfloat16, prior: str | None = None) -> list[AotKernel]:
    """The launches of ``rung``'s binaries the ISA inspector compiles (:data:`.configs.AOT`, or
    the one ``overrides`` names as ``"binary"``): an 8192^3 GEMM with K-contiguous A and B
    (the layout FP8 matrix cores and hipBLASLt want; ``overrides``' ``"layout"``, in
    :func:`kernels.gemm.spec.launch_ints`' letters, another: how ``workbench.isa.tune_space``
    compiles each layout a binary's launches run) and each binary's scales
    (:data:`.configs.BINARIES`), laid out as their operands (:func:`scale_strides`: the
    blockwise dgrad's B = w reads its 128 x 128 scales along N, as the forward's w.T reads
    them along K), at :func:`aot_config` (the binary's prior at the layout, the ISA page's
    config, with the whole chip's XCDs; ``prior``: another binary's, without them); A in
    ``dtype`` too unless ``overrides``' ``"a_dtype"`` names another format (a gradient's e5m2:
    how ``tests/test_gemm_fp8_formats.py`` compiles the backward's hybrid GEMMs); ``overrides``
    replaces settings."""
    overrides = dict(overrides or {})
    chosen, layout = overrides.pop("binary", None), overrides.pop("layout", "NT")
    a_dtype = overrides.pop("a_dtype", dtype)
    own = [name for name, b in configs.BINARIES.items() if b.rung == rung]
    if chosen is not None and chosen not in own:
        raise ValueError(f"gemm_fp8 {rung} compiles binaries {own}, not {chosen!r}")
    size = AOT_SIZE
    ints = launch_ints((size, size, size), layout)
    launches = []
    for name in (chosen,) if chosen else configs.AOT[rung]:
        b = configs.BINARIES[name]
        (sam, sak), (sbk, sbn) = (scale_strides(scales, (size, size), 1 if letter == "N" else 0)
                                  for scales, letter in zip((b.scales_a, b.scales_b), layout))
        if rung == "v1":
            scalars, constexprs = dict(stride_sa=sam, stride_sb=sbn), {}
        else:
            scalars = dict(stride_sam=sam, stride_sak=sak, stride_sbk=sbk, stride_sbn=sbn)
            constexprs = {"SCALE_K": operands.SCALE_K, "GROUP_N": b.group_n, "SCALES_ALONG_K": b.along_k}
        cfg = aot_config(backend, arch, prior is None, prior or name, layout, overrides)
        launches.append(aot_launch(kernel, dtype, with_overrides(cfg, overrides), {**ints, **scalars},
                                   constexprs={"INTERP_BF16": False, **constexprs},
                                   pointers={"a_ptr": pointer_type(a_dtype), "c_ptr": pointer_type(out_dtype),
                                             "sa_ptr": "*fp32", "sb_ptr": "*fp32"}))
    return launches


def scale_strides(scales: tuple[int, int], shape: tuple[int, int], contiguous: int) -> tuple[int, int]:
    """The element strides through which an operand of ``shape`` reads its scales, ``scales``
    elements per scale along its rows and columns (0: one scale along the whole dimension,
    :class:`.configs.Binary`), laid out as the operand is: contiguous along axis
    ``contiguous`` (a quantization writes an operand's scales in the operand's order). An axis
    with one scale reads it at stride 0, and a scale tensor with one axis of several at 1."""
    extents = [1 if per == 0 else -(-size // per) for per, size in zip(scales, shape)]
    if 1 in extents:
        return tuple(int(extent > 1) for extent in extents)
    return (extents[1], 1) if contiguous == 1 else (1, extents[0])


def settings(rung: str | None, kernel, a, b, scale_a, scale_b, out_dtype, scale_strides: tuple,
             constexprs: dict) -> dict:
    """The config of a launch: for a tuned ``rung`` ("v1", "v2") the choice of its key (M, N, K
    power-of-two buckets, A's and B's formats, the operand layout, ``out_dtype`` and the scales'
    constexprs: v2's per-K-block scaling compiles another loop) among the per-shape prune of the
    configs the table keeps for the launch's binary (:func:`.configs.binary`: v2's per
    ``SCALES_ALONG_K`` and scale strides; also in the key) at its operand layout
    (:func:`.configs.space`), by :func:`kernels.tuning.choice`
    (timed once per key with the launch
    itself, the prior where nothing may be timed), plus the device's ``NUM_XCDS``; for None (v0)
    :data:`V0_PRIOR`'s prior, without a remap."""
    here = _backend.current()
    (m, k), n = a.shape, b.shape[1]
    if rung is None:
        return configs.prior(here.name, here.arch, m, n, k, V0_PRIOR)
    # v2's scale strides along M and N: 1 is folded to a constant (per row and column), 0 is not (per tensor)
    which = configs.binary(rung, constexprs.get("SCALES_ALONG_K", False), scale_strides[0] == scale_strides[-1] == 1,
                           constexprs.get("GROUP_N", operands.SCALE_K))
    remap, lay = {"NUM_XCDS": num_xcds(here)}, layout(a, b)
    key = (next_power_of_2(m), next_power_of_2(n), next_power_of_2(k), a.dtype, b.dtype, lay,
           out_dtype, *(value for _, value in sorted(constexprs.items())), which)
    cfg = choice(f"gemm_fp8/{rung}", key,
                 lambda: [as_dict(c) for c in configs.prune(configs.space(here.name, here.arch, which, lay), m, n, k)],
                 lambda cfg: _run(kernel, a, b, scale_a, scale_b, out_dtype, scale_strides, constexprs,
                                  {**cfg, **remap}),
                 lambda: Problem("gemm_fp8", rung, (m, n, k), a.dtype, configs.part(which, lay)))
    return {**cfg, **remap}


def _run(kernel, a, b, scale_a, scale_b, out_dtype, scale_strides, constexprs, cfg) -> torch.Tensor:
    """One launch with settings ``cfg``: what the tuner times (a test replaces it)."""
    return Plan(kernel, a, b, out_dtype, scale_strides, constexprs, cfg)(a, b, scale_a, scale_b)


def plan_blockwise(kernel, a, b, scale_a, scale_b, out_dtype) -> "Plan":
    """:func:`launch`'s plan for v2, whose scales may change along K (:func:`operands.check_blockwise`)."""
    scales = operands.check_blockwise(a, b, scale_a, scale_b, out_dtype)
    strides = (scales.stride_sam, scales.stride_sak, scales.stride_sbk, scales.stride_sbn)
    constexprs = dict(SCALE_K=operands.SCALE_K, GROUP_N=scales.group_n, SCALES_ALONG_K=scales.along_k)
    cfg = settings("v2", kernel, a, b, scale_a, scale_b, out_dtype, strides, constexprs)
    return Plan(kernel, a, b, out_dtype, strides, constexprs, cfg)


def launch_blockwise(kernel, a, b, scale_a, scale_b, out_dtype) -> torch.Tensor:
    """:func:`launch` for v2 (:func:`plan_blockwise`)."""
    return plan_blockwise(kernel, a, b, scale_a, scale_b, out_dtype)(a, b, scale_a, scale_b)


def launch(kernel, a, b, scale_a, scale_b, out_dtype, rung: str | None = None) -> torch.Tensor:
    """Check the operands, allocate C (poisonable) and run ``kernel`` over a 1-D grid with the
    config of :func:`settings` (``rung``: the tuned rung's label, None for v0's prior)."""
    strides = operands.check(a, b, scale_a, scale_b, out_dtype)
    cfg = settings(rung, kernel, a, b, scale_a, scale_b, out_dtype, strides, {})
    return Plan(kernel, a, b, out_dtype, strides, {}, cfg)(a, b, scale_a, scale_b)


class Plan:
    """One launch of ``kernel`` on checked operands of one metadata with settings ``cfg``,
    everything but the tensors decided (grid, scalars, settings): a call allocates C and
    launches. A public op keeps it (:mod:`kernels.plans`), so a repeated call skips the checks,
    the config lookup and the packing."""

    def __init__(self, kernel, a, b, out_dtype, scale_strides: tuple, constexprs: dict, cfg: dict):
        (m, k), n = a.shape, b.shape[1]
        self.kernel, self.shape, self.out_dtype, self.config = kernel, (m, n), out_dtype, dict(cfg)
        self.grid = (cdiv(m, cfg["BLOCK_M"]) * cdiv(n, cfg["BLOCK_N"]),)
        # C is new_output's: contiguous, strides (N, 1)
        scalars = (m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1), n, 1, *scale_strides)
        self.args, self.kwargs = run_args(kernel, 5, scalars, self.grid,
                                          {"INTERP_BF16": interp_bf16(out_dtype), **constexprs, **cfg})

    def __call__(self, a, b, scale_a, scale_b) -> torch.Tensor:
        c = new_output(self.shape, self.out_dtype, a.device)
        self.kernel.run(a, b, c, scale_a, scale_b, *self.args, **self.kwargs)
        return c
