"""Notebook 00's exercise cells: Run All works before and after the learner passes, shows
the verdict (never asserts on it), and a second Run All on an unchanged file is not a
second attempt. The cells run in one kernel as in JupyterLab (each Run All in the same
kernel), on the learner's file in a private exercises folder and progress file."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from workbench import exercises
from workbench.learn.exercises import source

NOT_HERE = "the notebook extra is not installed (e.g. on a bare GPU image)"
nbformat = pytest.importorskip("nbformat", reason=NOT_HERE)
nbclient = pytest.importorskip("nbclient", reason=NOT_HERE)

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "00_start_here.ipynb"


def _exercise_cells() -> list:
    """The code cells from the heading "Your first exercise" to the next heading."""
    cells = nbformat.read(NOTEBOOK, as_version=4).cells
    start = next(i for i, c in enumerate(cells) if c.cell_type == "markdown" and "Your first exercise" in c.source)
    end = next(i for i in range(start + 1, len(cells)) if cells[i].cell_type == "markdown")
    return [nbformat.v4.new_code_cell(c.source) for c in cells[start + 1:end] if c.cell_type == "code"]


def _run_all(client: nbclient.NotebookClient) -> str:
    """Run the cells as Run All would, in the kernel of ``client`` (a learner's Run All again
    runs in the same kernel); the verdict cell's text, which must not be an error."""
    for index, cell in enumerate(client.nb.cells):
        client.execute_cell(cell, index)
    outputs = [o for c in client.nb.cells for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    verdicts = [o.data["text/html"] for o in outputs if "<b>PASS</b>" in o.get("data", {}).get("text/html", "")
                or "<b>FAIL</b>" in o.get("data", {}).get("text/html", "")]
    assert len(verdicts) == 1
    return verdicts[0]


@pytest.mark.timeout(600)
def test_run_all_before_and_after_the_learner_passes(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.setenv("WORKBENCH_EXERCISES_DIR", str(tmp_path / "exercises"))
    monkeypatch.setenv("WORKBENCH_PROGRESS", str(tmp_path / "progress.json"))
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import workbench"), *_exercise_cells()])
    client = nbclient.NotebookClient(notebook, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}})
    with client.setup_kernel():
        assert "<b>FAIL</b>: not done yet" in _run_all(client)          # as shipped: the TODO
        mine = tmp_path / "exercises" / "gemm_v1.py"
        mine.write_text(source.render(exercises.get("gemm/v1").module))   # the learner fills it in
        assert "<b>PASS</b>" in _run_all(client)
        assert "<b>PASS</b>" in _run_all(client)                         # Run All again, unchanged
    entry = json.loads((tmp_path / "progress.json").read_text())["gemm/v1"]
    assert entry["passed"] and entry["attempts"] == 2
