"""A heat map of a correctness check's per-element error, small enough to draw.

Large outputs are max-pooled onto a grid of at most ``cells`` x ``cells``: the maximum,
not the mean, so one wrong element still lights up its cell. Colour is the error as a
multiple of the allowed error, so "over 1" means "over the bound" whatever the dtype.
Cells are whole pixels and carry no ARIA labels: the SVG of a 32 x 32 map stays near
100 KB instead of 300 KB, which matters in a committed notebook.
"""
from __future__ import annotations

import altair as alt
import torch
import torch.nn.functional as F

from ..harness.check import CheckReport
from ..harness.error_pattern import as_matrix


def _edges(size: int, bins: int) -> list[int]:
    """First index of each adaptive-pooling bin (the formula adaptive_max_pool2d uses)."""
    return [(i * size) // bins for i in range(bins)]


# A NaN or inf where the reference has none (or the reverse) has no finite error; the
# harness marks it inf, and the map draws it as this many times the bound.
WRONG_PATTERN_X_ALLOWED = 1000.0


def pooled_error(report: CheckReport, cells: int = 32) -> list[dict]:
    """One row per cell: first row/column index of the cell, its max error, error/allowed."""
    allowed = report.allowed or float("inf")
    matrix = as_matrix(report.error_map.double().nan_to_num(
        0.0, posinf=WRONG_PATTERN_X_ALLOWED * allowed))
    rows, cols = min(cells, matrix.shape[0]), min(cells, matrix.shape[1])
    pooled = F.adaptive_max_pool2d(matrix[None, None], (rows, cols))[0, 0]
    row_at, col_at = _edges(matrix.shape[0], rows), _edges(matrix.shape[1], cols)
    return [{"row": row_at[i], "col": col_at[j], "error": float(pooled[i, j]),
             "x_allowed": float(pooled[i, j]) / allowed}
            for i in range(rows) for j in range(cols)]


def error_heatmap(report: CheckReport, cells: int = 32, size: int = 360) -> alt.Chart:
    if report.error_map is None:
        raise ValueError("this report has no error map")
    values = pooled_error(report, cells)
    top = max(1.0, *(v["x_allowed"] for v in values))   # 1 = the bound: a pass stays pale
    step = max(4, size // max(len({v["row"] for v in values}), len({v["col"] for v in values})))
    subtitle = [f"|x - ref| / max|ref| per element, coloured as a multiple of the allowed "
                f"{report.allowed:.2e}; output {tuple(report.error_map.shape)}"]
    if max(as_matrix(report.error_map).shape) > cells:
        subtitle.append(f"max-pooled onto {cells}x{cells} cells (axis labels: first index)")
    if report.finding:   # the finding the command line prints, one clause a line
        subtitle.extend(report.finding.split("; "))
    return alt.Chart(alt.Data(values=values), name="error_map").mark_rect(aria=False).encode(
        x=alt.X("col:O", title="column", axis=alt.Axis(labelOverlap=True)),
        y=alt.Y("row:O", title="row", axis=alt.Axis(labelOverlap=True)),
        color=alt.Color("x_allowed:Q", title="x allowed",
                        scale=alt.Scale(type="symlog", scheme="orangered", domain=[0, top])),
        tooltip=[alt.Tooltip("row:O"), alt.Tooltip("col:O"),
                 alt.Tooltip("error:Q", format=".2e"),
                 alt.Tooltip("x_allowed:Q", title="x allowed", format=".2f")],
    ).properties(width=alt.Step(step), height=alt.Step(step), title=alt.TitleParams(
        f"error map: {report.op} {report.rung} {report.dtype}", subtitle=subtitle))
