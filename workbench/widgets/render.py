"""Showing a result: in the widget's Output area after a click, in the cell after ``run()``.

Why not both: in a headless run (CI, nbconvert, GitHub's viewer) what an Output area holds
is kept only in widget state, which those viewers do not draw, so code-driven runs write
plain cell output (an HTML table, an SVG chart) instead. And capturing display calls into
an Output area while a headless executor runs the cell can stall the executor until its
timeout (nbclient issue 312), so nothing here uses ``with output:``: a click sets the
Output's ``outputs`` directly. Charts go out as SVG through vl-convert: no CDN, no
browser, small files.
"""
from __future__ import annotations

import html
import io

import ipywidgets as w
from IPython import get_ipython
from IPython.display import display




def notes_html(notes: list[str]) -> str:
    return "".join(f"<p><i>{html.escape(n)}</i></p>" for n in notes)


def svg(chart) -> str:
    buffer = io.StringIO()
    chart.save(buffer, format="svg")
    return buffer.getvalue()


def in_notebook() -> bool:
    """True in a Jupyter kernel (where cell output is kept), False in scripts and tests."""
    shell = get_ipython()
    return shell is not None and "IPKernelApp" in shell.config


def bundle(part) -> dict:
    """A mime bundle for an HTML string or an altair chart."""
    return {"text/html": part} if isinstance(part, str) else {"image/svg+xml": svg(part)}


def show(output: w.Output, parts: list, static: bool) -> None:
    """``static``: clear ``output`` and write ``parts`` as cell output (in a notebook);
    otherwise put them in ``output``."""
    if static:
        output.outputs = ()
        if in_notebook():
            for part in parts:
                display(bundle(part), raw=True)
    else:
        output.outputs = tuple({"output_type": "display_data", "data": bundle(part),
                                "metadata": {}} for part in parts)
