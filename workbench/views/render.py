"""Showing a result: in the widget's Output area, and as a static stand-in for readers.

A widget shows its latest result in one place, its Output area, whether a click or a
``run()`` call made it; a new result replaces the old one there. A headless run keeps what
an Output area holds only in widget state, which GitHub, nbviewer and an untrusted
JupyterLab do not draw, so the widget's own display also carries a ``text/html`` stand-in
(the same tables, charts as images) that those viewers show instead of ``VBox(...)``.
A live JupyterLab draws the widget and ignores the stand-in.

Capturing display calls into an Output area while a headless executor runs the cell can
stall the executor until its timeout (nbclient issue 312), so nothing here uses
``with output:``: the Output's ``outputs`` are set directly. Charts go out as SVG through
vl-convert: no CDN, no browser, small files. JupyterLab draws ``image/svg+xml`` only in a
trusted notebook, so every chart carries a ``text/plain`` that names it and says so.
"""
from __future__ import annotations

import base64
import html

import altair as alt
from altair.utils.mimebundle import spec_to_mimebundle


def notes_html(notes: list[str]) -> str:
    return "".join(f"<p><i>{html.escape(n)}</i></p>" for n in notes)


def scroll_x(part: str) -> str:
    """``part`` in a box that scrolls sideways: an Output area cuts what is wider than the
    widget at its right edge, where a table's last columns would be lost without a scrollbar."""
    return f"<div style='overflow-x:auto;max-width:100%'>{part}</div>"


def _title(spec: dict) -> str:
    title = spec.get("title") or next((layer.get("title") for layer in spec.get("layer", [])
                                       if layer.get("title")), "")
    text = title.get("text", "") if isinstance(title, dict) else title
    return " ".join(text) if isinstance(text, list) else str(text)


def chart_text(spec: dict) -> str:
    """What a viewer that cannot draw SVG shows for a chart, instead of ``alt.LayerChart(...)``."""
    name = _title(spec) or "a chart"
    return f"[chart: {name}. An SVG image: it shows once the notebook is trusted or run.]"


def static_renderer(spec: dict, **metadata) -> dict:
    """altair renderer "static": the SVG plus :func:`chart_text` as its plain-text form."""
    svg = spec_to_mimebundle(spec, format="svg", mode="vega-lite",
                             vega_version=alt.VEGA_VERSION, vegalite_version=alt.VEGALITE_VERSION,
                             vegaembed_version=alt.VEGAEMBED_VERSION, **metadata)
    return {**svg, "text/plain": chart_text(spec)}


alt.renderers.register("static", static_renderer)


def bundle(part) -> dict:
    """A mime bundle for an HTML string or an altair chart."""
    return {"text/html": part} if isinstance(part, str) else static_renderer(part.to_dict())


def part_html(part) -> str:
    """One part as HTML; a chart becomes an ``<img>`` whose alt text says what it is (an
    untrusted JupyterLab strips the image's data URL and shows that text)."""
    if isinstance(part, str):
        return part
    drawn = static_renderer(part.to_dict())
    data = base64.b64encode(drawn["image/svg+xml"].encode()).decode()
    return (f'<img alt="{html.escape(drawn["text/plain"])}" '
            f'src="data:image/svg+xml;base64,{data}">')


def show(output, parts: list) -> None:
    """Replace what ``output`` (an ``ipywidgets.Output``) holds with ``parts``: one result at a time."""
    output.outputs = tuple({"output_type": "display_data", "data": bundle(part), "metadata": {}}
                           for part in parts)
