"""The grade for a terminal: the verdict first, then each part in a few lines."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..harness.table import format_table

if TYPE_CHECKING:   # the report calls this module; importing it back would be a circle
    from .report import GradeReport

SUMMARY_KEYS = ("kernel", "matrix instructions", "LDS bytes", "VGPRs", "registers", "AGPRs",
                "VGPR spills", "SGPR spills", "16-bit LDS ops", "waves per SIMD")


def _case_line(case: dict) -> str:
    where = case.get("step") or f"{case['shape']} {case['dtype']} {case['layout']}"
    return f"  {'ok  ' if case['passed'] else 'FAIL'} {where}: {case['message'].splitlines()[0][:160]}"


def _kernel_rows(target: str, part: dict, top_title) -> list[dict]:
    rows = []
    for who, kernels in (("yours", part["yours"]), (top_title or "top rung", part["top"])):
        if isinstance(kernels, str):
            rows.append({"target": target, "who": who, "kernel": kernels[:100]})
            continue
        for k in kernels:
            rows.append({"target": target, "who": who, **({"kernel": k[:100]} if isinstance(k, str) else
                                                          {key: k.get(key) for key in SUMMARY_KEYS if key in k})})
    return rows


def summary(report: GradeReport) -> str:
    lines = [report.verdict, f"file {report.file}, op {report.op}, entry {report.entry}"]
    if report.cases:
        lines += ["", "correctness:", *map(_case_line, report.cases)]
    if report.exercise:
        judged = report.exercise
        lines += ["", f"exercise {judged['key']}'s rules: {'PASS' if judged['passed'] else 'FAIL'}: {judged['message']}"]
    machine = report.machine_code
    if machine.get("targets"):
        rows = [r for t, part in machine["targets"].items() for r in _kernel_rows(t, part, machine.get("top_rung"))]
        columns = list(dict.fromkeys(key for r in rows for key in r))
        lines += ["", f"machine code ({machine['dtype']}, launches at {machine['shape']}):",
                  format_table(rows, columns)]
    for key in ("note", "record_error", "compile_failure"):
        if machine.get(key):
            lines.append(f"machine code: {machine[key]}")
    model = report.speed["model"]
    if model.get("rows"):
        lines += ["", f"speed, model (not measured) at {model['shape']} {model['dtype']}:",
                  format_table(model["rows"])]
    for note in model.get("notes", []) + [model[k] for k in ("note", "yours") if model.get(k)]:
        lines.append(f"model: {note}")
    measured = report.speed["measured"]
    if measured.get("rows"):
        lines += ["", f"speed, measured on {measured['gpu']}:", format_table(measured["rows"])]
    else:
        lines.append(f"measured: {measured.get('note')}")
    return "\n".join(lines)
