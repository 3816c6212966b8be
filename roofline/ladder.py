"""The ladder chart: TFLOP/s per rung, with each rung's speed relative to the ``ref`` rung.

The library baseline (rung ``ref``) is what a rung has to beat, so it is required in every
group (op, shape, dtype, GPU), always drawn first, and every ratio is taken against the
``ref`` of the same group: comparing across shapes, dtypes or GPUs would be meaningless.
"""

import altair as alt

REQUIRED = ("op", "rung", "shape", "dtype", "tflops", "ms", "source", "gpu")


def _group(row):
    return (row["op"], row["shape"], row["dtype"], row["gpu"])


def ladder_rows(rows) -> list:
    """Copies of ``rows`` with ``ratio`` (to ref), ``ratio_label`` and ``group`` added."""
    rows = [dict(r) for r in rows]
    if not rows:
        raise ValueError("ladder_chart needs at least one row")
    refs, seen = {}, set()
    for i, row in enumerate(rows):
        missing = [k for k in REQUIRED if k not in row]
        if missing:
            raise ValueError(f"row {i} lacks {missing}; rows need {', '.join(REQUIRED)}")
        key = _group(row) + (row["rung"],)
        if key in seen:
            raise ValueError(f"rung {row['rung']!r} appears twice for op/shape/dtype/gpu "
                             f"{_group(row)}")
        seen.add(key)
        if row["rung"] == "ref":
            refs[_group(row)] = row["tflops"]
    for row in rows:
        ref = refs.get(_group(row))
        if not ref:
            raise ValueError(f"no 'ref' row (with TFLOP/s > 0) for op/shape/dtype/gpu "
                             f"{_group(row)}: the library baseline is in every ladder")
        row["ratio"] = row["tflops"] / ref
        row["ratio_label"] = f"{row['ratio']:.3g}x ref"
        row["group"] = " · ".join(str(v) for v in _group(row))
    return rows


def ladder_chart(rows, width=420, height=220):
    """Bars of TFLOP/s per rung, labelled with the ratio to ``ref``; one panel per group."""
    rows = ladder_rows(rows)
    order = list(dict.fromkeys(["ref"] + [r["rung"] for r in rows]))
    x = alt.X("rung:N", sort=order, title="rung", axis=alt.Axis(labelAngle=0))
    y = alt.Y("tflops:Q", title="TFLOP/s")
    tips = [alt.Tooltip("rung:N"), alt.Tooltip("shape:N"), alt.Tooltip("dtype:N"),
            alt.Tooltip("tflops:Q", title="TFLOP/s", format=".1f"),
            alt.Tooltip("ms:Q", format=".4f"),
            alt.Tooltip("ratio:Q", title="x ref", format=".2f"),
            alt.Tooltip("source:N"), alt.Tooltip("gpu:N")]
    bars = alt.Chart(name="bars").mark_bar().encode(
        x=x, y=y, color=alt.Color("source:N", title="source"), tooltip=tips)
    text = alt.Chart(name="ratios").mark_text(dy=-5, fontSize=10).encode(
        x=x, y=y, text="ratio_label:N")
    return alt.layer(bars, text, data=alt.Data(values=rows)).properties(
        width=width, height=height).facet(
        row=alt.Row("group:N", title=None)).resolve_scale(y="independent").properties(
        title="TFLOP/s per rung (label: speed relative to ref, same shape/dtype/GPU)")
