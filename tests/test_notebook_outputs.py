"""The committed notebooks read well before anyone runs them.

A newcomer opens a notebook in JupyterLab before running it, and the notebook is not
trusted yet, so JupyterLab draws neither widgets nor SVG from the saved file: it falls back
to the next mime type it deems safe, which for a bare widget or chart is ``text/plain``,
i.e. ``VBox(children=(HTML(...`` or ``alt.LayerChart(...)``. So every saved widget display
must carry an HTML copy, no saved plain text may be such a repr, and no cell may have failed.
PNG is left out on purpose: SVG is a tenth of its size.
"""
from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest

import kernels
import roofline
from workbench import model
from workbench.views.rung import RungView, page_code

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))
REPRS = ("VBox(", "HBox(", "Output(", "alt.", "LayerChart(", "Chart(")
WIDGET = "application/vnd.jupyter.widget-view+json"


def _outputs(path: Path):
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    for number, cell in enumerate(cells):
        for output in cell.get("outputs", []):
            yield number, output


def _text(value) -> str:
    return "".join(value) if isinstance(value, list) else str(value)


def problems(path: Path) -> list[str]:
    """Why ``path``'s saved outputs would not read well unexecuted (empty when they do)."""
    found = []
    for cell, output in _outputs(path):
        if output["output_type"] == "error":
            found.append(f"cell {cell}: an error ({output.get('ename')})")
        data = output.get("data", {})
        plain = _text(data.get("text/plain", "")).lstrip()
        if plain.startswith(REPRS):
            found.append(f"cell {cell}: a bare repr as plain text: {plain[:40]!r}")
        if WIDGET in data and "text/html" not in data:
            found.append(f"cell {cell}: a widget without an HTML copy")
        if "image/png" in data:
            found.append(f"cell {cell}: a PNG (commit SVG: a tenth of the size)")
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_outputs_read_well_unexecuted(path):
    """Also: every saved rung page shows the rung as it is (after changing a rung, re-execute
    the notebook in place: README, "Learning path")."""
    assert not problems(path) + stale_pages(path)


def test_the_scan_catches_widget_and_chart_reprs_and_errors(tmp_path):
    outputs = [{"output_type": "display_data", "metadata": {},
                "data": {WIDGET: {"model_id": "x"}, "text/plain": "VBox(children=(HTML(...)))"}},
               {"output_type": "display_data", "metadata": {},
                "data": {"image/svg+xml": "<svg/>", "text/plain": "alt.LayerChart(...)"}},
               {"output_type": "error", "ename": "ValueError", "evalue": "", "traceback": []}]
    notebook = tmp_path / "bad.ipynb"
    notebook.write_text(json.dumps({"cells": [{"cell_type": "code", "outputs": outputs}]}))
    found = problems(notebook)
    assert len(found) == 4 and "error" in found[-1]


# A rung page as RungView._repr_html_ writes it: its heading, docstring and code.
PAGE = re.compile(r"<h3>(?P<head>[^<]*)</h3><pre>(?P<doc>[^<]*)</pre><p><b>Code</b></p>(?P<code><pre [^>]*>.*?</pre>)",
                  re.S)


def stale_pages(path: Path) -> list[str]:
    """The rung pages saved in ``path`` whose docstring or code (the diff to the rung below)
    is not the package's now: a reader of the unexecuted notebook would read old code."""
    rungs = {f"{html.escape(r.op)} {html.escape(r.title)}": r for op in kernels.ops() for r in kernels.variants(op)}
    found = []
    for cell, output in _outputs(path):
        for page in PAGE.finditer(_text(output.get("data", {}).get("text/html", ""))):
            rung = rungs.get(page["head"])
            if rung is None:
                found.append(f"cell {cell}: a page of {page['head']!r}, which is no rung now")
                continue
            if html.unescape(page["doc"]) != rung.doc:
                found.append(f"cell {cell}: {page['head']}'s docstring is not the rung's now")
            if page["code"] != page_code(rung)._repr_html_():
                found.append(f"cell {cell}: {page['head']}'s code is not the rung's now")
    return found


def test_the_page_scan_finds_the_pages_and_a_changed_line(tmp_path):
    rung = kernels.get("gemm", 2)
    page = RungView(rung, rung.doc, page_code(rung), [], None, "no checks here")._repr_html_()
    notebook = tmp_path / "pages.ipynb"

    def write(text):
        notebook.write_text(json.dumps({"cells": [{"cell_type": "code", "outputs": [
            {"output_type": "display_data", "metadata": {}, "data": {"text/html": text}}]}]}))
    write(page)
    assert stale_pages(notebook) == []
    doc, code = page.split("<p><b>Code</b></p>")
    assert "tl.dot(" in code
    write(doc + "<p><b>Code</b></p>" + code.replace("tl.dot(", "tl.dot_old(", 1))
    assert stale_pages(notebook) == ["cell 0: gemm v2 triton_tile's code is not the rung's now"]
    write(page.replace("<pre>", "<pre>old ", 1))
    assert stale_pages(notebook) == ["cell 0: gemm v2 triton_tile's docstring is not the rung's now"]


# A roofline point as its SVG names it for a screen reader: the tooltip's fields ("rung: v2; ...").
ROOF_POINT = re.compile(r'aria-label="([^"]*; % of roof: [^"]*)"')
# Per notebook, the rungs its roofline charts must show at their predicted height (model).
PREDICTED = {"02_attention_ladder.ipynb": {"attention v2", "attention v3", "attention v4", "attention v5 backward"},
             "03_moe_ladder.ipynb": {"moe v3"},
             "06_fp8_training.ipynb": {"gemm v6", "gemm_fp8 v1", "gemm_fp8 v2"}}


def roof_points(path: Path) -> list[tuple[int, dict]]:
    """(cell, the point's fields: rung, op, source, gpu, % of roof...) of every point of every
    roofline chart saved in ``path`` as SVG."""
    return [(cell, dict(field.split(": ", 1) for field in html.unescape(label).split("; ")))
            for cell, output in _outputs(path)
            for label in ROOF_POINT.findall(_text(output.get("data", {}).get("image/svg+xml", "")))]


def modelled(point: dict) -> bool:
    """Whether the point names ("<op> <label>[ backward]") a rung the model predicts on its GPU."""
    op, label, pass_name = (point["rung"].split() + ["", ""])[:3]
    table = model.BACKWARD if pass_name == "backward" else model.COVERED
    target = roofline.spec(point["gpu"]).target
    return op == point["op"] and label in table.get(op, ((), ()))[1] and target in model.TARGETS


def roof_problems(points: list[tuple[int, dict]]) -> list[str]:
    """Points drawn on the roof without being named a ceiling (a roof is no kernel's speed), and
    rungs the model covers drawn other than at their predicted height (model, below the roof)."""
    found = []
    for cell, point in points:
        ceiling, on_roof = point["rung"].endswith(roofline.CEILING), float(point["% of roof"]) >= 100
        if on_roof and not ceiling:
            found.append(f"cell {cell}: {point['rung']!r} sits on the roof and is not named a ceiling")
        if modelled(point) and (ceiling or on_roof or point["source"] != "model"):
            found.append(f"cell {cell}: {point['rung']!r} is a rung the model covers, not at its predicted height")
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_roofline_points_on_the_roof_are_ceilings_and_modelled_rungs_sit_at_their_prediction(path):
    points = roof_points(path)
    assert not roof_problems(points)
    assert PREDICTED.get(path.name, set()) <= {p["rung"] for _, p in points if p["source"] == "model"}


def test_the_roof_scan_reads_the_points_and_catches_a_rung_on_the_roof(tmp_path):
    def point(rung, op, pct, source="model"):
        return (f'<path aria-label="arithmetic intensity (FLOP/byte): 1638.8; rung: {rung}; source: {source}; '
                f'op: {op}; gpu: MI300X; % of roof: {pct}; bound: compute"/>')
    svg = "".join([point("attention v4", "attention", "23.7"), point("attention v0 (ceiling)", "attention", "100.0"),
                   point("v2-v4", "attention", "100.0"), point("moe v3 (ceiling)", "moe", "100.0"),
                   point("attention v2", "attention", "40.0", "measured")])
    notebook = tmp_path / "roof.ipynb"
    notebook.write_text(json.dumps({"cells": [{"cell_type": "code", "outputs": [
        {"output_type": "display_data", "metadata": {}, "data": {"image/svg+xml": svg}}]}]}))
    points = roof_points(notebook)
    assert [(p["rung"], p["% of roof"]) for _, p in points][:2] == [("attention v4", "23.7"),
                                                                      ("attention v0 (ceiling)", "100.0")]
    assert roof_problems(points) == [
        "cell 0: 'v2-v4' sits on the roof and is not named a ceiling",
        "cell 0: 'moe v3 (ceiling)' is a rung the model covers, not at its predicted height",
        "cell 0: 'attention v2' is a rung the model covers, not at its predicted height"]
