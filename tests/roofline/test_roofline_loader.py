"""User spec files: load_spec, ROOFLINE_SPECS_DIR, and validation that names file and field."""

import copy

import pytest
import yaml

import roofline


def _valid():
    n = lambda v: {"value": v, "source": ["D1"]}  # noqa: E731
    return {
        "name": "TestGPU", "aliases": ["tgpu"], "vendor": "AMD", "arch": "CDNA3",
        "target": "gfx942", "sources": {"D1": "test datasheet"},
        "wave_size": n(64), "compute_units": n(10), "clock_ghz": n(2.0),
        "peak_tflops": {"bf16": n(100.0), "fp8": {**n(200.0), "format": "e4m3fnuz"},
                        "fp4": n(None)},
        "capacity": {"hbm_gb": n(16)},
        "bandwidth_tbps": {"hbm": n(2.0), "l2": {**n(10.0), "uncertain": "guess"}},
    }


def _write(path, data):
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def test_load_spec_reads_a_user_file(tmp_path):
    s = roofline.load_spec(_write(tmp_path / "t.yaml", _valid()))
    assert s.name == "TestGPU" and s.peak_tflops["bf16"] == 100.0
    assert s.peak_tflops["fp16"] is None and s.peak_tflops["fp4"] is None
    assert s.formats == {"fp8": "e4m3fnuz"}
    assert s.uncertain == {"bandwidth_tbps.l2": "guess"}
    assert s.ridge("bf16") == 50.0 and s.ridge("bf16", "l2") == 10.0
    assert s.sources == {"D1": "test datasheet"}


def _broken(edit):
    data = _valid()
    edit(data)
    return data


CASES = [
    ("name", lambda d: d.pop("name")),
    ("bandwidth_tbps.hbm", lambda d: d["bandwidth_tbps"].pop("hbm")),
    ("peak_tflops", lambda d: d.pop("peak_tflops")),
    ("clock_ghz", lambda d: d["clock_ghz"].update(value=-1.0)),
    ("bandwidth_tbps.hbm", lambda d: d["bandwidth_tbps"]["hbm"].update(value=0)),
    ("peak_tflops", lambda d: d["peak_tflops"].update(fp7={"value": 1, "source": ["D1"]})),
    ("peak_tflops.bf16", lambda d: d["peak_tflops"]["bf16"].update(value="fast")),
    ("peak_tflops.bf16", lambda d: d["peak_tflops"]["bf16"].update(value=True)),
    ("wave_size", lambda d: d["wave_size"].update(value=64.5)),
    ("wave_size", lambda d: d.update(wave_size=64)),
    ("compute_units", lambda d: d["compute_units"].update(value=None)),
    ("clock_ghz", lambda d: d["clock_ghz"].pop("source")),
    ("clock_ghz", lambda d: d["clock_ghz"].update(source=["NOPE"])),
    ("clock_ghz", lambda d: d["clock_ghz"].update(sourse=["D1"])),
    ("capacity", lambda d: d["capacity"].update(hbm_tb={"value": 1, "source": ["D1"]})),
    ("bandwidth_tbps", lambda d: d["bandwidth_tbps"].update(l3={"value": 1, "source": ["D1"]})),
    ("vendor", lambda d: d.update(vendor=3)),
    ("peak_tflops", lambda d: d["peak_tflops"].update(bf16={"value": None, "source": ["D1"]},
                                                      fp8={"value": None, "source": ["D1"]})),
    ("colour", lambda d: d.update(colour="red")),
]


@pytest.mark.parametrize("field, edit", CASES)
def test_invalid_files_name_file_and_field(tmp_path, field, edit):
    path = _write(tmp_path / "bad.yaml", _broken(edit))
    with pytest.raises(ValueError) as err:
        roofline.load_spec(path)
    assert str(path) in str(err.value)
    assert repr(field) in str(err.value)


def test_fixture_is_valid_so_the_cases_test_one_fault_each(tmp_path):
    for _, edit in CASES:
        assert _broken(edit) != _valid()
    roofline.load_spec(_write(tmp_path / "ok.yaml", copy.deepcopy(_valid())))


def test_not_yaml_and_missing_file(tmp_path):
    bad = tmp_path / "x.yaml"
    bad.write_text("name: [unclosed", encoding="utf-8")
    with pytest.raises(ValueError, match="not valid YAML"):
        roofline.load_spec(bad)
    with pytest.raises(ValueError, match="cannot read"):
        roofline.load_spec(tmp_path / "absent.yaml")


def test_yaml_tags_are_not_executed(tmp_path):
    bad = tmp_path / "x.yaml"
    bad.write_text("name: !!python/object/apply:os.system ['true']\n", encoding="utf-8")
    with pytest.raises(ValueError, match="not valid YAML"):
        roofline.load_spec(bad)


def test_specs_dir_adds_a_gpu(tmp_path, monkeypatch):
    _write(tmp_path / "t.yaml", _valid())
    monkeypatch.setenv("ROOFLINE_SPECS_DIR", str(tmp_path))
    assert "TestGPU" in roofline.gpus() and "MI300X" in roofline.gpus()
    assert roofline.spec("tgpu").compute_units == 10


def test_specs_dir_overrides_a_builtin(tmp_path, monkeypatch):
    data = _valid()
    data.update(name="MI300X", aliases=[])
    _write(tmp_path / "mine.yaml", data)
    monkeypatch.setenv("ROOFLINE_SPECS_DIR", str(tmp_path))
    assert roofline.spec("mi300x").hbm_tbps == 2.0
    monkeypatch.delenv("ROOFLINE_SPECS_DIR")
    assert roofline.spec("mi300x").hbm_tbps == 5.3


def test_specs_dir_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("ROOFLINE_SPECS_DIR", str(tmp_path / "nope"))
    with pytest.raises(ValueError, match="ROOFLINE_SPECS_DIR"):
        roofline.gpus()
    data = _valid()
    data["aliases"] = ["H100"]
    _write(tmp_path / "clash.yaml", data)
    monkeypatch.setenv("ROOFLINE_SPECS_DIR", str(tmp_path))
    with pytest.raises(ValueError, match="claimed by both"):
        roofline.spec("MI300X")
    bad = _valid()
    bad["bandwidth_tbps"]["hbm"]["value"] = -2
    _write(tmp_path / "clash.yaml", bad)
    monkeypatch.setenv("ROOFLINE_SPECS_DIR", str(tmp_path) + "/")
    with pytest.raises(ValueError, match="clash.yaml.*bandwidth_tbps.hbm"):
        roofline.gpus()
