"""The part every widget shares: controls in a box, a run button, and an output area.

A widget is driven two ways that must agree: by clicking (the button reads the controls)
and through Python (``set`` writes the controls, ``run`` reads them back). Because both
go through the controls, a notebook or a test sees exactly what a user would.
"""
from __future__ import annotations

import html

import ipywidgets as w

from .render import show


class Panel:
    """Base of the widgets: subclasses build controls, implement ``compute`` and ``parts``."""

    def __init__(self, title: str, controls: list[w.Widget], extras: list[w.Widget] = ()):
        self.button = w.Button(description="run", button_style="primary")
        self.status = w.HTML()
        self.output = w.Output()
        self.result = None
        self.button.on_click(self._clicked)
        self.widget = w.VBox([w.HTML(f"<b>{html.escape(title)}</b>"), *controls, self.button,
                              *extras, self.status, self.output])

    def run(self):
        """Compute from the current control values, show the result, and return it."""
        return self._run(static=True)

    def _clicked(self, _button) -> None:
        try:
            self._run(static=False)
        except Exception as error:  # a click has no caller to raise to: show the reason
            self.status.value = f"<b>failed:</b> {html.escape(str(error))}"

    def _run(self, static: bool):
        self.status.value = "running…"
        self.result = self.compute()
        self.status.value = ""
        show(self.output, self.result.parts(), static)
        return self.result

    def compute(self):
        raise NotImplementedError
