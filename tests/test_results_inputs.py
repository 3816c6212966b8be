"""Results files that are damaged, hostile or shared: every error names the file, no bad
number gets in, two writers never break a file, one bad shipped file hides nothing."""
from __future__ import annotations

import dataclasses
import json
import os

import pytest

from workbench import results
from workbench.results import ResultsFormatError


def _json(path, **change):
    row = {**dataclasses.asdict(_row()), **change}
    path.write_text(json.dumps({"schema": results.SCHEMA, "version": results.VERSION, "rows": [row]}))
    return path


def _csv(path, **change):
    row = {**dataclasses.asdict(_row()), **change}
    path.write_text(",".join(results.FIELDS) + "\n"
                    + ",".join("" if row[f] is None else str(row[f]) for f in results.FIELDS) + "\n")
    return path


def _row():
    return results.ResultRow(op="gemm", rung="v2", name="triton_tile", shape="64x64x64",
                             dtype="float16", ms=0.5, tflops=1.0, gbps=2.0, ratio_to_ref=0.8,
                             gpu="AMD Instinct MI300X", backend="hip", arch="gfx942",
                             torch_version="2.13.0", triton_version="3.9.0", commit="abc",
                             timestamp="2026-11-30T12:00:00+00:00")


def _refused(path, message):
    with pytest.raises(ResultsFormatError, match=message) as caught:
        results.load(path)
    assert str(path) in str(caught.value)


@pytest.mark.parametrize("ms", [float("nan"), float("inf"), "inf", "0.5", -5, True, 0, 10**400])
def test_a_bad_ms_in_json_is_refused(tmp_path, ms):
    _refused(_json(tmp_path / "r.json", ms=ms), "row 0: field 'ms' must be")


@pytest.mark.parametrize("ms", ["nan", "inf", "-inf", "-5", "0"])
def test_a_bad_ms_in_csv_is_refused(tmp_path, ms):
    _refused(_csv(tmp_path / "r.csv", ms=ms), "line 2: field 'ms'")


@pytest.mark.parametrize("field, value", [("tflops", -1.0), ("gbps", float("nan")),
                                          ("ratio_to_ref", "1.2"), ("gpu", None), ("op", 5)])
def test_other_bad_fields_in_json_are_refused(tmp_path, field, value):
    _refused(_json(tmp_path / "r.json", **{field: value}), f"field '{field}' must be")


def test_whole_numbers_load_as_floats(tmp_path):
    row = results.load(_json(tmp_path / "r.json", tflops=3))[0]
    assert row.tflops == 3.0 and type(row.tflops) is float


@pytest.mark.parametrize("suffix", [".json", ".csv"])
def test_binary_files_are_refused(tmp_path, suffix):
    path = tmp_path / f"r{suffix}"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00\x00")
    _refused(path, "not a text file")


def test_an_oversized_csv_field_is_refused(tmp_path):
    path = tmp_path / "r.csv"
    path.write_text(",".join(results.FIELDS) + "\n" + "x" * 200_000 + "\n")
    _refused(path, "not valid CSV")


@pytest.mark.parametrize("suffix", [".json", ".csv"])
def test_oversized_files_are_refused_before_reading(tmp_path, suffix):
    path = tmp_path / f"r{suffix}"
    with path.open("wb") as fh:
        fh.truncate(results.MAX_BYTES + 1)   # sparse: no disk space, no memory
    _refused(path, "more than a results file holds")


def test_deeply_nested_json_is_refused(tmp_path):
    path = tmp_path / "r.json"
    path.write_text("[" * 200_000 + "]" * 200_000)
    _refused(path, "not valid JSON")


def test_a_folder_is_refused(tmp_path):
    (tmp_path / "r.json").mkdir()
    _refused(tmp_path / "r.json", "a folder, not a results file")


def test_two_recorders_on_one_path_leave_a_whole_file(tmp_path, monkeypatch):
    """The second recorder saves between the first's temporary file and its rename."""
    path = tmp_path / "rows.json"
    first, second = results.Recorder(path), results.Recorder(path)
    rename = os.replace

    def interleaved(src, dst):
        monkeypatch.setattr(os, "replace", rename)
        second.add(dataclasses.replace(_row(), rung="v3"))
        rename(src, dst)
    monkeypatch.setattr(os, "replace", interleaved)
    first.add(_row())
    assert results.load(path) == [_row()]
    assert [p.name for p in tmp_path.iterdir()] == ["rows.json"]   # no temporary file left


def test_a_corrupt_shipped_file_is_skipped_with_a_warning(tmp_path, monkeypatch):
    results.save([_row()], tmp_path / "mi300x.json")
    (tmp_path / "broken.json").write_text("{not json")
    monkeypatch.setattr(results, "_recorded_dir", lambda: tmp_path)
    with pytest.warns(UserWarning, match="broken.json: not valid JSON"):
        listing = results.recorded()
    assert [item["file"] for item in listing] == ["mi300x.json"]
    with pytest.warns(UserWarning, match="broken.json"):
        assert results.load_recorded("MI300X") == [_row()]
