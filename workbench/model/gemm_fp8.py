"""The FP8 GEMM (``gemm_fp8`` v1 and v2): GEMM's model with one-byte operands, FP8 MFMAs and a
bf16 output.

v1 hands the e4m3 tiles of A and B (K-contiguous, the layout its ``aot`` compiles) to
``tl.dot``: ``v_mfma_f32_16x16x32_fp8_fp8`` on gfx942, ``v_mfma_f32_16x16x128_f8f6f4`` on
gfx950 (cycles in ``machine.yaml``, [S4]); its 1-D grid's hardware ids are dealt to the XCDs
round robin and remapped, as gemm v3's, so each XCD walks a contiguous run of the grouped order
(``GROUP_M`` row tiles per group). A launch is one binary (:data:`kernels.gemm_fp8.configs.BINARIES`) at one operand
layout (:func:`launch`: the tuner's :class:`kernels.tuning.Problem` names both in ``kernel``,
:func:`kernels.gemm_fp8.configs.part`), compiled as that binary's ``aot`` launch at that
layout; the rung's forward (:func:`predict`) is its main launch,
v2's the blockwise binary (:data:`kernels.gemm_fp8.configs.AOT`). The config is the binary's prior for the shape (the
first of the per-shape prune of what the target's table keeps for it,
:func:`kernels.gemm_fp8.configs.prior`), or a tuner's candidate pinned for the prediction
(:func:`.candidates.predict_config`, so the tuners' ranker orders each binary's candidates).
Per-row and per-column or per-tensor scales (v1; v2's rowwise and tensorwise binaries) are
read once per tile in the epilogue (not charged). v2's blockwise binaries take DeepSeek-V3's
1x128 scales of A and B's per 128 x 128 (or 128 x 1) block: their hot loop loads each K
block's scales and multiplies the block's partial product by them on the fp32 accumulator,
which the loop's instruction mix charges; the scales' bytes past L1 (4 per 128 elements of
A's rows and per 128 x 128 block of B, about 3 % of A's) are not added to the tiles' traffic.
The clock under an FP8 MFMA load is MAF2's where measured (MI300X), else the spec's. On sm_90
(H100, H200) the loop is read from the PTX (:mod:`.ptx_loop`: e4m3 ``wgmma``), the config is the
"cuda" table's, the hardware ids are not remapped (one "XCD") and the clock is the 1830 MHz the
tensor peaks are quoted at.
"""
from __future__ import annotations

from kernels.gemm_fp8 import configs as fp8_configs
from kernels.gemm_fp8 import spec
from kernels.gemm_fp8.formats import fp8_dtype
from kernels.xcd import full_chip_xcds

from .. import isa
from . import gemm, predict_gemm, tiles
from .pinned import pinned
from .prediction import NotCovered, Prediction
from .tiles import Wave, round_robin

RUNGS = ("v1", "v2")
OUT_BYTES = spec.OUT_DTYPE.itemsize      # v1's output dtype (its aot and its default)


def waves(cfg: dict, shape: tuple, slots: int, xcds: int) -> list[Wave]:
    m, n, k = shape
    tiles_m, tiles_n = -(-m // cfg["BLOCK_M"]), -(-n // cfg["BLOCK_N"])
    out = cfg["BLOCK_M"] * cfg["BLOCK_N"] * OUT_BYTES
    tile = gemm.v3_order(cfg, tiles_m, tiles_n)
    return [Wave(tuple((round_robin(i, xcds), tile(i)) for i in ids), k, out_bytes=out)
            for ids in tiles.waves(tiles_m * tiles_n, slots)]


def predict(label: str, shape, dtype: str, chip_spec) -> Prediction:
    """FP8 GEMM rung ``label`` at ``shape`` (M, N, K), e4m3 operands, bf16 output: its main
    launch, v2's the blockwise binary (the first its ISA page compiles, :data:`kernels.gemm_fp8.configs.AOT`)."""
    return launch(label, fp8_configs.AOT.get(label, (label,))[0], shape, dtype, chip_spec)


def launch(label: str, kernel: str, shape, dtype: str, chip_spec) -> Prediction:
    """One launch of rung ``label`` as its tuner names it (:class:`kernels.tuning.Problem`'s
    ``kernel``, ``"binary:layout"``, :func:`kernels.gemm_fp8.configs.part`; a binary alone: at
    NT): that binary (:data:`kernels.gemm_fp8.configs.BINARIES`) at its own prior for the
    layout or a pinned candidate, compiled as the binary's ahead-of-time launch at the layout."""
    shape = predict_gemm.check_shape(shape, ("M", "N", "K"))
    if dtype != "fp8":
        raise NotCovered(f"dtype {dtype!r}: the FP8 GEMM model covers fp8 (e4m3 operands, bf16 output)")
    if label not in RUNGS:
        raise NotCovered(f"the model covers gemm_fp8 rungs {', '.join(RUNGS)}, not {label}")
    own = [name for name, b in fp8_configs.BINARIES.items() if b.rung == label]
    binary, layout = fp8_configs.parts(kernel)
    if binary not in own:
        raise NotCovered(f"gemm_fp8 {label} launches binaries {', '.join(own)}, not {kernel!r}")
    candidate = pinned()
    backend = gemm.backend_of(chip_spec.target)
    tile = candidate or fp8_configs.prior(backend, chip_spec.target, *shape, binary, layout)
    cfg = {**tile, "NUM_XCDS": full_chip_xcds(backend, chip_spec.target)}
    report = isa.inspect("gemm_fp8", label, target=chip_spec.target, dtype=fp8_dtype(chip_spec.target),
                         overrides={**tile, "binary": binary, "layout": layout})
    block = (cfg["BLOCK_M"], cfg["BLOCK_N"])
    return predict_gemm.tile_launch(
        "gemm_fp8", label, shape, dtype, chip_spec, report, cfg, None, OUT_BYTES,
        lambda slots, xcds: waves(cfg, shape, slots, xcds),
        lambda wave, xcds: tiles.traffic(wave, shape, block, 1, xcds),
        spec.SPEC.flops(shape), "a tuner's candidate, pinned" if candidate
        else f"gemm_fp8 {label}'s {binary} prior at {layout} for the shape (kernels.gemm_fp8.configs.prior)")
