"""Attention ladder exercises: the textbook softmax, fusion, the online softmax, causal
block skipping with the log-sum-exp, the tuned tiles (a question), and the backward.

A wrong answer here is the solution with one mistake in it (:func:`_mistake`), so it
stays a faithful near-miss when the rung's code changes, and the test fails loudly if
the line it breaks is gone.
"""
from __future__ import annotations

import math

import torch

import kernels
from kernels.outputs import poisoned_outputs

from .. import source
from ..grading import harness_verdict
from ..model import AnswerExercise, KernelExercise, Verdict

V0, V1, V2, V3, V5 = (f"kernels.attention.{m}" for m in (
    "v0_composed", "v1_fused_rows", "v2_flash_forward", "v3_causal_lse", "v5_backward"))

# (B, Hq, Hkv, S, S_k, D, causal): two query blocks and two or three key tiles of the
# interpreter's 32 x 32 tiles, GQA and MHA, causal and not; fp32 only (no idea here is a dtype).
CAUSAL_GQA = (1, 2, 1, 33, 40, 16, 1)
FULL_MHA = (1, 2, 2, 17, 70, 16, 0)


def _mistake(module: str, block: str, old: str, new: str) -> dict[str, str]:
    """The solution's ``block`` with one mistake: ``old`` (which must be there) becomes ``new``."""
    return source.variant(module, block, (old, new))


def _reference_lse(q, k, causal: bool, scale: float) -> torch.Tensor:
    """Each query row's natural log-sum-exp of its scaled, masked scores, in float64."""
    q, k = q.cpu().double(), k.cpu().double().repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    scores = (q @ k.transpose(-1, -2)) * scale
    if causal:
        visible = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).tril()
        scores = scores.masked_fill(~visible, float("-inf"))
    return torch.logsumexp(scores, dim=-1)


def _long_keys(module) -> tuple:
    """A causal shape for v3's own checks: two query blocks of the learner's BLOCK_M, and
    S_k well past S, so keys from 2·BLOCK_M on are hidden from every row."""
    block_m = module.config(kernels.backend.current().name, 16)["BLOCK_M"]
    return (1, 2, 1, block_m + 1, 2 * block_m + 6, 16, 1)


def _skips_hidden_keys(module, entry) -> Verdict | None:
    """None if the causal loop never loads the keys past its query block; else why it fails.

    Keys that no row of any query block can see are set to NaN: a kernel that still loads
    and multiplies them gets 0 · NaN = NaN in its output, though the mask zeroes their weight."""
    shape = _long_keys(module)
    block_m, sk = shape[3] - 1, shape[4]
    reach = 2 * block_m                     # the second (last) query block's loop stops before this key
    q, k, v, causal = kernels.spec("attention").make_inputs(shape, torch.float32, kernels.backend.current().device)
    k[:, :, reach:] = float("nan")
    v[:, :, reach:] = float("nan")
    out = entry(q, k, v, causal)
    if torch.isfinite(out).all():
        return None
    return Verdict(False, f"correct, but at shape {shape} (causal, {block_m}-row query blocks) "
                          f"keys {reach}..{sk - 1}, past the last row of every query block, were set to NaN "
                          f"and the NaN reached the output: the key loop still loads and multiplies tiles "
                          f"that lie wholly past its query block's last row")


def _lse_matches(module) -> Verdict | None:
    """None if ``launch`` writes the two-part log-sum-exp the backward reads; else why not."""
    here = kernels.backend.current()
    shape = _long_keys(module)
    q, k, v, causal = kernels.spec("attention").make_inputs(shape, torch.float32, here.device, seed=1)
    scale = 1.0 / math.sqrt(shape[5])
    with poisoned_outputs():       # a row the kernel never writes stays NaN
        _, lse = module.launch(q, k, v, causal, scale, module.config(here.name, shape[5]))
    got = lse[:, :, 0].cpu().double() * scale + lse[:, :, 1].cpu().double() * math.log(2.0)
    expected = _reference_lse(q, k, causal, scale)
    bad = ~torch.isclose(got, expected, rtol=1e-5, atol=1e-5)
    if not bad.any():
        return None
    where = tuple(int(i) for i in bad.nonzero()[0])
    m, log2_l = (lse[where[0], where[1], part, where[2]].item() for part in (0, 1))
    return Verdict(False, f"the output is right, but the log-sum-exp is not: at (b, h, row) {where} "
                          f"the buffer holds m = {m:.6g}, log2 l = {log2_l:.6g}, so m·scale + ln l = "
                          f"{got[where].item():.6g}, where the row's log-sum-exp is {expected[where].item():.6g} "
                          f"({int(bad.sum())} of {bad.numel()} rows off)")


def _grade_v3(module, captured) -> Verdict:
    """The harness, then the two things it cannot see: skipped tiles and the saved LSE."""
    verdict = harness_verdict(_exercise("attention/v3"), captured)
    if not verdict.passed:
        return verdict
    entry = next(r for r in captured if r.op == "attention" and r.label == "v3")
    try:
        failed = _skips_hidden_keys(module, entry) or _lse_matches(module)
    except Exception as error:  # e.g. launch() or config() edited away: say so, do not crash
        failed = Verdict(False, f"correct, but the LSE and skipping checks could not run "
                                f"(keep config() and launch() as they were): {type(error).__name__}: {error}")
    if failed:
        return Verdict(False, failed.message, verdict.reports, verdict.speed, verdict.predict)
    return Verdict(True, f"{verdict.message}; hidden key tiles skipped; log-sum-exp saved",
                   verdict.reports, verdict.speed, verdict.predict)


def _rung(label: str, module: str, **fields) -> KernelExercise:
    """A rung's exercise, graded by the harness on the two tiny fp32 shapes above."""
    return KernelExercise(key=f"attention/{label}", module=module, op="attention", rung=label,
                          shapes=(CAUSAL_GQA, FULL_MHA), dtypes=(torch.float32,), **fields)


def _exercise(key: str) -> KernelExercise:
    return next(e for e in EXERCISES if e.key == key)


def _wide_mfma_narrow_lds() -> int:
    """8- and 16-bit LDS accesses of v4's D = 128 prior on gfx942 with 32x32 MFMAs instead of 16x16."""
    from ....isa import inspect
    return inspect("attention", "v4", "gfx942", torch.bfloat16,
                   overrides={"BLOCK_D": 128, "matrix_instr_nonkdim": 32}).narrow_lds_ops


EXERCISES = (
    _rung(
        "v0", V0,
        title="The row softmax: scale, causal mask, no overflow",
        task="v0 computes attention as the textbook does: S = Q Kᵀ into HBM, a softmax per row, then "
             "P V. Write the row softmax of one program: lanes cols past S_k and, with CAUSAL, the "
             "keys after this query (top-left aligned: query i sees keys 0..i) must get weight 0; the "
             "scores are multiplied by scale; and the exponentials must not overflow.",
        todo={"softmax": "# TODO: scale, mask (padding and CAUSAL), a softmax that cannot overflow.\n"
                         "# As shipped: the raw scores.\n"
                         "p = tl.load(s_ptr + row * SK + cols, mask=cols < SK, other=0.0)"},
        hints=(
            "Scale the loaded scores, then set the masked lanes to -inf with tl.where: their exp is then "
            "exactly 0 (loading -inf and scaling after would give NaN at scale 0). "
            "softmax(x) = softmax(x - max x), and the max keeps every exponent <= 0.",
            "row runs over B·Hq·S rows, so this row's query index is row % S; with CAUSAL a lane is "
            "visible when cols <= row % S (and always needs cols < SK).",
            "x = tl.where(visible, tl.load(..., mask=visible, other=0.0) * scale, float('-inf')); "
            "e = tl.exp(x - tl.max(x, 0)); p = e / tl.sum(e, 0).",
        ),
        wrong={
            "causal mask off by one (k < q)": _mistake(V0, "softmax", "cols <= row % S", "cols < row % S"),
            "causal mask on the flat row index": _mistake(V0, "softmax", "cols <= row % S", "cols <= row"),
            "masked lanes 0, not -inf": _mistake(V0, "softmax", 'x, float("-inf")', "x, 0.0"),
            "scale forgotten": _mistake(V0, "softmax", ") * scale", ")"),
        },
    ),
    _rung(
        "v1", V1,
        title="Fuse QKᵀ, softmax and PV in one program",
        task="v1 fuses v0's three launches: one program holds BLOCK_M query rows (q), the head's whole "
             "Kᵀ (kt, BLOCK_D x BLOCK_SK) and V in registers. Compute the score block with one tl.dot, "
             "scale it, hide the padded key columns (and with CAUSAL the keys after each query row), and "
             "take the exact row softmax p; the code after your block multiplies p by V. Nothing but O "
             "is written to memory.",
        todo={"fused": "# TODO: the scores q·kt times scale, masked, and their row softmax.\n"
                       "# As shipped: equal weight on every key column, padding included.\n"
                       "p = tl.full((BLOCK_M, BLOCK_SK), 1.0 / BLOCK_SK, dtype=tl.float32)"},
        hints=(
            "s = tl.dot(q, kt, input_precision='ieee') * scale is the whole BLOCK_M x BLOCK_SK block; "
            "the mask is v0's, now two-dimensional: rows[:, None] against cols[None, :].",
            "Column j is visible when cols[j] < SK, and with CAUSAL also cols[j] <= rows[i]; hidden "
            "scores become -inf with tl.where before the max.",
            "s = tl.where(visible, s, float('-inf')); e = tl.exp(s - tl.max(s, 1)[:, None]); "
            "p = e / tl.sum(e, 1)[:, None].",
        ),
        wrong={
            "scale 1/D instead of 1/sqrt(D)": _mistake(V1, "fused", ") * scale", ") / D"),
            "padding mask on the query rows": _mistake(V1, "fused", "visible = cols[None, :] < SK",
                                                        "visible = rows[:, None] < S"),
            "causal triangle the wrong way (k >= q)": _mistake(V1, "fused", "cols[None, :] <= rows[:, None]",
                                                               "cols[None, :] >= rows[:, None]"),
        },
    ),
    _rung(
        "v2", V2,
        title="The online softmax: a running max and sum, and the rescale",
        task="v2 streams K and V past a resident Q block BLOCK_N keys at a time, so no row is ever "
             "whole. Keep per row the running max m_i and the running sum l_i of exponentials of the "
             "tiles seen so far; when a tile raises the max, scale what acc and l_i hold by "
             "alpha = exp(m_old - m_new) before adding the tile's p. The end of the kernel divides acc "
             "by l_i.",
        todo={"rescale": "# TODO: m_new is the running row max; when it grows, what l_i and acc hold\n"
                         "# was summed against the old one. As shipped: nothing is rescaled.\n"
                         "m_new = tl.maximum(m_i, tl.max(s, 1))\n"
                         "alpha = tl.full((BLOCK_M,), 1.0, dtype=tl.float32)\n"
                         "p = tl.exp(s - m_new[:, None])\n"
                         "l_i = l_i + tl.sum(p, 1)",
              "accumulate": "acc = tl.dot(p.to(v.dtype), v, acc, input_precision=\"ieee\")  # TODO: rescale\n"
                            "m_i = m_new"},
        hints=(
            "Notebook 02's 'online softmax' cell does it for one row in plain Python: after each block, "
            "m, l and acc all refer to the same running max.",
            "m_new = max(m_i, this tile's row max); both l_i and acc were summed against m_i, so both are "
            "multiplied by alpha = exp(m_i - m_new) (0 on the first tile, where m_i is -inf).",
            "alpha = tl.exp(m_i - m_new); p = tl.exp(s - m_new[:, None]); l_i = l_i * alpha + tl.sum(p, 1); "
            "acc = tl.dot(p, v, acc * alpha[:, None]); then m_i = m_new.",
        ),
        wrong={
            "accumulator not rescaled": _mistake(V2, "accumulate", "acc * alpha[:, None]", "acc"),
            "row sum not rescaled": _mistake(V2, "rescale", "l_i * alpha +", "l_i +"),
            "correction inverted, exp(m_new - m_old)": _mistake(V2, "rescale", "tl.exp(m_i - m_new)",
                                                                "tl.exp(m_new - m_i)"),
        },
    ),
    _rung(
        "v3", V3,
        title="Skip the key tiles the causal mask hides, and keep the log-sum-exp",
        task="Two of v3's changes to v2 (exp2 is already done). (1) With CAUSAL a query block of rows "
             "pid_m·BLOCK_M .. (pid_m+1)·BLOCK_M - 1 sees no key past its last row: set the loop bound "
             "hi so those tiles are never loaded. (2) After the loop, store the row's log-sum-exp for the "
             "backward in two fp32 parts: the running max m_i (of sign·S) at lse_ptr + bh·2·T + rows, and "
             "log2(l_i) T elements further (rows < S only).",
        todo={"skip": "hi = SK   # TODO: with CAUSAL, stop after the last key a row of this block can see",
              "lse": "# TODO: the log-sum-exp, in two parts: m_i, then log2(l_i), T elements apart."},
        hints=(
            "The harness cannot see either change: O is right without them. The grade also runs a causal "
            "case whose hidden keys are NaN, and compares m·|scale| + ln l with the float64 log-sum-exp.",
            "The last row of block pid_m is (pid_m + 1)·BLOCK_M - 1, so hi = (pid_m + 1)·BLOCK_M (at most "
            "SK); the diagonal tile must stay. The backward rebuilds P = exp2((sign·S - m)·|scale|·log2 e "
            "- log2 l).",
            "if CAUSAL: hi = tl.minimum(SK, (pid_m + 1) * BLOCK_M). lse_row = lse_ptr + bh.to(tl.int64) * 2 * T "
            "+ rows; tl.store(lse_row, m_i, mask=rows < S); tl.store(lse_row + T, tl.log2(l_i), mask=rows < S).",
        ),
        wrong={
            "the diagonal tile skipped": _mistake(V3, "skip", "(pid_m + 1) * BLOCK_M", "pid_m * BLOCK_M"),
            "natural log of the sum": _mistake(V3, "lse", "tl.log2(l_i)", "tl.log(l_i)"),
            "max stored in base-2 units": _mistake(V3, "lse", "tl.store(lse_row, m_i,",
                                                   "tl.store(lse_row, m_i * qk_scale,"),
        },
        grade=_grade_v3,
    ),
    AnswerExercise(
        key="attention/v4", title="Why v4's D = 128 prior takes 16x16 MFMAs on gfx942",
        question="v4 runs v3's kernel with a config from a table compiled ahead of time per target; "
                 "configs that spill registers are dropped. Take v4's D = 128 launch for gfx942 in bf16 "
                 "(its prior: kernels.attention.v4_amd_tuned.prior('hip', 'gfx942', 128): a 128 x 64 tile, "
                 "8 waves, 16x16 MFMAs) and change only the MFMA shape, to 32x32 "
                 "(matrix_instr_nonkdim=32). It compiles without spilling, at two waves per SIMD as the "
                 "prior; how many 8- or 16-bit LDS reads and writes does the kernel then hold "
                 "(the prior holds none)?",
        answer=_wide_mfma_narrow_lds,
        hints=(
            "workbench.isa.inspect compiles a rung for a target without its GPU, and v4's compile takes "
            "overrides on top of the prior.",
            "Pass overrides={'BLOCK_D': 128, 'matrix_instr_nonkdim': 32} (BLOCK_D picks the head-dim class) "
            "and read the report's narrow_lds_ops (the whole kernel's; the hot loop holds part of them); "
            "compare with the prior's report.",
            "isa.inspect('attention', 'v4', 'gfx942', torch.bfloat16, "
            "overrides={'BLOCK_D': 128, 'matrix_instr_nonkdim': 32}).narrow_lds_ops",
        ),
        wrong=(0,),
        explain="Each of the 8 waves owns 16 of the tile's 128 rows; with 32x32 MFMAs the operands reach "
                "their layout through LDS two bytes at a time (ds_write_b16, ds_read_u16: many more LDS "
                "instructions for the same bytes), with 16x16 ones they need none. The table keeps both "
                "(neither spills); what the narrow traffic costs only a GPU's clock can tell, and v4's "
                "tuner times both MFMA shapes there.",
    ),
    _rung(
        "v5", V5,
        title="The backward: Δ, then dK/dV and dQ from the recomputed P",
        task="The forward saved O and the log-sum-exp (the max m of sign·S, log2 l). Write the three parts of "
             "FlashAttention-2's backward: Δ = rowsum(dO ∘ O) per query row; in the dK/dV kernel, "
             "which holds its tiles with the keys as rows, recompute this tile's Pᵀ from the scores "
             "st = sign·Sᵀ (masked as the forward on the diagonal blocks, CAUSAL_MASK), dPᵀ = V dOᵀ, "
             "dSᵀ = Pᵀ ∘ (dPᵀ - Δ), then dv += Pᵀ dO and dk += dSᵀ Q; in the dQ kernel P and dS "
             "(query rows first; masked in the blocks with MASK), and dq += dS K. The scale is applied to "
             "dk and dq after the loops.",
        todo={"delta": "delta = tl.zeros((BLOCK_M,), dtype=tl.float32)   # TODO: Δ = rowsum(dO ∘ O), fp32",
              "dkdv": "# TODO: P (masked) from s, m, log2_l; dP; dS; accumulate dv and dk.\n"
                      "# As shipped: dK and dV stay 0.\n"
                      "pass",
              "dq": "# TODO: P (masked) from s, m, log2_l; dP; dS; accumulate dq.\n"
                    "# As shipped: dQ stays 0.\n"
                    "pass"},
        hints=(
            "P = exp2((sign·S - m)·|scale|·log2 e - log2 l) is exact (qk_scale is |scale|·log2 e), so nothing of "
            "the forward but O and the LSE is needed; hidden pairs (and in dQ padded keys) get P = 0 via tl.where.",
            "dS = P ∘ (dP - Δ): Δ_i = Σ_j P_ij dP_ij, which equals Σ_d dO_id O_id, the cheap way. The dK/dV "
            "kernel's tiles are transposed (keys, query rows), so Pᵀ and dSᵀ are the left operands of its "
            "products as they are: dpt = tl.dot(v, tl.trans(do)), dv = tl.dot(pt, do, dv).",
            "pt = tl.exp2((st - m[None, :]) * qk_scale - log2_l[None, :]), then on a diagonal block "
            "pt = tl.where(cols[:, None] <= rows[None, :], pt, 0.0); dst = pt * (dpt - delta[None, :]); "
            "dk = tl.dot(dst, tl.trans(qt), dk); in dQ: p = tl.exp2((s - m[:, None]) * qk_scale - "
            "log2_l[:, None]), masked with tl.where where MASK, dscore = p * (dp - delta[:, None]), "
            "dq = tl.dot(dscore, tl.trans(kt), dq).",
        ),
        wrong={
            "Δ without O": _mistake(V5, "delta", "o.to(tl.float32) * do.to(tl.float32)", "do.to(tl.float32)"),
            "dS without subtracting Δ": _mistake(V5, "dkdv", "pt * (dpt - delta[None, :])", "pt * dpt"),
            "P recomputed with exp, not exp2": _mistake(V5, "dq", "tl.exp2((s - m[:, None]) * qk_scale",
                                                        "tl.exp((s - m[:, None]) * scale"),
            "causal mask off by one in dQ (k < q)": _mistake(V5, "dq", "cols[None, :] <= rows[:, None]",
                                                             "cols[None, :] < rows[:, None]"),
        },
    ),
)
