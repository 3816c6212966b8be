"""The part every widget shares: controls in a box, a run button, and an output area.

A widget is driven two ways that must agree: by clicking (the button reads the controls)
and through Python (``set`` writes the controls, ``run`` reads them back). Because both
go through the controls, a notebook or a test sees exactly what a user would, and both
put the result in the same place: the Output area, replacing the one before.

Display the panel itself (``panel`` as a cell's last line, or ``display(panel)``), not
``panel.widget``: its display carries a static HTML stand-in of the latest result for
viewers that cannot draw widgets (see :mod:`.render`).
"""
from __future__ import annotations

import html

import ipywidgets as w

from ..views.render import part_html, show


class Panel:
    """Base of the widgets: subclasses build controls, implement ``compute`` and ``parts``."""

    def __init__(self, title: str, controls: list[w.Widget], extras: list[w.Widget] = ()):
        self.title = title
        self.button = w.Button(description="run", button_style="primary")
        self.status = w.HTML()
        self.output = w.Output()
        self.result = None
        self.button.on_click(self._clicked)
        self.widget = w.VBox([w.HTML(f"<b>{html.escape(title)}</b>"), *controls, self.button,
                              *extras, self.status, self.output])

    def run(self):
        """Compute from the current control values, show the result, and return it."""
        self.status.value = "running…"
        self.result = self.compute()
        self.status.value = ""
        show(self.output, self.result.parts())
        return self.result

    def _clicked(self, _button) -> None:
        try:
            self.run()
        except Exception as error:  # a click has no caller to raise to: show the reason
            self.status.value = f"<b>failed:</b> {html.escape(str(error))}"

    def static_html(self) -> str:
        """The latest result as plain HTML (tables, charts as images), for static viewers."""
        parts = self.result.parts() if self.result else ["<p>(not run yet)</p>"]
        return (f"<div><b>{html.escape(self.title)}</b> "
                f"<i>(a static copy of the widget's output: run the notebook to use the "
                f"widget)</i>{''.join(map(part_html, parts))}</div>")

    def _repr_mimebundle_(self, **kwargs) -> dict:
        """The widget for a live frontend; the static copy for any other."""
        return {**self.widget._repr_mimebundle_(**kwargs), "text/html": self.static_html(),
                "text/plain": f"{self.title} (a widget: run the notebook to use it)"}

    def compute(self):
        raise NotImplementedError
