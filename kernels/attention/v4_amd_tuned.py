"""v4 amd_tuned: v3's kernel with its tiles and AMD knobs tuned per target, head dim and shape.

Idea:
    The kernel is v3's, unchanged; what changes is how it is launched. The launch
    settings are BLOCK_M (the query rows a program keeps), BLOCK_N (the key tile),
    the waves per program, ``num_stages`` (2 asks Triton's AMD stream pipeliner to
    load K/V tile i+1 while tile i is multiplied; on gfx942 the prefetch waits in
    registers, and the priors' LDS is the same at one stage and two; 2 or 3
    cp.async stages on sm90), ``waves_per_eu`` (Triton's ``amdgpu-waves-per-eu="N,N"``:
    a floor and a ceiling on the waves per SIMD) and ``matrix_instr_nonkdim`` (16x16
    or 32x32 MFMAs). :mod:`.configs` writes the candidates down per target and
    head-dim class (D <= 64, D <= 128); every candidate was compiled ahead of time
    for gfx942, gfx950 and sm90 at its head dim and the ones that spill were dropped
    (``kernels/attention/tuned_space.json``, by ``python -m workbench.isa.tune_space``).
    :func:`tuned` times up to 8 survivors that fit the shape, picked to differ from
    each other (4 and 8 waves, 1 and 2 stages, each ``waves_per_eu`` and MFMA shape:
    :func:`.configs.prune`), on the first call of each (S, S_k power-of-two bucket,
    BLOCK_D, dtype, causal, packed) and keeps the fastest (:func:`kernels.tuning.choice`); on the
    interpreter the space has one config, so nothing is timed. The choice is
    visible: :func:`chosen_config`, and :func:`prior` for the untimed first choice.
    ``kernels.flash_attention`` and ``kernels.flash_attention_varlen`` run this
    forward (:func:`forward`).

Why faster:
    128 query rows per program halve the K/V re-reads of v3's 64, and the second
    stage is there to hide global-load latency behind the MFMAs (on gfx942 its
    prefetch costs VGPRs, not LDS), with two waves per SIMD (on
    gfx942 the priors' VGPRs allow two and no more, so their ``waves_per_eu=2``
    changes nothing there) and 16x16 MFMAs, whose operands reach LDS without
    16-bit accesses on gfx942 where v3's 32x32 ones need them: that is the prior,
    the first config of each class. Whether a config beats another is measured by the tuner on the GPU it
    runs on, not assumed; no GPU timing exists in this repository, so none of this
    is measured here.

Expected bound:
    Compute: the matrix cores, with exp2 and the rescaling on the vector unit competing
    for issue slots.

Limits:
    As v3. The table proves only what a compiler can: the kept configs compile
    without spilling or scratch and fit the LDS (``tests/test_attention_tuning.py``
    recompiles a sample); at D = 128 the prior's 128 x 64 tile with 8 waves, two
    stages and ``waves_per_eu=2`` compiles on gfx942 with 32x32 MFMAs too, but its hot
    loop then moves operands through LDS two bytes at a time, which is why 16x16 comes
    first, and the table drops it (a config with 8/16-bit LDS ops is dropped where its head
    dim keeps one without, :mod:`.configs`). The table compiles the dense launch of whole tiles only:
    ``kernels.flash_attention_varlen`` runs the same configs packed (``VARLEN``), where
    the priors are compiled and tested too (``tests/test_attention_isa.py``), the other
    configs not. The tuner times with the batch and heads of the first
    shape of a bucket; another shape in the bucket reuses the winner untimed. Head
    dims below a class's BLOCK_D run its configs with BLOCK_D fitted to them
    (fewer registers, not compiled separately). ``overrides`` pins any setting on
    top of :func:`prior` and skips the tuner.
"""
from __future__ import annotations

import torch

from .. import backend as _backend
from .. import plans, validate
from ..registry import rung
from ..triton_support import aot_launch, next_power_of_2
from ..tuning import Problem, as_dict, choice, with_overrides
from . import configs, v3_causal_lse
from .launch import aot_even, aot_ints, head_block, k_rows, p_bits
from .varlen import Packing, aot_args, cu_args
from .spec import DTYPES, MAX_HEAD_DIM

_CHOSEN: dict[tuple, dict] = {}   # (S, S_k buckets, BLOCK_D, dtype, causal, packed) -> the settings of the last launch


def _bucket(s: int, sk: int, d: int, dtype: torch.dtype, causal, packed: bool = False) -> tuple:
    return next_power_of_2(s), next_power_of_2(sk), head_block(d), dtype, bool(causal), packed


_PRUNED: dict[tuple, list[dict]] = {}   # (configs.space, backend, arch, S, S_k, D, dtype) -> _pruned's answer


def _pruned(backend: str, arch: str, s: int, sk: int, d: int, dtype: torch.dtype | None = None) -> list[dict]:
    """The configs worth timing for the shape and dtype, with BLOCK_D fitted to ``d``; worked out
    once per shape: varlen asks for its prior on every call, and a prune of gfx942's space took
    0.4 ms (a busy two-core AMD EPYC, 2026-12-02)."""
    key = (configs.space, backend, arch, s, sk, d, dtype)
    if key not in _PRUNED:
        _PRUNED[key] = [{**as_dict(c), "BLOCK_D": head_block(d)}
                        for c in configs.prune(configs.space(backend, arch, d, dtype), s, sk)]
    return [dict(c) for c in _PRUNED[key]]


def prior(backend: str, arch: str, d: int, s: int = 4096, sk: int = 4096, dtype: torch.dtype | None = None) -> dict:
    """The untimed choice: the pruned space's first config for the shape and dtype (by default a
    4096-token sequence, the launch the ISA inspector compiles)."""
    return _pruned(backend, arch, s, sk, d, dtype)[0]


def _lengths(q, k, packing: Packing | None) -> tuple[int, int, int]:
    """S, S_k and D of a dense launch, or a packed one's longest lengths (which size its grid)."""
    if packing:
        return packing.max_q, packing.max_k, q.shape[-1]
    return q.shape[2], k.shape[2], q.shape[-1]


def tuned(q, k, v, causal: bool, scale: float, packing: Packing | None = None) -> dict:
    """The config for this launch: the fastest pruned candidate of its (S, S_k power-of-two
    buckets, BLOCK_D, dtype, causal, packed or not); a packed batch's bucket is that of its
    longest lengths.

    The first call of a key times every candidate :func:`.configs.prune` keeps with
    v3's launch on these tensors and keeps the winner (:func:`kernels.tuning.choice`:
    for the process and on disk; never timed in frozen mode); a single
    candidate (always, on the interpreter) is taken without timing. A packed batch is
    timed as it runs, with ``packing``: its kernel is the ``VARLEN`` one (its lengths
    read on the device, other registers) and its programs past a sequence's end return
    at once, which a dense stand-in of the longest lengths would not show. A ranker
    (:func:`kernels.tuning.set_ranker`) is asked about the dense launch of the batch's
    longest lengths: the model has no packed launch.
    """
    s, sk, d = _lengths(q, k, packing)
    key = _bucket(s, sk, d, q.dtype, causal, packing is not None)
    here = _backend.current()
    batch = packing.batch if packing else q.shape[0]
    return choice("attention/v4", key, lambda: _pruned(here.name, here.arch, s, sk, d, q.dtype),
                  lambda cfg: v3_causal_lse.launch(q, k, v, causal, scale, cfg, packing=packing),
                  lambda: Problem("attention", "v4", (batch, q.shape[1], k.shape[1], s, sk, d, int(bool(causal))),
                                  q.dtype))


def forward(q, k, v, causal: bool, scale: float, overrides: dict | None = None,
            packing: Packing | None = None):
    """O and the LSE parts (v3's launch) with the tuned config; ``overrides`` pins settings
    on top of the prior and skips the tuner. :func:`chosen_config` then tells what ran.
    With ``packing``, q, k and v are packed sequences (:mod:`.varlen`)."""
    found = _plan(q, k, v, causal, scale, packing, overrides) if overrides else plan(q, k, v, causal, scale, packing)
    return found(q, k, v, *cu_args(packing))


_PLANS = plans.PlanCache()


def plan(q, k, v, causal: bool, scale: float, packing: Packing | None = None) -> v3_causal_lse.LaunchPlan:
    """The kept launch plan of these tensors' metadata, ``causal``, ``scale`` and the packed
    lengths: called with q, k, v (and the packed offsets) it returns O and the LSE parts."""
    if packing is None:
        key = plans.meta(q, k, v, extra=(causal, scale))
    else:
        key = plans.meta(q, k, v, packing.cu_q, packing.cu_k, extra=(causal, scale, packing.max_q, packing.max_k))
    return _PLANS(key, _plan, q, k, v, causal, scale, packing)


def _plan(q, k, v, causal: bool, scale: float, packing: Packing | None = None,
          overrides: dict | None = None) -> v3_causal_lse.LaunchPlan:
    """v3's launch plan with the tuned config (or the prior with ``overrides``), which notes it
    in :data:`_CHOSEN` as its bucket's last launch each time it runs."""
    s, sk, d = _lengths(q, k, packing)
    if overrides:
        here = _backend.current()
        cfg = with_overrides(prior(here.name, here.arch, d, s, sk, q.dtype), overrides)
    else:
        cfg = tuned(q, k, v, causal, scale, packing)
    return v3_causal_lse.LaunchPlan(q, k, v, causal, scale, cfg, packing,
                                    _CHOSEN, _bucket(s, sk, d, q.dtype, causal, packing is not None))


def chosen_config(shape, dtype: torch.dtype, packed: bool = False) -> dict | None:
    """The settings v4 last launched for ``shape`` ((B, Hq, Hkv, S, S_k, D, causal), the
    spec's tuple; S and S_k the longest lengths if ``packed``) in its bucket and ``dtype``
    in this process, or None."""
    s, sk, d, causal = shape[3:]
    return _CHOSEN.get(_bucket(s, sk, d, dtype, causal, packed))


def aot(dtype: torch.dtype, backend: str, arch: str, overrides: dict | None = None) -> list:
    """The prior of each head-dim class (D = 128, then 64) for a causal Llama-3-8B launch;
    ``overrides`` replaces settings of both, and a ``BLOCK_D`` among them compiles that
    head dim only (how ``workbench.isa.tune_space`` compiles each candidate); ``VARLEN: True``
    among them compiles the packed launch ``kernels.flash_attention_varlen`` runs."""
    settings = {name: value for name, value in (overrides or {}).items() if name != "VARLEN"}
    dims = [settings["BLOCK_D"]] if "BLOCK_D" in settings else sorted(configs.HEAD_DIMS, reverse=True)
    flags, pointers = aot_args(overrides)
    return [aot_launch(v3_causal_lse._flash_fwd_lse_kernel, dtype, cfg, ints,
                       constexprs={"CAUSAL": True, "INTERP_BF16": False, "SCALE_SIGN": 1, **flags,
                                   "P_BITS": p_bits(dtype, backend, arch), "K_ROWS": k_rows(backend, arch),
                                   **aot_even(ints, cfg, flags)},
                       pointers={"lse_ptr": "*fp32", **pointers})
            for d in dims for cfg, ints in [(with_overrides(prior(backend, arch, d, dtype=dtype), settings),
                                             aot_ints(d=d))]]


@rung(op="attention", rung=4, name="amd_tuned", backends=("hip", "cuda", "interpreter"),
      dtypes=DTYPES, interpreter=True, kind="triton", aot=aot)
def attention_v4(q, k, v, causal=False, scale=None, *, overrides: dict | None = None):
    """``overrides`` pins settings (``BLOCK_N``, ``num_warps``, ...) and skips the tuner."""
    scale = validate.attention_operands(q, k, v, scale, DTYPES, MAX_HEAD_DIM)
    return forward(q, k, v, causal, scale, overrides)[0]
