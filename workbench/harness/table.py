"""Tables for the terminal (plain text) and for notebooks (HTML), with no extra dependency."""
from __future__ import annotations

import html

from typing import Iterable, Sequence


def dtype_label(dtype) -> str:
    """A torch dtype as tables, reports and result rows spell it: "bfloat16", not "torch.bfloat16"."""
    return str(dtype).removeprefix("torch.")


def _cell(value) -> str:
    if value is None:      # not measured: a dash, so it never reads as a zero
        return "–"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1e4 else f"{value:.0f}"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def format_table(rows: Iterable[dict], columns: Sequence[str] | None = None) -> str:
    rows = list(rows)
    if not rows:
        return "(no rows)"
    columns = list(columns or rows[0].keys())
    cells = [[_cell(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    line = "  ".join(c.ljust(w) for c, w in zip(columns, widths))
    rule = "  ".join("-" * w for w in widths)
    body = ["  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join([line, rule, *body])


def html_table(rows: list[dict], columns: list[str] | None = None, caption: str = "") -> str:
    """A plain HTML table; None shows as a dash so "not measured" never looks like a zero."""
    if not rows:
        return f"<p>{html.escape(caption)}: (no rows)</p>" if caption else "<p>(no rows)</p>"
    columns = list(columns or rows[0])
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(
        f"<td>{html.escape(_cell(r.get(c)))}</td>" for c in columns)
        + "</tr>" for r in rows)
    title = f"<caption>{html.escape(caption)}</caption>" if caption else ""
    return f"<table>{title}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
