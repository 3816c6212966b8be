"""The grade as one self-contained HTML page: no script, no stylesheet or font fetched,
the error heat map inlined as SVG, the hot loops in scrolling boxes."""
from __future__ import annotations

import html
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from ..harness.table import html_table
from .cases import case_row
from .text import SUMMARY_KEYS

if TYPE_CHECKING:   # the report calls this module; importing it back would be a circle
    from .report import GradeReport

STYLE = ("body{font-family:sans-serif;max-width:70em;margin:1em auto}table{border-collapse:collapse;"
         "margin:.5em 0}td,th{border:1px solid #ccc;padding:2px 6px;font-size:12px;text-align:left}"
         ".pass{color:#1a7f37}.fail{color:#c0392b}pre{background:#f6f8fa}")


def _heatmap_svg(check_report) -> str:
    """The failing case's error map as inline SVG (needs the notebook extra: altair, vl-convert)."""
    try:
        from roofline import save_chart

        from ..views.heatmap import error_heatmap
    except ImportError as error:
        return f"<p>(no heat map: {html.escape(str(error))}; install the notebook extra)</p>"
    with tempfile.TemporaryDirectory() as folder:
        path = save_chart(error_heatmap(check_report), Path(folder) / "map.svg")
        return path.read_text(encoding="utf-8")


def _correctness(report: GradeReport) -> str:
    columns = ["shape", "dtype", "layout", "passed", "tensor", "error", "allowed", "baseline_error",
               "mismatches", "worst_index", "message"]
    rows = [{"shape": c.get("step"), **case_row(c)} for c in report.cases]   # a killed step has no shape
    parts = ["<h2>Correctness</h2>", html_table(rows, columns)]
    if report.autograd:
        parts.append(f"<p>autograd: {html.escape(str(report.autograd))}</p>")
    failing = report.first_failure
    if failing:
        parts.append(f"<h3>First failure</h3><pre>{html.escape(failing['message'])}</pre>")
        if report.check_reports:
            parts.append(_heatmap_svg(report.check_reports[0]))
    return "".join(parts)


def _exercise(report: GradeReport) -> str:
    judged = report.exercise
    if not judged:
        return ""
    verdict = "pass" if judged["passed"] else "fail"
    return (f"<h2>Exercise {html.escape(judged['key'])}'s rules</h2>"
            f"<p class='{verdict}'>{verdict.upper()}: {html.escape(judged['message'])}</p>")


def _machine_code(report: GradeReport) -> str:
    machine = report.machine_code
    parts = ["<h2>Machine code</h2>"]
    for key in ("note", "record_error", "compile_failure"):
        if machine.get(key):
            parts.append(f"<p>{html.escape(key)}: {html.escape(str(machine[key]))}</p>")
    for target, part in machine.get("targets", {}).items():
        rows = []
        for who, kernels in (("yours", part["yours"]), (machine.get("top_rung") or "top rung", part["top"])):
            for k in ([kernels] if isinstance(kernels, str) else kernels):
                rows.append({"who": who, **({"kernel": k} if isinstance(k, str) else
                                            {key: k.get(key) for key in SUMMARY_KEYS if key in k})})
        parts.append(html_table(rows, ["who", *SUMMARY_KEYS], caption=f"{target} ({machine['dtype']}, "
                                                                      f"launches at {machine['shape']})"))
        for isa_report in report.isa_reports.get(target, {}).get("yours", []):
            parts.append(isa_report.loop_html())
    return "".join(parts)


def _speed(report: GradeReport) -> str:
    model, measured = report.speed["model"], report.speed["measured"]
    parts = ["<h2>Speed</h2>"]
    if model.get("rows"):
        parts.append(html_table(model["rows"], caption=f"model (not measured): {model['shape']} {model['dtype']}"))
    notes = model.get("notes", []) + [model[k] for k in ("note", "yours") if model.get(k)]
    parts += [f"<p>model: {html.escape(n)}</p>" for n in notes]
    if measured.get("rows"):
        parts.append(html_table(measured["rows"], caption=f"measured on {measured['gpu']}"))
    else:
        parts.append(f"<p>measured: {html.escape(measured.get('note', ''))}</p>")
    return "".join(parts)


def body(report: GradeReport) -> str:
    verdict_class = "pass" if report.passed else "fail"
    head = (f"<h1 class='{verdict_class}'>{html.escape(report.verdict)}</h1>"
            f"<p>{html.escape(report.file)}: <code>{html.escape(report.entry)}</code> graded as "
            f"{html.escape(report.op)}; contract: {html.escape(str(report.contract.get('signature') or report.contract.get('message')))}</p>")
    return head + _correctness(report) + _exercise(report) + _machine_code(report) + _speed(report)


def page(report: GradeReport) -> str:
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>grade: {html.escape(report.file)}</title>"
            f"<style>{STYLE}</style></head><body>{body(report)}"
            f"<p>environment: {html.escape(str(report.environment))}</p></body></html>\n")
