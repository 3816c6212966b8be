"""The order of a grade: the file's process (contract, correctness, launch record, GPU
timing), then its kernels' compile, then the model; the verdict from what came back."""
from __future__ import annotations

from pathlib import Path

import torch

from ..harness.environment import describe
from ..harness.table import dtype_label
from . import file_model
from . import machine_code as mc
from .contract import CUSTOM_ENTRY, ENTRY
from .report import GradeReport
from .session import run_worker
from .speed import predictions

NO_GPU = "no GPU here: nothing measured (the CPU interpreter's times say nothing about a GPU)"


def _named(file) -> str:
    """How the report names ``file``: a file of this package (the bundled examples) by its
    place in it, ``workbench/grade/examples/...``, the same on every machine (a notebook's
    committed output named the checkout it ran in); any other file as the caller gave it."""
    package = Path(__file__).resolve().parents[1]
    resolved = Path(file).resolve()
    return str(resolved.relative_to(package.parent)) if resolved.is_relative_to(package) else str(file)


def run(file: Path, op, *, entry, reference, exercise, dtypes, shapes, layouts, targets, gpus,
        machine_code, model, import_s, run_s, seed) -> GradeReport:
    request = {"file": str(Path(file).resolve()), "op": op, "entry": entry,
               "reference": str(Path(reference).resolve()) if reference else None,
               "dtypes": list(dtypes) if dtypes else None,
               "shapes": [tuple(s) for s in shapes] if shapes else None,
               "layouts": list(layouts), "seed": seed, "record": (machine_code or model) and op is not None,
               "exercise": exercise}
    if not Path(file).is_file():
        raise FileNotFoundError(f"{file} is not a file")
    outcome = run_worker({**request, "stage": "run"}, import_s=import_s, run_s=run_s)
    contract = outcome.first("contract") or {"passed": False, "message": outcome.failure or "not reached"}
    cases = outcome.all("case")
    if outcome.failure:
        cases.append({"step": outcome.failed_step, "passed": False, "message": outcome.failure})
    name = contract.get("entry") or entry or ENTRY.get(op, CUSTOM_ENTRY)
    launches = outcome.first("launches")
    machine = (_machine_code(request, launches, targets, run_s, name, op) if machine_code and launches
               else {"note": "skipped" if not machine_code else "no launches recorded (the file did not get that far)"})
    isa_reports = machine.pop("_reports", {})
    compiled = {t: part["yours"] for t, part in isa_reports.items()}
    speed = {"model": _model(op, launches, gpus, request["file"], compiled, exercise)
             if model and launches and not reference else
             {"note": "skipped" if not model else "no model for a user-defined op" if reference else "not reached"},
             "measured": outcome.first("timing") or {"note": NO_GPU}}
    judged = outcome.first("exercise")
    passed = (bool(contract.get("passed")) and bool(cases or judged) and all(c["passed"] for c in cases)
              and (exercise is None or bool(judged and judged["passed"])))
    report = GradeReport(file=_named(file), op=op or (Path(reference).stem if reference else f"exercise {exercise}"), entry=name,
                         passed=passed, verdict="", contract=contract,
                         autograd=outcome.first("autograd") or {}, cases=cases, machine_code=machine,
                         speed=speed, environment=describe(), reference=str(reference) if reference else None,
                         exercise=judged,
                         failure=outcome.failure,
                         check_reports=[c["report"] for c in cases if not c["passed"] and c.get("report")],
                         isa_reports=isa_reports)
    report.verdict = _verdict(report)
    return report


def _verdict(report: GradeReport) -> str:
    if not report.contract.get("passed"):
        return f"FAIL: {report.contract.get('message')}"
    failing, judged = report.first_failure, report.exercise
    if failing is None and judged and not judged["passed"]:
        return f"FAIL at exercise {judged['key']}'s rules: {judged['message']}"
    if failing is None and not report.cases:
        return f"PASS: exercise {judged['key']}'s rules: {judged['message']}" if judged else "FAIL: nothing was checked"
    if failing is None:
        layouts = list(dict.fromkeys(c["layout"] for c in report.cases if "layout" in c))
        return (f"PASS: {len(report.cases)} checks passed "
                f"({', '.join(report.contract.get('dtypes', []))}; "
                f"{' and '.join(layouts).replace('row and col', 'row- and column')}-major"
                f"{'; gradients of ' + ', '.join(report.autograd['inputs']) if report.autograd.get('backward') else ''})"
                + (f"; exercise {judged['key']}'s rules passed" if judged else ""))
    where = failing.get("step") or (f"shape {failing['shape']}, {failing['dtype']}, {failing['layout']}-major")
    return f"FAIL at {where}: {failing['message']}"


def _machine_code(request, launches, targets, run_s, name, op) -> dict:
    dtype = getattr(torch, launches["dtype"].removeprefix("torch."))
    dtype_name = dtype_label(dtype)
    found = {"dtype": dtype_name, "shape": list(launches["shape"]), "targets": {}}
    if launches["error"]:
        found["record_error"] = launches["error"]
    if not launches["records"]:
        found["note"] = "the callable launched no Triton kernel (torch or SIMT code has no AOT compile here)"
    compiled, failure = mc.compile_file(request, launches["records"], launches["module"], targets, run_s) \
        if launches["records"] else ({}, None)
    if failure:
        found["compile_failure"] = failure
    yours = mc.reports(op or "custom", compiled, dtype_name, name)
    top_title, tops = mc.top_reports(op, dtype, targets) if op else (None, {})
    found["top_rung"] = top_title
    for target in targets:
        mine = yours.get(target, [])
        top = tops.get(target, [])
        found["targets"][target] = {
            "yours": [k if isinstance(k, str) else mc.row(k) for k in mine],
            "top": top if isinstance(top, str) else [mc.row(k) for k in top]}
    found["_reports"] = {t: {"yours": [k for k in yours.get(t, []) if not isinstance(k, str)],
                             "top": [] if isinstance(tops.get(t), str) else tops.get(t, [])} for t in targets}
    return found


def _model(op, launches, gpus, file, compiled, exercise) -> dict:
    """The ladder's rungs and, first, the file's own kernels (:mod:`.file_model`)."""
    dtype = getattr(torch, launches["dtype"].removeprefix("torch."))
    rows, notes = predictions(op, tuple(launches["shape"]), dtype, gpus)
    yours, why = file_model.predictions(op, file, launches, compiled, gpus, exercise)
    return {"label": "model", "shape": list(launches["shape"]), "dtype": dtype_label(dtype),
            "rows": yours + rows, "notes": notes, **({"yours": why} if why else {})}
