"""The exercise widgets: a hint ladder that opens one hint per click, the progress table,
and a verdict that shows a wrong tile as the error heat map.

Like every widget here each has a Python API that tests drive (``HintWidget.click()``
is the button), and displays with a static stand-in for viewers that cannot draw
widgets; the stand-in keeps hints folded (``<details>``), so reading a committed
notebook does not give them away.
"""
from __future__ import annotations

import html

import ipywidgets as w

from ..learn.exercises import list_exercises
from ..learn.exercises.hints import HintLadder
from ..learn.exercises.model import Verdict
from .render import part_html


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


def progress_table_html(progress_file=None) -> str:
    rows = list_exercises(progress_file)
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

    def __init__(self, progress_file=None):
        self.progress_file = progress_file
        self.table = w.HTML(progress_table_html(progress_file))
        self.button = w.Button(description="refresh")
        self.button.on_click(lambda _button: self.refresh())
        self.widget = w.VBox([self.table, self.button])

    def refresh(self) -> str:
        self.table.value = progress_table_html(self.progress_file)
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
        from .heatmap import error_heatmap
        parts.append(error_heatmap(failing))
    return parts


def verdict_html(verdict: Verdict) -> str:
    return "".join(part_html(p) for p in verdict_parts(verdict))
