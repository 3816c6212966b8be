"""The roofline chart's Vega-Lite spec, and PNG/SVG export through vl-convert."""

import pytest

pytest.importorskip("altair", reason="the notebook extra is not installed (e.g. on a bare GPU image)")

import roofline

MI300X = roofline.spec("MI300X")
CEILINGS = {"gpu": "AMD Instinct MI300X", "date": "2026-11-30", "hbm_tbps": 4.2,
            "peak_tflops": {"bf16": 700.0}}


def _points():
    flops, nbytes = 2 * 4096**3, 3 * 2 * 4096**2
    return [roofline.point(MI300X, "ref", flops, nbytes, 0.2, "bf16", "recorded",
                           op="gemm", shape="4096x4096x4096", date="2026-11-01"),
            roofline.point(MI300X, "v0_naive", flops, nbytes, 40.0, "bf16", "model",
                           op="gemm", shape="4096x4096x4096")]


def _layers(chart):
    return {layer["name"]: layer for layer in chart.to_dict()["layer"]}


def _lines(layer):
    """Roof label -> its two end points (x, y)."""
    lines = {}
    for row in layer["data"]["values"]:
        lines.setdefault(row["roof"], []).append((row["x"], row["y"]))
    return lines


def test_layers_and_log_scales():
    layers = _layers(roofline.chart(MI300X, _points()))
    assert set(layers) == {"roofs", "ridges", "ridge_labels", "points", "point_labels"}
    assert layers["roofs"]["mark"]["type"] == "line"
    assert layers["ridge_labels"]["mark"]["type"] == "text"
    for layer in layers.values():
        assert layer["encoding"]["x"]["scale"]["type"] == "log"
        assert layer["encoding"]["y"]["scale"]["type"] == "log"
    assert layers["points"]["encoding"]["x"]["field"] == "intensity"
    assert layers["points"]["encoding"]["y"]["field"] == "tflops"


def test_one_memory_roof_per_bandwidth_and_one_compute_roof_per_dtype():
    lines = _lines(_layers(roofline.chart(MI300X, dtypes=["bf16", "fp32", "fp8"]))["roofs"])
    assert len(lines) == len(set(MI300X.memory_levels.values())) + 3
    names = {"hbm": "HBM", "llc": "LLC (MALL)", "l2": "L2", "l1": "L1", "lds": "LDS"}
    for level, bw in MI300X.memory_levels.items():
        (label,) = [k for k in lines if f" {bw:g} TB/s" in k
                    and names[level] in k.split(f" {bw:g} TB/s")[0].split(" = ")]
        for x, y in lines[label]:
            assert y == pytest.approx(bw * x)           # a memory roof: y = bw * x
    for dtype in ("bf16", "fp32", "fp8"):
        (label,) = [k for k in lines if k.startswith(f"{dtype} ")]
        assert {y for _, y in lines[label]} == {MI300X.peak_tflops[dtype]}


def test_levels_with_equal_bandwidth_share_one_line_named_for_both():
    assert MI300X.memory_levels["l1"] == MI300X.memory_levels["lds"]   # why this test exists
    lines = _lines(_layers(roofline.chart(MI300X, dtypes=["bf16"]))["roofs"])
    assert "L1 = LDS 81.7 TB/s · model" in lines
    assert not [k for k in lines if k.startswith(("L1 81", "LDS 81"))]
    memory = [tuple(v) for k, v in lines.items() if "TB/s" in k]
    assert len(memory) == len(set(memory))             # no line drawn over another


def test_model_and_uncertain_roofs_are_labelled():
    lines = _lines(_layers(roofline.chart(MI300X, dtypes=["bf16"]))["roofs"])
    assert "HBM 5.3 TB/s · datasheet" in lines
    assert "L1 = LDS 81.7 TB/s · model" in lines      # derived from per-clock rates
    assert "L2 34.4 TB/s · model (uncertain)" in lines           # and flagged uncertain
    assert "bf16 1307.4 TFLOP/s · datasheet" in lines


def test_ridge_points_sit_at_peak_over_bandwidth():
    layers = _layers(roofline.chart(MI300X, dtypes=["bf16", "fp32"]))
    ridges = {r["dtype"]: r for r in layers["ridges"]["data"]["values"]}
    for dtype in ("bf16", "fp32"):
        assert ridges[dtype]["x"] == pytest.approx(MI300X.peak_tflops[dtype] / 5.3)
        assert ridges[dtype]["y"] == MI300X.peak_tflops[dtype]
        assert ridges[dtype]["level"] == "hbm"
    assert layers["ridge_labels"]["encoding"]["text"]["field"] == "label"
    assert "bf16 ridge 247 FLOP/B" in {r["label"] for r in layers["ridges"]["data"]["values"]}


def test_point_tooltips_and_percent_of_roof():
    layers = _layers(roofline.chart(MI300X, _points()))
    fields = {t["field"] for t in layers["points"]["encoding"]["tooltip"]}
    assert {"rung", "shape", "dtype", "ms", "tflops", "pct_of_roof", "source"} <= fields
    rows = {r["rung"]: r for r in layers["points"]["data"]["values"]}
    ref = rows["ref"]
    expected = roofline.percent_of_roof(MI300X, ref["intensity"], "bf16", ref["tflops"])
    assert ref["pct_of_roof"] == pytest.approx(expected)
    assert ref["bound"] == "compute" and rows["v0_naive"]["source"] == "model"
    assert layers["points"]["encoding"]["shape"]["field"] == "source"


def test_axis_domain_covers_points_and_ridges():
    layers = _layers(roofline.chart(MI300X, _points(), dtypes=["bf16", "fp32"]))
    lo, hi = layers["roofs"]["encoding"]["x"]["scale"]["domain"]
    xs = [r["intensity"] for r in layers["points"]["data"]["values"]] + \
        [r["x"] for r in layers["ridges"]["data"]["values"]]
    assert lo < min(xs) and max(xs) < hi
    y_lo, y_hi = layers["roofs"]["encoding"]["y"]["scale"]["domain"]
    assert y_lo < min(r["tflops"] for r in layers["points"]["data"]["values"]) and \
        y_hi > 1307.4


def test_measured_ceilings_are_dashed_beside_the_datasheet():
    chart = roofline.chart(MI300X, _points(), ceilings=CEILINGS)
    roofs = _layers(chart)["roofs"]
    measured = [r for r in roofs["data"]["values"] if r["kind"] == "measured"]
    lines = {}
    for r in measured:
        lines.setdefault(r["roof"], []).append((r["x"], r["y"]))
    assert set(lines) == {"HBM 4.20 TB/s · measured", "bf16 700 TFLOP/s · measured"}
    assert all(y == pytest.approx(4.2 * x) for x, y in lines["HBM 4.20 TB/s · measured"])
    dash = roofs["encoding"]["strokeDash"]["scale"]
    assert dash["range"][dash["domain"].index("measured")] != [1, 0]
    assert "measured" in chart.to_dict()["title"]["subtitle"][-1]


def test_title_names_the_gpu_and_the_model():
    title = roofline.chart("H100", dtypes=["fp8"]).to_dict()["title"]
    assert title["text"] == "H100 SXM roofline"
    assert "datasheet" in title["subtitle"][0] and "model" in title["subtitle"][0]


def test_default_dtypes_follow_the_points():
    lines = _lines(_layers(roofline.chart(MI300X, _points()))["roofs"])
    assert [k for k in lines if "TFLOP/s" in k] == ["bf16 1307.4 TFLOP/s · datasheet"]


@pytest.mark.parametrize("kwargs, error", [
    ({"dtypes": ["fp8"], "gpu": "MI250X"}, ValueError),
    ({"levels": ["l3"]}, ValueError),
    ({"levels": ["lds"], "gpu": "H100"}, ValueError),
    ({"ceilings": {"gpu": "x", "date": "d", "hbm_tbps": -1}}, ValueError),
    ({"ceilings": {"gpu": "x", "date": "d", "peak_tflops": {"fp12": 1}}}, ValueError),
    ({"ceilings": {"hbm_tbps": 1.0}}, ValueError),
])
def test_chart_rejects_bad_arguments(kwargs, error):
    gpu = kwargs.pop("gpu", MI300X)
    with pytest.raises(error):
        roofline.chart(gpu, **kwargs)


def test_levels_can_be_chosen():
    lines = _lines(_layers(roofline.chart(MI300X, dtypes=["bf16"], levels=["lds", "hbm"]))
                   ["roofs"])
    assert sorted(lines) == ["HBM 5.3 TB/s · datasheet", "LDS 81.7 TB/s · model",
                             "bf16 1307.4 TFLOP/s · datasheet"]


def test_svg_and_png_export(tmp_path):
    chart = roofline.chart(MI300X, _points(), ceilings=CEILINGS)
    svg = roofline.save_chart(chart, tmp_path / "roof.svg").read_text(encoding="utf-8")
    assert svg.lstrip().startswith("<svg") and svg.rstrip().endswith("</svg>")
    assert "MI300X roofline" in svg and "bf16 ridge 247 FLOP/B" in svg
    png = roofline.save_chart(chart, tmp_path / "roof.PNG").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width = int.from_bytes(png[16:20], "big")
    assert width > 600                                   # rendered at scale 2, not empty
    with pytest.raises(ValueError, match="unsupported format"):
        roofline.save_chart(chart, tmp_path / "roof.pdf")
