"""v4 persistent: one program per CU walks every group's tiles, with tiles tuned per target and shape.

Idea:
    v2 launches an upper-bound grid, (cdiv(T, BLOCK_M) + G) x cdiv(N, BLOCK_N)
    programs; each reads all G offsets, scans them to find its one tile, and up to
    G programs per column of tiles find none and exit. v4 launches one program per
    CU (304 on MI300X, 256 on MI355X, the SMs on NVIDIA; 4 on the interpreter so
    that the loop over tiles runs on a CPU), as GEMM v6 does. Each program reads the
    offsets once (:func:`.schedule.group_tiles`: every group's row tiles and their
    running sum) and then walks the work list, unit ``u`` = (row tile u //
    tiles_n, column tile u % tiles_n), taking every NUM_PROGS-th unit and locating
    its group from the schedule it already holds (:func:`.schedule.locate`). The
    count of units is known on the device only, so nothing is read on the host and
    no program is surplus.

    Order: row tiles come in group order and each row tile's column tiles are
    consecutive, so the units running at one moment belong to one or two groups:
    w[g] is read while it is hot in the L2 / Infinity Cache and never again once
    its group is done. The program ids get GEMM v3's XCD remap (over the persistent
    ids, as GEMM v6), so each XCD's programs take consecutive units: one x row tile
    and neighbouring column panels of w[g] share that XCD's L2. The tile product is
    the shared loop of :mod:`.tiles` (MFMA, two pipeline stages, peeled ragged step), with
    64-bit offsets; fp32, fp16 and bf16.

    Tuned: BLOCK_M/N/K, warps, stages and the AMD knobs come from :mod:`.configs`,
    whose candidates were compiled ahead of time for gfx942, gfx950 and sm90 (the
    forward, the dX launch and the dW kernel each) and dropped if any spills
    (``tuned_space.json``, by ``python -m workbench.isa.tune_space --op grouped_gemm``).
    :func:`choose` times the survivors that fit the problem (at most 8) on the first
    call of each (kernel, T, K, N, G power-of-two buckets, dtype, operand layout)
    with :func:`kernels.tuning.fastest` and keeps the fastest (:func:`kernels.tuning.choice`:
    for the process and on disk; never timed in frozen mode); on
    the interpreter the space has one config, so nothing is timed. What ran is
    visible: :func:`chosen_config`. ``overrides`` pins settings and skips the tuner.

    Backward: dx is this kernel again on wᵀ (a stride view; its own tuner key, since
    the layout differs). dW is *not* made persistent: it reuses the dW kernel of
    :mod:`.dw` with tuned tiles. Its tile count G·cdiv(K, BLOCK_M)·cdiv(N, BLOCK_N)
    is known on the host without the offsets, so its grid is already exact (no
    surplus programs to remove), and its tiles' work varies with each group's row
    count: the hardware dispatcher hands the next tile to whichever CU frees up,
    which balances a skewed routing, where a persistent program's static round robin
    would leave one program all of a hot group's tiles unless a device-side work
    queue (atomics) were added.

Why faster:
    No surplus programs and no per-tile scan of the offsets: DeepSeek-V3's down
    projection (32 groups, N = 7168 in 128-wide tiles) gives v2 32 x 56 = 1792
    programs that load 32 offsets and exit, 11 % of its 16128, and each of the
    other 14336 scans the offsets again; v4's 304 programs scan them once each.
    Launch and prologue are paid once per CU, not per tile, and the group-ordered
    walk keeps each w[g] hot while it is used. The tuned tile fits the problem:
    small N or few rows per group get a smaller tile instead of v2's fixed 128 x 128
    (reasoning and model, not measurements; no GPU timing exists in this repository).

Expected bound:
    As v2: compute (matrix-core peak) at many rows per group; memory (every group's
    weights read once, ``bytes_moved`` / HBM bandwidth) at few rows per group (model).

Limits:
    The last round of units (units mod CUs) runs partly empty: there is no stream-K
    split of a group's tiles along K (GEMM v6's fix-up would need a workspace per
    group tile). The work per unit is static round robin, so a skewed routing
    balances only as far as the units do. The tuner sees T and G, not the offsets:
    the routing of the first call of a bucket decides for all, and the tile is
    pruned by the *average* rows per group. On a GPU that first call times the
    candidates (host syncs), so it must not be the one captured in a graph. G must
    fit one BLOCK_G vector, as v2.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ... import backend as _backend
from ... import plans, validate
from ...gemm.v6_persistent import programs
from ...outputs import new_output
from ...registry import AotKernel, rung
from ...triton_support import aot_launch, cdiv, interp_bf16, next_power_of_2, round_to_bf16, run_args
from ...tuning import Problem, as_dict, choice, with_overrides
from ...xcd import CUS_PER_XCD, full_chip_xcds, num_xcds
from . import configs, dw
from .grads import differentiable
from .launch import AOT_SHAPE, forward_ints
from .schedule import group_tiles, locate
from .spec import DTYPES
from .tiles import reduce_tiles


@triton.jit
def _grouped_gemm_persistent_kernel(x_ptr, w_ptr, out_ptr, offsets_ptr, T, N, K, G,
                                    stride_xt, stride_xk, stride_wg, stride_wk, stride_wn,
                                    stride_ot, stride_on,
                                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                                    BLOCK_G: tl.constexpr, NUM_XCDS: tl.constexpr,
                                    NUM_PROGS: tl.constexpr, INTERP_BF16: tl.constexpr):
    pid = tl.program_id(0)
    if NUM_XCDS > 1:  # GEMM v3's remap (kernels.gemm.v3_grouped_order.xcd_remap), persistent ids
        per = tl.cdiv(NUM_PROGS, NUM_XCDS)
        tall = NUM_PROGS - (per - 1) * NUM_XCDS
        xcd = pid % NUM_XCDS
        pid = xcd * per - tl.maximum(xcd - tall, 0) + pid // NUM_XCDS
    starts, ends, tiles, cum = group_tiles(offsets_ptr, G, T, BLOCK_M, BLOCK_G)   # once per program
    tiles_n = tl.cdiv(N, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    x_step = tl.cast(stride_xk, tl.int64) * BLOCK_K
    w_step = tl.cast(stride_wk, tl.int64) * BLOCK_K
    # exercise begin: walk
    for unit in range(pid, tl.sum(tiles, 0) * tiles_n, NUM_PROGS):
        group, start, end = locate(unit // tiles_n, starts, ends, tiles, cum, BLOCK_M, BLOCK_G)
        rows = start + tl.arange(0, BLOCK_M)
        cols = (unit % tiles_n) * BLOCK_N + tl.arange(0, BLOCK_N)
    # exercise end
        # int64 offsets: an operand of 2^31+ elements would wrap in i32.
        x_ptrs = x_ptr + rows.to(tl.int64)[:, None] * stride_xt + ks.to(tl.int64)[None, :] * stride_xk
        w_ptrs = (w_ptr + group.to(tl.int64) * stride_wg + ks.to(tl.int64)[:, None] * stride_wk
                  + cols.to(tl.int64)[None, :] * stride_wn)
        acc = reduce_tiles(x_ptrs, w_ptrs, x_step, w_step, rows[:, None] < end, cols[None, :] < N,
                           K, BLOCK_M, BLOCK_N, BLOCK_K, INTERP_BF16)
        if INTERP_BF16:
            acc = round_to_bf16(acc)
        out_ptrs = (out_ptr + rows.to(tl.int64)[:, None] * stride_ot
                    + cols.to(tl.int64)[None, :] * stride_on)
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty),
                 mask=(rows[:, None] < end) & (cols[None, :] < N))


PERSISTENT = ("NUM_XCDS", "NUM_PROGS")   # settings of the forward that are not part of a tile config


def _launch(kernel: str, a: torch.Tensor, b: torch.Tensor, offsets: torch.Tensor,
            out: torch.Tensor, cfg: dict) -> None:
    """One launch into ``out`` with settings ``cfg``: "forward" (out = a · b[g] per group, also
    dx with b = wᵀ) on the persistent kernel, or "dw" (out[g] = a_gᵀ · b_g) on :mod:`.dw`'s."""
    if kernel == "dw":
        dw.launch(a, b, offsets, out, cfg)
        return
    LaunchPlan(a, b, cfg).launch(a, b, offsets, out)


def _bucket(kernel: str, t: int, k: int, n: int, g: int, dtype: torch.dtype) -> tuple:
    return kernel, next_power_of_2(t), next_power_of_2(k), next_power_of_2(n), next_power_of_2(g), dtype


def _layout(a: torch.Tensor, b: torch.Tensor) -> str:
    """"N" per operand whose last dim is contiguous (x's K, w's N / dy's N), "T" otherwise."""
    return ("N" if a.stride(-1) == 1 else "T") + ("N" if b.stride(-1) == 1 else "T")


def _tile_extent(kernel: str, t: int, k: int, n: int, g: int) -> tuple[int, int]:
    """What the output tiles cover: the average rows of a group x N; K x N for dW."""
    return (k, n) if kernel == "dw" else (cdiv(t, max(g, 1)), n)


def _problem(kernel: str, operands: str, problem: tuple[int, int, int, int], dtype: torch.dtype) -> Problem:
    """What a ranker is asked: the launch's (T, K, N, G) with balanced routing, the rows per
    group the tuner's prune assumes (it sees T and G, not the offsets); the forward kernel on
    a transposed weight ("NT") is the backward's dX launch."""
    launch = "dx" if kernel == "forward" and operands[1] == "T" else kernel
    return Problem("grouped_gemm", "v4", (*problem, 0), dtype, launch)


def prior(kernel: str, backend: str, arch: str, t: int, k: int, n: int, g: int,
          dtype: torch.dtype | None = None) -> dict:
    """The untimed choice: the pruned space's first config for the problem and dtype."""
    return as_dict(configs.prune(configs.space(backend, arch, dtype), *_tile_extent(kernel, t, k, n, g))[0])


_CHOSEN: dict[tuple, dict] = {}   # (kernel, T, K, N, G buckets, dtype) -> the settings of the last launch


def choose(kernel: str, a: torch.Tensor, b: torch.Tensor, offsets: torch.Tensor, out: torch.Tensor,
           problem: tuple[int, int, int, int], overrides: dict | None) -> dict:
    """The settings of this launch: ``overrides`` on the prior when a tile setting is pinned,
    else the fastest pruned candidate of its key, timed (into ``out``) on the key's first call.

    A single candidate (always, on the interpreter) is taken untimed.
    """
    here = _backend.current()
    persistent = {} if kernel == "dw" else {"NUM_XCDS": num_xcds(here), "NUM_PROGS": programs(here)}
    pinned = {name: v for name, v in (overrides or {}).items() if name in persistent or name not in PERSISTENT}
    operands, bucket = _layout(a, b), _bucket(kernel, *problem, a.dtype)
    if set(pinned) - set(PERSISTENT):   # a tile setting pinned: on the prior, untimed
        cfg = with_overrides({**prior(kernel, here.name, here.arch, *problem, a.dtype), **persistent}, pinned)
    else:   # the tuner's choice; the prior (a prune of the space) is not needed
        fixed = with_overrides(persistent, pinned)
        key = (*bucket, operands)
        tile = choice("grouped_gemm/v4", key,
                      lambda: [as_dict(c) for c in configs.prune(configs.space(here.name, here.arch, a.dtype),
                                                                 *_tile_extent(kernel, *problem))],
                      lambda tile: _launch(kernel, a, b, offsets, out, {**tile, **fixed}),
                      lambda: _problem(kernel, operands, problem, a.dtype))
        cfg = {**tile, **fixed}
    _CHOSEN[bucket] = {**cfg, "layout": operands}
    return cfg


def grouped_mm(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor,
               overrides: dict | None = None) -> torch.Tensor:
    """out (T, N) for operands already validated: one persistent launch, no host sync."""
    if overrides:
        return _plan(x, w, offsets, overrides)(x, w, offsets)
    return plan(x, w, offsets)(x, w, offsets)


class LaunchPlan:
    """The forward kernel's launch for operands of one metadata, settings ``cfg``: every
    argument but the tensors decided; a call allocates the result and launches."""

    def __init__(self, x: torch.Tensor, w: torch.Tensor, cfg: dict, chosen: tuple = (None, None)):
        (t, k), (groups, _, n) = x.shape, w.shape
        self.shape, self.dtype = (t, n), x.dtype
        self.grid = (cfg["NUM_PROGS"],)
        # the result is new_output's: contiguous, strides (N, 1)
        scalars = (t, n, k, groups, *x.stride(), *w.stride(), n, 1)
        self.args, self.kwargs = run_args(_grouped_gemm_persistent_kernel, 4, scalars, self.grid,
                                          {"BLOCK_G": next_power_of_2(groups), "INTERP_BF16": interp_bf16(x.dtype),
                                           **cfg})
        self.bucket, self.chosen = chosen

    def launch(self, x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor, out: torch.Tensor) -> None:
        """The launch into ``out`` (contiguous, as :func:`new_output` makes it)."""
        _grouped_gemm_persistent_kernel.run(x, w, out, offsets, *self.args, **self.kwargs)

    def __call__(self, x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        out = new_output(self.shape, self.dtype, x.device)
        self.launch(x, w, offsets, out)
        _CHOSEN[self.bucket] = self.chosen
        return out


_PLANS = plans.PlanCache()


def _plan(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor, overrides: dict | None = None) -> LaunchPlan:
    """The forward's decisions for operands already validated (tuning a new key)."""
    (t, k), (groups, _, n) = x.shape, w.shape
    out = new_output((t, n), x.dtype, x.device)   # what the tuner times into
    cfg = choose("forward", x, w, offsets, out, (t, k, n, groups), overrides)
    bucket = _bucket("forward", t, k, n, groups, x.dtype)
    return LaunchPlan(x, w, cfg, (bucket, _CHOSEN[bucket]))


def plan(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> LaunchPlan:
    """The kept forward launch plan of validated operands' metadata: what an eager call that
    needs no gradient runs (a public op keeps it in its own plan)."""
    return _PLANS(plans.meta(x, w, offsets), _plan, x, w, offsets)


def grouped_dw(x: torch.Tensor, dy: torch.Tensor, offsets: torch.Tensor, groups: int,
               overrides: dict | None = None, dtype: torch.dtype | None = None) -> torch.Tensor:
    """dw (groups, K, N) = x_gᵀ · dy_g per group, on :mod:`.dw`'s kernel with tuned tiles, stored
    in ``dtype`` (x's if None: an fp32 master weight's gradient takes the fp32 sum unrounded)."""
    (t, k), n = x.shape, dy.shape[1]
    out = new_output((groups, k, n), dtype or x.dtype, x.device)
    cfg = choose("dw", x, dy, offsets, out, (t, k, n, groups), overrides)
    _launch("dw", x, dy, offsets, out, cfg)
    return out


def chosen_config(shape, dtype: torch.dtype, kernel: str = "forward") -> dict | None:
    """The settings v4 last launched in this process for the bucket of ``shape`` (the spec's
    (T, K, N, G, routing)) and ``dtype``, or None: tiles, warps, stages, AMD knobs, the
    operand layout and, for "forward" and "dx" (the forward kernel on wᵀ: K and N
    swap), NUM_XCDS and NUM_PROGS; "dw" for the weight gradient."""
    t, k, n, g, _ = shape
    if kernel == "dx":
        return _CHOSEN.get(_bucket("forward", t, n, k, g, dtype))
    return _CHOSEN.get(_bucket(kernel, t, k, n, g, dtype))


_differentiable = differentiable(grouped_mm, grouped_dw)


def aot(dtype: torch.dtype, backend: str, arch: str, overrides: dict | None = None) -> list[AotKernel]:
    """The forward, the backward's dX (wᵀ) and dW launches of :data:`.launch.AOT_SHAPE` with
    their priors, on the whole chip (304 programs on gfx942, 256 on gfx950, 132 on sm90).

    ``overrides`` replaces settings of all three (``NUM_XCDS``/``NUM_PROGS`` the forward's
    only); ``{"kernel": "dw"}`` among them compiles that one alone (how
    ``workbench.isa.tune_space`` compiles each candidate three times); ``fp32_dw`` True compiles
    dW storing an fp32 dw (an fp32 master expert weight's gradient under autocast).
    """
    settings = dict(overrides or {})
    only = settings.pop("kernel", None)
    fp32_dw = settings.pop("fp32_dw", False)
    t, k, n, g, _ = AOT_SHAPE
    units = CUS_PER_XCD.get(arch, 0) * full_chip_xcds(backend, arch) if backend == "hip" else 132
    forward = with_overrides({**prior("forward", backend, arch, t, k, n, g, dtype),
                              "NUM_XCDS": full_chip_xcds(backend, arch), "NUM_PROGS": units}, settings)
    weight = with_overrides(prior("dw", backend, arch, t, k, n, g, dtype),
                            {name: v for name, v in settings.items() if name not in PERSISTENT})
    fixed = {"INTERP_BF16": False, "BLOCK_G": triton.next_power_of_2(g)}
    i32 = {"offsets_ptr": "*i32"}
    launches = {
        "forward": lambda: aot_launch(_grouped_gemm_persistent_kernel, dtype, forward, forward_ints(), fixed, i32),
        "dx": lambda: aot_launch(_grouped_gemm_persistent_kernel, dtype, forward,
                                 forward_ints(transposed_w=True), fixed, i32),
        "dw": lambda: dw.aot(dtype, backend, arch, weight, fp32_dw),
    }
    if only is not None and only not in launches:
        raise ValueError(f"kernel must be one of {list(launches)}, got {only!r}")
    return [launches[name]() for name in ([only] if only else launches)]


@rung(op="grouped_gemm", rung=4, name="persistent", backends=("hip", "cuda", "interpreter"),
      dtypes=DTYPES, interpreter=True, kind="triton", aot=aot, backward=True, plan=plan)
def grouped_gemm_v4(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor, *,
                    check_offsets: bool = True, overrides: dict | None = None) -> torch.Tensor:
    """``check_offsets=False`` skips the host read that validates the offsets' values;
    ``overrides`` pins settings of the forward, dx and dw launches (a tile setting such as
    ``BLOCK_M`` skips the tuner; ``NUM_XCDS`` / ``NUM_PROGS`` only change the forward's)."""
    offsets = validate.grouped_gemm_operands(x, w, offsets, DTYPES, check_values=check_offsets)
    if overrides:
        return differentiable(functools.partial(grouped_mm, overrides=overrides),
                              functools.partial(grouped_dw, overrides=overrides))(x, w, offsets)
    return _differentiable(x, w, offsets)
