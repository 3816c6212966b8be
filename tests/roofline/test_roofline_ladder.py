"""The ladder chart: TFLOP/s per rung, ratios against the ref of the same group."""

import pytest

pytest.importorskip("altair", reason="the notebook extra is not installed (e.g. on a bare GPU image)")

import roofline
from roofline.ladder import ladder_rows


def _rows():
    def row(rung, tflops, shape="4096^3", gpu="MI300X", source="recorded"):
        return {"op": "gemm", "rung": rung, "shape": shape, "dtype": "bf16",
                "tflops": tflops, "ms": 1.0, "source": source, "gpu": gpu}
    return [row("v0", 5.0), row("v3", 450.0), row("ref", 600.0),
            row("ref", 700.0, shape="8192^3"), row("v3", 350.0, shape="8192^3"),
            row("ref", 400.0, gpu="H100 SXM", source="measured"),
            row("v3", 500.0, gpu="H100 SXM", source="measured")]


def test_ratio_is_against_the_ref_of_the_same_group():
    ratios = {(r["shape"], r["gpu"], r["rung"]): r["ratio"] for r in ladder_rows(_rows())}
    assert ratios[("4096^3", "MI300X", "v3")] == pytest.approx(0.75)
    assert ratios[("4096^3", "MI300X", "v0")] == pytest.approx(5 / 600)
    assert ratios[("8192^3", "MI300X", "v3")] == pytest.approx(0.5)
    assert ratios[("4096^3", "H100 SXM", "v3")] == pytest.approx(1.25)
    assert ratios[("4096^3", "MI300X", "ref")] == 1.0


def test_chart_spec():
    spec = roofline.ladder_chart(_rows()).to_dict()
    assert spec["facet"]["row"]["field"] == "group"
    layers = {layer["name"]: layer for layer in spec["spec"]["layer"]}
    bars, text = layers["bars"], layers["ratios"]
    assert bars["mark"]["type"] == "bar" and text["mark"]["type"] == "text"
    assert bars["encoding"]["x"]["sort"][0] == "ref"          # ref always first
    assert bars["encoding"]["y"]["field"] == "tflops"
    assert text["encoding"]["text"]["field"] == "ratio_label"
    tips = {t["field"] for t in bars["encoding"]["tooltip"]}
    assert {"rung", "shape", "dtype", "tflops", "ms", "ratio", "source", "gpu"} <= tips
    values = spec["data"]["values"]
    assert len(values) == 7 and {v["rung"] for v in values if v["ratio"] == 1.0} == {"ref"}
    assert "0.75x ref" in {v["ratio_label"] for v in values}


def test_missing_ref_is_an_error():
    rows = [r for r in _rows() if not (r["rung"] == "ref" and r["shape"] == "8192^3")]
    with pytest.raises(ValueError, match="no 'ref' row.*8192"):
        roofline.ladder_chart(rows)


@pytest.mark.parametrize("rows, match", [
    ([], "at least one row"),
    ([{"op": "gemm", "rung": "ref"}], "lacks"),
    (_rows() + _rows()[:1], "appears twice"),
])
def test_bad_rows(rows, match):
    with pytest.raises(ValueError, match=match):
        roofline.ladder_chart(rows)


def test_png_export(tmp_path):
    png = roofline.save_chart(roofline.ladder_chart(_rows()), tmp_path / "ladder.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
