"""The roofline chart: log-log roofs per memory level and per dtype, ridges, and rung points.

Everything drawn from a spec is a model (the datasheet roofs) and is labelled so; numbers
computed from per-clock formulas rather than quoted are labelled ``model``; measured
ceilings, when given, are drawn dashed beside them so the gap between the datasheet and
what the chip really sustains is visible. Ridges are marked against the slowest memory
level shown (normally HBM), because rung intensities are computed from HBM traffic.
"""

import math

import altair as alt

from .dtypes import dtype_name
from .measured import check_ceilings
from .model import bound, percent_of_roof
from .points import SOURCES
from .registry import spec as _spec
from .spec import LEVELS

KINDS = ("datasheet", "model", "measured")
_DASHES = ([1, 0], [2, 2], [6, 4])
_LEVEL_NAMES = {"hbm": "HBM", "llc": "LLC (MALL)", "l2": "L2", "l1": "L1", "lds": "LDS"}
_X_TITLE = "arithmetic intensity (FLOP/byte)"
_Y_TITLE = "TFLOP/s (TOPS for int8)"


def _decade_below(x):
    return 10.0 ** math.floor(math.log10(x))


def _decade_above(x):
    return 10.0 ** math.ceil(math.log10(x))


def _datasheet_label(gpu, fields, text):
    """A roof's kind and legend label: "model" or "(uncertain)" if any of its fields is."""
    kind = "model" if any(f in gpu.derived for f in fields) else "datasheet"
    flag = " (uncertain)" if any(f in gpu.uncertain for f in fields) else ""
    return kind, f"{text} · {kind}{flag}"


def _levels_by_bandwidth(gpu, levels):
    """Levels grouped by equal bandwidth, slowest first: levels with the same bandwidth
    (MI300X's L1 and LDS) would draw the same line, one hiding the other, so they share
    one line labelled with both ("L1 = LDS 81.7 TB/s")."""
    groups = {}
    for level in levels:
        groups.setdefault(gpu.bandwidth(level), []).append(level)
    return groups.items()


def _unit(dtype):
    return "TOPS" if dtype == "int8" else "TFLOP/s"


def _line(label, kind, start, end):
    return [{"roof": label, "kind": kind, "x": x, "y": y} for x, y in (start, end)]


def _roof_rows(gpu, peaks, levels, measured, x_lo, x_hi):
    """Two end points per roof; on log-log axes each roof is a straight segment."""
    rows, top = [], max(peaks.values())
    for bw, group in _levels_by_bandwidth(gpu, levels):
        names = " = ".join(_LEVEL_NAMES[level] for level in group)
        kind, label = _datasheet_label(gpu, [f"bandwidth_tbps.{level}" for level in group],
                                       f"{names} {bw:g} TB/s")
        rows += _line(label, kind, (x_lo, bw * x_lo), (top / bw, top))
    fastest = gpu.bandwidth(levels[-1])
    for dtype, peak in peaks.items():
        kind, label = _datasheet_label(gpu, [f"peak_tflops.{dtype}"],
                                       f"{dtype} {peak:g} {_unit(dtype)}")
        rows += _line(label, kind, (peak / fastest, peak), (x_hi, peak))
    if measured:
        m_peaks = {d: v for d, v in measured["peak_tflops"].items() if d in peaks}
        m_bw = measured.get("hbm_tbps")
        if m_bw:
            m_top = max(m_peaks.values(), default=top)
            rows += _line(f"HBM {m_bw:.2f} TB/s · measured", "measured",
                          (x_lo, m_bw * x_lo), (m_top / m_bw, m_top))
        for dtype, peak in m_peaks.items():
            rows += _line(f"{dtype} {peak:.0f} {_unit(dtype)} · measured", "measured",
                          (peak / (m_bw or fastest), peak), (x_hi, peak))
    return rows


def _point_rows(gpu, points):
    return [{"rung": p.rung, "op": p.op, "shape": p.shape, "dtype": p.dtype,
             "intensity": p.intensity, "tflops": p.tflops, "ms": p.ms,
             "source": p.source, "gpu": p.gpu, "date": p.date or "",
             "pct_of_roof": percent_of_roof(gpu, p.intensity, p.dtype, p.tflops),
             "bound": bound(gpu, p.intensity, p.dtype)} for p in points]


def chart(gpu, points=(), dtypes=None, levels=None, ceilings=None, width=600, height=400):
    """A layered altair chart of ``gpu``'s roofline with ``points`` placed on it.

    ``dtypes`` defaults to the dtypes of the points (bf16 and fp32 without points);
    ``levels`` to every memory level the spec knows; ``ceilings`` is the measured-ceilings
    dict of ``roofline.check_ceilings`` and is drawn dashed.
    """
    gpu, points = _spec(gpu), list(points)
    if dtypes is None:
        dtypes = list(dict.fromkeys(p.dtype for p in points)) or \
            [d for d in ("bf16", "fp32") if gpu.peak_tflops[d]]
    peaks = {dtype_name(d): gpu.peak(d) for d in dtypes}
    for level in levels or ():
        gpu.bandwidth(level)
    levels = [lvl for lvl in LEVELS if lvl in (levels or gpu.memory_levels)]
    measured = check_ceilings(ceilings) if ceilings is not None else None

    slowest, fastest = gpu.bandwidth(levels[0]), gpu.bandwidth(levels[-1])
    ridges = [{"dtype": d, "level": levels[0], "x": p / slowest, "y": p,
               "label": f"{d} ridge {p / slowest:.0f} FLOP/B"} for d, p in peaks.items()]
    xs = [min(peaks.values()) / fastest] + [r["x"] for r in ridges] + \
        [p.intensity for p in points]
    x_lo, x_hi = _decade_below(min(xs) / 4), _decade_above(max(xs) * 4)
    y_lo = _decade_below(min([slowest * x_lo] + [p.tflops for p in points if p.tflops]))
    y_hi = 2 * max(list(peaks.values()) + [p.tflops for p in points])
    x_scale = alt.Scale(type="log", domain=[x_lo, x_hi], nice=False)
    y_scale = alt.Scale(type="log", domain=[y_lo, y_hi], nice=False)

    layers = [_roof_layer(_roof_rows(gpu, peaks, levels, measured, x_lo, x_hi),
                          x_scale, y_scale), *_ridge_layers(ridges, x_scale, y_scale)]
    if points:
        layers += _point_layers(_point_rows(gpu, points), x_scale, y_scale)
    subtitle = [f"{gpu.vendor} {gpu.arch} ({gpu.target}); roofs are dense datasheet peaks "
                "and bandwidths (model: min(peak, bandwidth x intensity))",
                "model = computed from per-clock rates; (uncertain) = doubted by the sources"]
    if measured:
        subtitle.append(f"dashed: measured on {measured['gpu']}, {measured['date']}")
    return alt.layer(*layers).resolve_scale(
        color="independent", shape="independent", strokeDash="independent").properties(
        title=alt.TitleParams(f"{gpu.name} roofline", subtitle=subtitle),
        width=width, height=height)


def _xy(x_field, y_field, x_scale, y_scale):
    return {"x": alt.X(f"{x_field}:Q", title=_X_TITLE, scale=x_scale),
            "y": alt.Y(f"{y_field}:Q", title=_Y_TITLE, scale=y_scale)}


def _roof_layer(rows, x_scale, y_scale):
    order = list(dict.fromkeys(r["roof"] for r in rows))
    return alt.Chart(alt.Data(values=rows), name="roofs").mark_line(clip=True).encode(
        **_xy("x", "y", x_scale, y_scale),
        color=alt.Color("roof:N", title="roof", sort=order,
                        legend=alt.Legend(labelLimit=400)),
        strokeDash=alt.StrokeDash("kind:N", title="numbers from",
                                  scale=alt.Scale(domain=list(KINDS), range=list(_DASHES))),
        tooltip=[alt.Tooltip("roof:N"), alt.Tooltip("kind:N", title="numbers from")])


def _ridge_layers(ridges, x_scale, y_scale):
    data, xy = alt.Data(values=ridges), _xy("x", "y", x_scale, y_scale)
    tips = [alt.Tooltip("dtype:N"), alt.Tooltip("level:N"),
            alt.Tooltip("x:Q", title="FLOP/byte", format=".1f"),
            alt.Tooltip("y:Q", title="TFLOP/s", format=".1f")]
    marks = alt.Chart(data, name="ridges").mark_point(
        shape="diamond", filled=True, color="black", size=60).encode(**xy, tooltip=tips)
    labels = alt.Chart(data, name="ridge_labels").mark_text(
        align="left", dx=6, dy=-8, fontSize=10).encode(**xy, text="label:N")
    return [marks, labels]


def _point_layers(rows, x_scale, y_scale):
    data, xy = alt.Data(values=rows), _xy("intensity", "tflops", x_scale, y_scale)
    tips = [alt.Tooltip("rung:N"), alt.Tooltip("op:N"), alt.Tooltip("shape:N"),
            alt.Tooltip("dtype:N"), alt.Tooltip("ms:Q", format=".4f"),
            alt.Tooltip("tflops:Q", title="TFLOP/s", format=".1f"),
            alt.Tooltip("intensity:Q", title="FLOP/byte", format=".1f"),
            alt.Tooltip("pct_of_roof:Q", title="% of roof", format=".1f"),
            alt.Tooltip("bound:N"), alt.Tooltip("source:N"), alt.Tooltip("gpu:N"),
            alt.Tooltip("date:N")]
    marks = alt.Chart(data, name="points").mark_point(filled=True, size=90).encode(
        **xy, color=alt.Color("rung:N", title="rung"),
        shape=alt.Shape("source:N", scale=alt.Scale(domain=list(SOURCES))), tooltip=tips)
    labels = alt.Chart(data, name="point_labels").mark_text(
        align="left", dx=7, dy=7, fontSize=10).encode(**xy, text="rung:N")
    return [marks, labels]
