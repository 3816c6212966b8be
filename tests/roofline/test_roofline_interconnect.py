"""GPU-to-GPU fabric numbers: sourced, consistent, validated like every other spec field."""

import pytest
import yaml

import roofline


@pytest.mark.parametrize("name, links, link, total", [
    ("MI300X", 7, 128, 896), ("MI325X", 7, 128, 896), ("MI355X", 7, 153.6, 1075.2),
    ("H200 SXM", 18, 50, 900),
])
def test_fabric_numbers(name, links, link, total):
    fabric = roofline.spec(name).interconnect
    assert (fabric["links"], fabric["link_gbps"], fabric["total_gbps"]) == (links, link, total)
    assert fabric["links"] * fabric["link_gbps"] == pytest.approx(fabric["total_gbps"])


@pytest.mark.parametrize("name", roofline.gpus())
def test_every_fabric_number_has_a_source(name):
    spec = roofline.spec(name)
    assert spec.interconnect, f"{name} has no interconnect data"
    for key in spec.interconnect:
        assert set(spec.provenance[f"interconnect.{key}"].source) <= set(spec.sources)


def test_uncertain_fabric_numbers_stay_flagged():
    assert "interconnect.link_gbps" in roofline.spec("MI355X").uncertain
    assert "interconnect.link_gbps" in roofline.spec("MI325X").uncertain
    assert "interconnect.total_gbps" in roofline.spec("MI300X").derived


def _file(tmp_path, interconnect):
    n = lambda v: {"value": v, "source": ["D1"]}  # noqa: E731
    data = {"name": "FabricGPU", "vendor": "AMD", "arch": "CDNA3", "target": "gfx942",
            "sources": {"D1": "test datasheet"}, "wave_size": n(64), "compute_units": n(10),
            "clock_ghz": n(2.0), "peak_tflops": {"bf16": n(100.0)},
            "bandwidth_tbps": {"hbm": n(2.0)}, "interconnect": interconnect}
    path = tmp_path / "f.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def test_user_file_fabric_is_optional_and_validated(tmp_path):
    ok = roofline.load_spec(_file(tmp_path, {"links": {"value": 4, "source": ["D1"]}}))
    assert dict(ok.interconnect) == {"links": 4}
    with pytest.raises(ValueError, match=r"'interconnect'.*unknown key.*lanes"):
        roofline.load_spec(_file(tmp_path, {"lanes": {"value": 4, "source": ["D1"]}}))
    with pytest.raises(ValueError, match=r"interconnect.total_gbps.*source"):
        roofline.load_spec(_file(tmp_path, {"total_gbps": {"value": 4}}))
