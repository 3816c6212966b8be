"""The committed notebooks read well before anyone runs them.

A newcomer opens a notebook in JupyterLab before running it, and the notebook is not
trusted yet, so JupyterLab draws neither widgets nor SVG from the saved file: it falls back
to the next mime type it deems safe, which for a bare widget or chart is ``text/plain``,
i.e. ``VBox(children=(HTML(...`` or ``alt.LayerChart(...)``. So every saved widget display
must carry an HTML copy, no saved plain text may be such a repr, and no cell may have failed.
PNG is left out on purpose: SVG is a tenth of its size.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

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
    assert not problems(path)


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
