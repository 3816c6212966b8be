"""What an attention forward rung launches at one shape: the config it picks, the key loops
its compile holds, and how many iterations of each every program runs.

A program owns ``BLOCK_M`` query rows of one head and walks the key tiles. v2 has one key
loop and walks every tile of S_k, causal or not (the mask is applied, the work is done).
v3 and v4 (v3's kernel, tuned) have two: an unmasked loop over the key tiles every row of
the block sees, and a masked one over the diagonal tiles and a ragged last tile; a causal
program of query block ``i`` stops at key ``(i + 1) x BLOCK_M``, so programs of early query
blocks finish early and the work is uneven across the launch (:func:`trips`).

Configs come from the rungs: v2's and v3's ``config`` (one per backend), v4's prior for the
shape (:func:`kernels.attention.v4_amd_tuned.prior`: the untimed first choice; on a GPU its
tuner may time another). v5's forward pass is v3's launch with v3's config, so v5 is
predicted as that forward (its backward: :mod:`.attention_backward`). v2 and v3 compile
ahead of time at head dim 128 only (their ``aot``), so the model covers them at head dims
that pad to 128 (65..128).
"""
from __future__ import annotations

from dataclasses import dataclass

from kernels.attention import v2_flash_forward, v3_causal_lse, v4_amd_tuned
from kernels.attention.spec import MAX_HEAD_DIM

from .gemm import backend_of
from .pinned import pinned
from .prediction import NotCovered

RUNGS = ("v2", "v3", "v4", "v5")
LOOPS = {"v2": 1, "v3": 2, "v4": 2}          # key loops in the compiled kernel: (unmasked, masked)
FORWARD_OF = {"v5": "v3"}                    # v5's forward pass is v3's launch (v5_backward._FlashAttention)
AOT_HEAD_BLOCK = 128                          # v2's and v3's aot compile head dim


@dataclass(frozen=True)
class AttentionPlan:
    rung: str          # the rung whose forward kernel runs (v5: v3)
    cfg: dict          # BLOCK_M/N/D, num_warps, num_stages, AMD knobs
    overrides: dict    # what the ISA inspector's compile gets (v4's settings)


def check_shape(shape) -> tuple:
    """(B, Hq, Hkv, S, S_k, D, causal), the attention spec's order, checked."""
    if not isinstance(shape, (tuple, list)) or len(shape) != 7 or not all(
            isinstance(x, int) and not isinstance(x, bool) for x in shape[:6]):
        raise ValueError(f"shape must be (B, Hq, Hkv, S, S_k, D, causal) with int sizes, got {shape!r}")
    b, hq, hkv, s, sk, d, causal = shape
    if min(b, hq, hkv, s, sk, d) < 1 or hq % hkv or d > MAX_HEAD_DIM or causal not in (0, 1, True, False):
        raise ValueError(f"shape {shape!r}: sizes >= 1, Hq a multiple of Hkv, D <= {MAX_HEAD_DIM}, causal 0 or 1")
    return (b, hq, hkv, s, sk, d, int(causal))


def plan(rung: str, shape: tuple, arch: str) -> AttentionPlan:
    """The config ``rung`` runs at ``shape`` on an ``arch`` GPU."""
    _, _, _, s, sk, d, _ = shape
    rung = FORWARD_OF.get(rung, rung)
    backend = backend_of(arch)
    if rung == "v4":   # a tuner's candidate where one is pinned (.candidates), else the prior
        cfg = dict(pinned() or v4_amd_tuned.prior(backend, arch, d, s, sk))
        return AttentionPlan(rung, cfg, dict(cfg))
    if rung not in RUNGS:
        raise NotCovered(f"the model covers attention rungs {', '.join(RUNGS)}, not {rung!r}")
    cfg = (v2_flash_forward if rung == "v2" else v3_causal_lse).config(backend, d)
    if cfg["BLOCK_D"] != AOT_HEAD_BLOCK:
        raise NotCovered(f"attention {rung} compiles ahead of time at head dim {AOT_HEAD_BLOCK} only "
                         f"(its aot); D = {d} runs BLOCK_D = {cfg['BLOCK_D']}: use v4, or D in 65..128")
    return AttentionPlan(rung, cfg, {})


def trips(rung: str, cfg: dict, block: int, s: int, sk: int, causal: int) -> tuple[int, ...]:
    """Key-loop iterations of the program of query block ``block``, per compiled loop
    (v2: one loop; v3, v4: unmasked, masked), as the kernels compute their bounds."""
    bm, bn = cfg["BLOCK_M"], cfg["BLOCK_N"]
    if rung == "v2":
        return (-(-sk // bn),)
    hi = min(sk, (block + 1) * bm) if causal else sk
    full = min(sk, block * bm + 1) if causal else sk
    if causal or not (s % bm == 0 and sk % bn == 0):
        full = min(full // bn * bn, hi)
    return -(-full // bn), -(-(hi - full) // bn)
