"""The exercise widgets: a hint ladder that opens one hint per click, the progress table,
and a verdict that shows a wrong tile as the error heat map.

They live beside the exercises they show, not in ``workbench.widgets``: ``hints(key).widget()``,
``progress_widget()`` and a verdict's notebook display reach them from here, and nothing
of learn may import the widgets package. They take what they show as plain data (a hint
ladder, a verdict, a function that lists the exercises), so this module imports no other
module of the exercises and is loaded only when a widget is asked for.

Like every widget here each has a Python API that tests drive (``HintWidget.click()``
is the button), and displays with a static stand-in for viewers that cannot draw
widgets; the stand-in keeps hints folded (``<details>``), so reading a committed
notebook does not give them away.
"""
from __future__ import annotations

import html
from typing import TYPE_CHECKING, Callable

import ipywidgets as w

from ...views.render import part_html

if TYPE_CHECKING:   # they call on this module; importing them back would be a circle
    from .hint_ladder import HintLadder
    from .model import Verdict


def _button_text(ladder: HintLadder) -> str:
    total = len(ladder.exercise.hints)
    if not ladder.remaining:
        return f"all {total} hints shown"
    return f"Show hint {ladder.shown + 1} of {total}"


def _hints_html(hints: list[str]) -> str:
    return "".join(f"<p><b>Hint {i}.</b> {html.escape(h)}</p>" for i, h in enumerate(hints, 1))


class HintWidget:
    def __init__(self, ladder: HintLadder):
        self.ladder = ladder
        self.button = w.Button(description=_button_text(ladder), button_style="info",
                               layout=w.Layout(width="auto"))
        self.hints = w.HTML(_hints_html(ladder.revealed))
        self.button.disabled = not ladder.remaining
        self.button.on_click(lambda _button: self.click())
        title = f"<b>Hints for {html.escape(ladder.exercise.key)}</b>: {html.escape(ladder.exercise.title)}"
        self.widget = w.VBox([w.HTML(title), self.hints, self.button])

    def click(self) -> str:
        """What pressing the button does: reveal the next hint and show it."""
        hint = self.ladder.reveal()
        self.hints.value = _hints_html(self.ladder.revealed)
        self.button.description = _button_text(self.ladder)
        self.button.disabled = not self.ladder.remaining
        return hint

    def static_html(self) -> str:
        folded = "".join(f"<details><summary>Hint {i}</summary>{html.escape(h)}</details>"
                         for i, h in enumerate(self.ladder.exercise.hints, 1))
        return (f"<div><b>Hints for {html.escape(self.ladder.exercise.key)}</b> "
                f"<i>(run the notebook for the hint button)</i>{folded}</div>")

    def _repr_mimebundle_(self, **kwargs) -> dict:
        return {**self.widget._repr_mimebundle_(**kwargs), "text/html": self.static_html(),
                "text/plain": f"hints for {self.ladder.exercise.key} (a widget: run the notebook to use it)"}


def progress_table_html(rows: list[dict]) -> str:
    """The rows of :func:`workbench.exercises.list_exercises` as an HTML table."""
    body = "".join(
        f"<tr><td>{html.escape(r['key'])}</td><td>{html.escape(r['title'])}</td><td>{r['kind']}</td>"
        f"<td>{'passed' if r['passed'] else ('tried' if r['attempts'] else '')}</td>"
        f"<td>{r['attempts']}</td><td>{r['hints']}</td></tr>" for r in rows)
    passed = sum(r["passed"] for r in rows)
    return (f"<p><b>{passed} of {len(rows)} exercises passed</b></p><table><thead><tr><th>exercise</th>"
            f"<th>title</th><th>kind</th><th>status</th><th>attempts</th><th>hints seen</th></tr>"
            f"</thead><tbody>{body}</tbody></table>")


class ProgressWidget:
    """The learner's progress; ``refresh()`` (the button) re-reads it after a check."""

    def __init__(self, list_rows: Callable[[], list[dict]]):
        self.list_rows = list_rows      # read again on every refresh
        self.table = w.HTML(progress_table_html(list_rows()))
        self.button = w.Button(description="refresh")
        self.button.on_click(lambda _button: self.refresh())
        self.widget = w.VBox([self.table, self.button])

    def refresh(self) -> str:
        self.table.value = progress_table_html(self.list_rows())
        return self.table.value

    def _repr_mimebundle_(self, **kwargs) -> dict:
        return {**self.widget._repr_mimebundle_(**kwargs), "text/html": self.table.value,
                "text/plain": "exercise progress (a widget: run the notebook to use it)"}


def verdict_parts(verdict: Verdict) -> list:
    """The verdict as HTML, then the error heat map of the failing check, if it has one."""
    head = "PASS" if verdict.passed else "FAIL"
    parts = [f"<p><b>{head}</b>: {html.escape(verdict.message)}</p>"
             + "".join(f"<p><i>{html.escape(line)}</i></p>" for line in (verdict.speed, verdict.predicted) if line)]
    failing = verdict.reports[-1] if verdict.reports and not verdict.passed else None
    if failing is not None and not failing.passed and failing.error_map is not None:
        from ...views.heatmap import error_heatmap
        parts.append(error_heatmap(failing))
    return parts


def verdict_html(verdict: Verdict) -> str:
    return "".join(part_html(p) for p in verdict_parts(verdict))
