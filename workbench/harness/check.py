"""The correctness harness: every rung, every dtype, against a float64 reference.

The rule (DESIGN.md): fresh random inputs, a poisoned output buffer, an error bounded
by a factor of the library baseline's error in the same dtype (the larger of two memory
orders of the same inputs, :func:`judge`) plus a dtype floor
(:mod:`workbench.harness.tolerances`), and NaN/inf in the same places as the reference. The
result is a :class:`CheckReport` that a table, a widget or a test can read.

A rung declared with a backward (``Rung.backward``) is judged on more than its output:
the harness feeds a seeded random output gradient through the rung, the library
baseline and the float64 reference (torch autograd on ``OpSpec.reference``) and
judges the gradient of each of the op's ``grad_inputs`` by the same rule with the
backward factor. One report per check; ``tensor`` names the tensor its numbers
describe (the first that fails, else the one closest to its bound).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import torch

import kernels
from kernels.outputs import poisoned_outputs
from kernels.registry import Rung

from .error_pattern import finding
from .table import dtype_label
from .tolerances import FLOOR, allowed_error


@dataclass
class CheckReport:
    """Outcome of one correctness check; ``passed`` is the verdict, the rest explains it."""

    op: str
    rung: str
    shape: tuple
    dtype: str
    passed: bool
    error: float              # max |x - ref| / max |ref|
    baseline_error: float     # the same for the library baseline
    allowed: float
    mismatches: int           # elements over the bound or with the wrong NaN/inf pattern
    numel: int
    worst_index: tuple | None
    worst_value: float | None
    worst_expected: float | None
    layout: str = "row"
    message: str = ""
    tensor: str = "out"       # which tensor the numbers above describe: "out", or "dq" for q's gradient
    finding: str = ""         # a failure's error pattern in words: where, and the likely cause
    error_map: torch.Tensor | None = field(default=None, repr=False)

    def row(self) -> dict:
        """A flat dict for tables (no tensors)."""
        return {k: v for k, v in self.__dict__.items() if k != "error_map"}


def _nonfinite_mismatch(x: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """Where x's NaN/inf pattern differs from the expected one (same sign of inf)."""
    nan_diff = torch.isnan(x) != torch.isnan(expected)
    inf_diff = torch.isinf(x) != torch.isinf(expected)
    sign_diff = torch.isinf(x) & torch.isinf(expected) & (torch.sign(x) != torch.sign(expected))
    return nan_diff | inf_diff | sign_diff


def relative_error(x: torch.Tensor, reference: torch.Tensor) -> tuple[float, torch.Tensor]:
    """Max |x - ref| / max |ref| over elements where the reference is finite."""
    x = x.detach().cpu().double()
    finite = torch.isfinite(reference)
    scale = reference[finite].abs().max().item() if finite.any() else 1.0
    scale = scale if scale > 0 else 1.0
    err = torch.where(finite & torch.isfinite(x), (x - reference).abs(), torch.zeros_like(reference))
    return err.max().item() / scale if err.numel() else 0.0, err / scale


def compare(x: torch.Tensor, reference: torch.Tensor,
            baseline: torch.Tensor | Sequence[torch.Tensor], dtype: torch.dtype,
            direction: str = "forward", inputs: tuple = (),
            other_errors: Sequence[float] = ()) -> dict:
    """Apply the rule to one output: the fields of a :class:`CheckReport` that are numbers,
    and for a failure its :func:`~workbench.harness.error_pattern.finding` (``inputs``, the op's
    inputs, let it name a GEMM's missing K slice). ``baseline`` is the library's result, or
    several (the same values in other memory orders, :func:`judge`): the baseline error is
    the largest of theirs and of ``other_errors``, the library's errors on other inputs
    measured against their own references (:func:`judge`'s rounding neighbours)."""
    if tuple(x.shape) != tuple(reference.shape):
        raise ValueError(f"output shape {tuple(x.shape)} != reference shape {tuple(reference.shape)}")
    baselines = [baseline] if isinstance(baseline, torch.Tensor) else baseline
    if x.dtype != baselines[0].dtype:   # judged in its own dtype, a float64 result would pass
        raise ValueError(f"output dtype {dtype_label(x.dtype)} != the library's {dtype_label(baselines[0].dtype)}")
    expected_pattern = reference.to(dtype).double()  # overflow in the dtype is expected
    base_error = max([relative_error(b, reference)[0] for b in baselines] + list(other_errors))
    error, error_map = relative_error(x, reference)
    allowed = allowed_error(dtype, base_error, direction)
    wrong_pattern = _nonfinite_mismatch(x.detach().cpu().double(), expected_pattern)
    error_map = torch.where(wrong_pattern, torch.full_like(error_map, float("inf")), error_map)
    bad = wrong_pattern | (error_map > allowed)
    mismatches = int(bad.sum().item())
    worst = None
    if mismatches:
        flat = int(torch.argmax(bad.double() * (1.0 + error_map.nan_to_num(0.0))).item())
        worst = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), x.shape))
    passed = mismatches == 0 and error <= allowed
    return dict(passed=passed, error=error, baseline_error=base_error,
                allowed=allowed, mismatches=mismatches, numel=x.numel(), worst_index=worst,
                worst_value=None if worst is None else float(x[worst].item()),
                worst_expected=None if worst is None else float(reference[worst].item()),
                finding="" if passed else finding(x, reference, bad, inputs), error_map=error_map)


def broken_rules(fields: dict) -> str:
    """Which part of the rule a failing output broke, in words, with its worst element:
    the NaN/inf pattern (e.g. an element never written keeps its NaN poison), the error
    bound, or both. The error alone can look fine when only the pattern is wrong."""
    wrong_pattern = int(torch.isinf(fields["error_map"]).sum().item())
    over_bound = fields["mismatches"] - wrong_pattern
    rules = []
    if wrong_pattern:
        rules.append(f"{wrong_pattern} elements NaN/inf where the reference is not, or finite "
                     f"where it is NaN/inf")
    if over_bound or fields["error"] > fields["allowed"]:
        rules.append(f"{over_bound} elements over the error bound")
    worst = fields["worst_index"]
    if worst is not None:
        rules.append(f"worst at {worst}: got {fields['worst_value']:.6g}, "
                     f"expected {fields['worst_expected']:.6g}")
    return "; ".join(rules)


def _with_grads(fn, inputs: tuple, names: tuple[str, ...], grad_out: torch.Tensor):
    """``fn``'s output and the gradients of its leading ``len(names)`` inputs for ``grad_out``."""
    leaves = tuple(t.detach().requires_grad_() if i < len(names) else t
                   for i, t in enumerate(inputs))
    out = fn(*leaves)
    out.backward(grad_out.to(device=out.device, dtype=out.dtype))
    return out.detach(), {n: leaves[i].grad for i, n in enumerate(names)}


def other_memory_order(t):
    """``t`` with the same values in the other memory order of its last two dimensions:
    column-major if its rows are contiguous, else row-major (other arguments as they
    are). Torch takes another kernel for it, and so sums in another order."""
    if not (isinstance(t, torch.Tensor) and t.is_floating_point() and t.dim() >= 2):
        return t
    t = t.detach()
    if t.stride(-1) == 1:
        return t.transpose(-1, -2).contiguous().transpose(-1, -2)
    return t.contiguous()


# Library errors sampled on rounding neighbours of the inputs (:func:`judge`): each sample
# costs a baseline and a float64 run, cheap beside an interpreted rung. A small output needs
# more of them: its error (a max over few elements) is one draw with a wide spread, where a
# large output's is already a max over many (see :func:`neighbours`).
NEIGHBOURS = 2
MOST_NEIGHBOURS = 8
SMALL_OUTPUT = 512   # elements: below this, more neighbours, up to MOST_NEIGHBOURS


def neighbours(output_numel: int) -> int:
    """How many rounding neighbours :func:`judge` samples for an output of this many elements:
    :data:`NEIGHBOURS`, rising to :data:`MOST_NEIGHBOURS` as the output shrinks below
    :data:`SMALL_OUTPUT` elements. A one-token MoE (24 outputs) at seed 618206622 in fp32: the
    router gradient's library error was 3.2e-6 over 2 neighbours, 7.0e-6 over 4 and 1.0e-5 over
    8, against v2's 1.3e-5 (``tests/test_harness.py``)."""
    return min(MOST_NEIGHBOURS, max(NEIGHBOURS, -(-SMALL_OUTPUT // max(output_numel, 1))))


def rounding_neighbour(inputs: tuple, gen: torch.Generator) -> tuple:
    """``inputs`` with every element x of each floating tensor moved at random by up to
    ``eps``·|x| of its dtype, rounded back to the dtype (so by at most 1.5 eps·|x|), in the same layout:
    a problem as near the original as the dtype can tell, whose library error is another
    sample of that error. Other arguments, and dtypes without a tolerance (e8m0 scales),
    stay as they are."""
    def near(t):
        if not (isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype in FLOOR):
            return t
        jitter = torch.rand(t.shape, generator=gen, dtype=torch.float64) * 2 - 1
        moved = (t.detach().cpu().double() * (1 + torch.finfo(t.dtype).eps * jitter)).to(t.dtype)
        return torch.empty_like(t).copy_(moved)   # the layout kept where it is dense
    return tuple(near(t) for t in inputs)


def judge(rung: Rung, spec, inputs: tuple, seed: int,
          baseline: Rung | None = None) -> list[tuple[str, dict]]:
    """(name, fields of :func:`compare`) for the output and, with a backward, each gradient,
    on the given inputs: :func:`check_rung` makes fresh ones, a test can shape its own
    (large magnitudes); ``seed`` draws the output gradient. ``baseline`` stands in for the
    op's ``ref`` rung where the op is not registered (a user-defined op, :mod:`workbench.grade`).

    The bound follows the library's error in the dtype, taken as the largest of several
    samples of it, because one sample can be luckily small where the result is
    ill-conditioned (a one-token MoE's router gradient cancels two expert outputs; that
    made the tour fail at random: ``tests/test_harness.py`` keeps the seeds that showed it):
    the library baseline on the inputs, on :func:`other_memory_order` copies (another
    summation order), and on :func:`neighbours` :func:`rounding_neighbour` inputs, each
    against the float64 reference of its own inputs (other roundings of nearly the same
    problem). A wrong kernel is still off by far more than any of them."""
    baseline_rung = baseline or kernels.registry.reference_rung(rung.op)
    gen = torch.Generator(device="cpu").manual_seed(seed + 1)
    if not rung.backward:
        reference = spec.reference(*inputs)
        baselines = (baseline_rung(*inputs), baseline_rung(*(other_memory_order(t) for t in inputs)))
        spread = []
        for _ in range(neighbours(reference.numel())):
            near = rounding_neighbour(inputs, gen)
            spread.append(relative_error(baseline_rung(*near), spec.reference(*near))[0])
        with poisoned_outputs():
            out = rung(*inputs)
        return [("out", compare(out, reference, baselines, out.dtype, inputs=inputs,
                                other_errors=spread))]  # in its dtype
    names = spec.grad_inputs
    with torch.no_grad():
        shape = spec.reference(*_as64(inputs)).shape
    grad_out = torch.randn(shape, generator=gen).to(inputs[0].dtype)  # what rung and baseline see
    reference, ref_grads = _with_grads(spec.reference, _as64(inputs), names, grad_out.double())
    baselines = [_with_grads(baseline_rung, ins, names, grad_out)
                 for ins in (inputs, tuple(other_memory_order(t) for t in inputs))]
    spread = {n: [] for n in ("out", *names)}
    for _ in range(neighbours(reference.numel())):
        near = rounding_neighbour(inputs, gen)
        near_ref, near_ref_grads = _with_grads(spec.reference, _as64(near), names, grad_out.double())
        near_out, near_grads = _with_grads(baseline_rung, near, names, grad_out)
        spread["out"].append(relative_error(near_out, near_ref)[0])
        for n in names:
            spread[n].append(relative_error(near_grads[n], near_ref_grads[n])[0])
    with poisoned_outputs():
        out, grads = _with_grads(rung, inputs, names, grad_out)
    judged = [("out", compare(out, reference, [b for b, _ in baselines], out.dtype, inputs=inputs,
                              other_errors=spread["out"]))]
    return judged + [(f"d{n}", compare(grads[n], ref_grads[n], [g[n] for _, g in baselines],
                                       grads[n].dtype, "backward", other_errors=spread[n]))
                     for n in names]


def _as64(inputs: tuple) -> tuple:
    return tuple(t.detach().cpu().double() if isinstance(t, torch.Tensor) and t.is_floating_point()
                 else t for t in inputs)


def check_rung(rung: Rung, shape: tuple, dtype: torch.dtype, seed: int | None = None,
               layout: str = "row", spec=None, baseline: Rung | None = None) -> CheckReport:
    """Run one rung on fresh inputs (poisoned outputs) and judge it against the reference:
    its output, and with a backward also the gradients of the op's ``grad_inputs``.
    ``spec`` and ``baseline`` replace the registered op's (a problem of the user's own)."""
    spec = spec or kernels.spec(rung.op)
    seed = seed if seed is not None else torch.randint(0, 2**31 - 1, ()).item()
    device = kernels.backend.current().device
    inputs = spec.make_inputs(shape, dtype, device=device, seed=seed, layout=layout)
    judged = judge(rung, spec, inputs, seed, baseline)
    failing = [(n, f) for n, f in judged if not f["passed"]]
    tensor, fields = failing[0] if failing else max(
        judged, key=lambda nf: nf[1]["error"] / nf[1]["allowed"])
    verdict = "pass" if not failing else f"FAIL ({tensor}): {broken_rules(fields)}"
    message = (f"{verdict}: error {fields['error']:.2e} vs allowed {fields['allowed']:.2e} "
               f"(baseline {fields['baseline_error']:.2e}), {fields['mismatches']} of "
               f"{fields['numel']} elements off, seed {seed}")
    if len(judged) > 1:
        message += "; " + ", ".join(f"{n} {f['error']:.1e}/{f['allowed']:.1e}" for n, f in judged)
    if fields["finding"]:   # what the heat map shows, and the bug its pattern points at
        message += f"; {fields['finding']}"
    fields = {**fields, "passed": not failing}
    return CheckReport(op=rung.op, rung=rung.title, shape=tuple(shape), dtype=dtype_label(dtype),
                       layout=layout, message=message, tensor=tensor, **fields)


def check(op: str, rung: int | str | None = None, shapes: Iterable[tuple] | None = None,
          dtypes: Iterable[torch.dtype] | None = None, layouts: Iterable[str] = ("row",),
          progress: bool = False) -> list[CheckReport]:
    """Check every rung of ``op`` that runs here (or one rung) at the smoke shapes."""
    from tqdm.auto import tqdm  # disable=None: a bar on a terminal, none in logs

    spec = kernels.spec(op)
    rungs = [kernels.get(op, rung)] if rung is not None else kernels.variants(op)
    plan = [(r, s, d, lay) for r in rungs if r.runs_here()
            for d in (dtypes or r.dtypes) if r.supports(d)
            for s in (shapes or spec.smoke_shapes) for lay in layouts]
    return [check_rung(r, s, d, layout=lay)
            for r, s, d, lay in tqdm(plan, desc=f"checking {op}", leave=False,
                                     disable=None if progress else True)]


def all_passed(reports: Iterable[CheckReport]) -> bool:
    reports = list(reports)
    return bool(reports) and all(r.passed for r in reports)


def summarize(reports: Iterable[CheckReport]) -> list[dict]:
    """One row per (rung, dtype): checks run, passed, worst error ratio to the bound."""
    groups: dict[tuple, list[CheckReport]] = {}
    for r in reports:
        groups.setdefault((r.op, r.rung, r.dtype), []).append(r)
    rows = []
    for (op, rung, dtype), group in groups.items():
        worst = max(group, key=lambda r: r.error / r.allowed if r.allowed else math.inf)
        rows.append(dict(op=op, rung=rung, dtype=dtype, checks=len(group),
                         passed=sum(r.passed for r in group),
                         worst_error=worst.error, allowed=worst.allowed))
    return rows
