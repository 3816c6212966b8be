"""FP8 accuracy per recipe and per GEMM, on tensors shaped like a training step's.

What a recipe costs in accuracy depends on the tensors it meets, so the operands here
have the features real ones have (Dettmers et al. 2022, "LLM.int8()", for outlier
feature channels in activations; heavy-tailed, small gradients):

* activations x: normal, with a few feature channels 50x larger;
* weights w: normal, std 0.02, with a few large entries;
* output gradients dy: Student-t (3 degrees of freedom), of size 1e-5: a heavy tail
  far below 1, as the loss's gradient is after a long backward.

For each recipe and GEMM (forward, dgrad, wgrad), :func:`gemm_error_rows` gives the
relative error (Frobenius norm) of the recipe's FP8 GEMM against the float64 GEMM of
the unquantized operands, and for each operand the elements that overflow (saturate at
the format's max) and underflow (a nonzero value that becomes zero), counted in the groups
the recipe scales along the GEMM's reduction dimension (its ``operand_groups``); dy in the
recipe's gradient format (e5m2 for tensorwise and delayed, whose default is "hybrid").
Current scaling with fp32 scales cannot overflow; MXFP8's power-of-two scales can under the
OCP rule (which puts a group's largest element in the format's top binade, past its max),
not under the round-up rule the ``mxfp8`` recipe takes (:mod:`kernels.fp8.recipes.mxfp8`);
delayed scaling is shown with scales (x's, w's and dy's, as :class:`kernels.fp8.Float8Linear`
takes them) from an earlier step whose tensors were :data:`GROWTH` times smaller, so its
overflow is visible. Recipes whose kernels are not
installed get a row saying so.
"""
from __future__ import annotations

import torch

import kernels
from kernels.fp8.recipes.delayed import HISTORY, saturated
from kernels.gemm_fp8 import fp8_dtype, quantize_fp8
from kernels.gemm_fp8.quantize_ref import dequantize, quantize_one

GROWTH = 1.5
GEMMS = {"forward": ("x", "w.T"), "dgrad": ("dy", "w"), "wgrad": ("dy.T", "x")}


def operands(shape=(64, 48, 80), seed: int = 0) -> dict[str, torch.Tensor]:
    """x (M, K), w (N, K), dy (M, N) with the features listed in the module docstring, the same
    for the same ``seed``."""
    m, n, k = shape
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen)
    x[:, torch.randperm(k, generator=gen)[:3]] *= 50.0
    w = torch.randn(n, k, generator=gen) * 0.02
    w.view(-1)[torch.randperm(n * k, generator=gen)[:4]] *= 10.0
    # Student-t with 3 degrees of freedom, Z / sqrt(V / 3) with V chi-squared (3), from ``gen``:
    # torch.distributions samples from the global generator, so every call drew another dy
    z, v = torch.randn(m, n, generator=gen), torch.randn(3, m, n, generator=gen).square().sum(0)
    dy = z / (v / 3).sqrt() * 1e-5
    return {"x": x, "w": w, "dy": dy}


def _counts(t: torch.Tensor, granularity: str, fp8: torch.dtype, scale=None,
            scale_rule: str = "ocp") -> tuple[int, int]:
    """(overflow, underflow) elements of ``t`` (rows x the GEMM's reduction dim) quantized in
    groups of ``granularity`` along its rows, as the kernels do (:func:`quantize_one`; a given
    per-tensor ``scale``, delayed's, instead of the group's own; ``scale_rule``, the recipe's
    e8m0 rule for ``mx32``): overflow beyond what round-to-nearest takes to the max anyway
    (half an ulp above it), underflow a nonzero element that becomes 0. ``mx32``'s OCP rule
    puts a group's largest element in the format's top binade, above the max (448 for
    e4m3fn) when its mantissa is large: it can overflow under current scaling, where fp32
    scales and the round-up rule cannot."""
    t = t.float()
    if scale is None:
        q, scale = quantize_one(t, granularity, fp8, scale_rule)
        factor = dequantize(torch.ones_like(t), scale, granularity)   # what a 1 stands for, per element
    else:
        q, factor = quantize_fp8(t, fp8, "tensor", scale=scale)[0], scale
    over = int(saturated((t / factor).abs(), 1.0, fp8).sum())
    under = int(((q.float() == 0) & (t != 0)).sum())
    return over, under


def _gemm_operands(gemm: str, t: dict) -> tuple[torch.Tensor, torch.Tensor]:
    return {"forward": (t["x"], t["w"].t()), "dgrad": (t["dy"], t["w"]), "wgrad": (t["dy"].t(), t["x"])}[gemm]


def gemm_error_rows(recipes=None, shape=(64, 48, 80), seed: int = 0, fp8: torch.dtype | None = None) -> list[dict]:
    """One row per (recipe, GEMM): relative error, and overflow/underflow of operands A and B.
    ``recipes``: names, or recipe instances (``kernels.fp8.get("mxfp8", "ocp")``: another e8m0
    rule than the default), default every recipe."""
    fp8 = fp8 or fp8_dtype()
    t = operands(shape, seed)
    fmax = torch.finfo(fp8).max
    rows = []
    for recipe in recipes or kernels.fp8.names():
        recipe = kernels.fp8.get(recipe) if isinstance(recipe, str) else recipe
        name = recipe.name
        elements = recipe.element_format(fp8)   # mxfp8: OCP e4m3fn, also where fp8 is fnuz
        delayed = name == "delayed"
        scales = {k: (t[k].abs().amax() / GROWTH / fmax) for k in ("x", "w")} if delayed else {}
        grad_state = ()
        if delayed:   # dy's history as a layer's: its largest amax GROWTH times below this dy's
            history = torch.zeros(HISTORY)
            history[0] = t["dy"].abs().amax() / GROWTH
            grad_state = (history, None)
            scales["dy"] = history[0] / torch.finfo(recipe.grad_dtype(elements)).max
        results = {} if recipe.needs else recipe.gemms(t["x"], t["w"], t["dy"], elements, torch.float32,
                                                        scales.get("x"), scales.get("w"), grad_state=grad_state)
        for gemm, (a_name, b_name) in GEMMS.items():
            row = dict(recipe=name, gemm=gemm, A=a_name, B=b_name)
            if recipe.needs:
                rows.append({**row, "note": f"needs {recipe.needs}"})
                continue
            a, b = _gemm_operands(gemm, t)
            ref = a.double() @ b.double()
            got = results[gemm]
            row["rel_error"] = ((got.double() - ref).norm() / ref.norm()).item()
            a_groups, b_groups = recipe.operand_groups[gemm]
            a_scale = scales.get(a_name.removesuffix(".T"))
            b_scale = scales.get(b_name.removesuffix(".T"))
            a_fp8 = elements if a_name == "x" else recipe.grad_dtype(elements)   # dy in the grad format
            rule = recipe.scale_rule
            row["A_overflow"], row["A_underflow"] = _counts(a, a_groups, a_fp8, a_scale, rule)
            row["B_overflow"], row["B_underflow"] = _counts(b.t(), b_groups, elements, b_scale, rule)
            row["finite"] = bool(torch.isfinite(got).all())
            rows.append(row)
    return rows
