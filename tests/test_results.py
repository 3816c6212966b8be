"""Results files: tidy rows round-trip; anything corrupt or foreign is refused clearly."""
from __future__ import annotations

import dataclasses
import json
import pickle

import pytest

from workbench import results
from workbench.results import ResultRow, ResultsFormatError


def _row(**change) -> ResultRow:
    base = dict(op="gemm", rung="v2", name="triton_tile", shape="4096x4096x4096", dtype="bfloat16",
                ms=0.5, tflops=274.9, gbps=201.3, ratio_to_ref=0.8, gpu="AMD Instinct MI300X",
                backend="hip", arch="gfx942", torch_version="2.13.0", triton_version="3.9.0",
                commit="abc123", timestamp="2026-11-30T12:00:00+00:00")
    return ResultRow(**{**base, **change})


@pytest.mark.parametrize("suffix", [".json", ".csv"])
def test_round_trip(tmp_path, suffix):
    rows = [_row(), _row(rung="ref", name="ref", ms=0.4, ratio_to_ref=1.0)]
    assert results.load(results.save(rows, tmp_path / f"r{suffix}")) == rows


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize("text, message", [
    ("{not json", "not valid JSON"),
    (json.dumps({"rows": []}), "not a workbench results file"),
    (json.dumps([1, 2]), "not a workbench results file"),
    (json.dumps({"schema": results.SCHEMA, "version": 99, "rows": []}), "schema version 99"),
    (json.dumps({"schema": results.SCHEMA, "version": 1, "rows": {}}), "'rows' must be a list"),
    (json.dumps({"schema": results.SCHEMA, "version": 1, "rows": [{"op": "gemm"}]}), "missing fields"),
])
def test_corrupt_or_foreign_json_is_refused(tmp_path, text, message):
    with pytest.raises(ResultsFormatError, match=message):
        results.load(_write(tmp_path, "bad.json", text))


def test_bad_field_type_names_the_field(tmp_path):
    row = dataclasses.asdict(_row())
    row["ms"] = "fast"
    doc = {"schema": results.SCHEMA, "version": 1, "rows": [row]}
    with pytest.raises(ResultsFormatError, match="field 'ms'"):
        results.load(_write(tmp_path, "bad.json", json.dumps(doc)))


def test_unknown_field_is_refused(tmp_path):
    row = {**dataclasses.asdict(_row()), "secret": 1}
    doc = {"schema": results.SCHEMA, "version": 1, "rows": [row]}
    with pytest.raises(ResultsFormatError, match="unknown fields \\['secret'\\]"):
        results.load(_write(tmp_path, "bad.json", json.dumps(doc)))


def test_csv_with_foreign_header_is_refused(tmp_path):
    with pytest.raises(ResultsFormatError, match="CSV header"):
        results.load(_write(tmp_path, "bad.csv", "a,b\n1,2\n"))


def test_pickles_are_never_loaded(tmp_path):
    path = tmp_path / "rows.pkl"
    path.write_bytes(pickle.dumps([_row()]))
    with pytest.raises(ValueError, match=".json or .csv"):
        results.load(path)


def test_recorded_results_are_listed_and_filtered_by_gpu(tmp_path, monkeypatch):
    results.save([_row()], tmp_path / "mi300x.json")
    results.save([_row(gpu="NVIDIA H200", backend="cuda", arch="sm_90")], tmp_path / "h200.json")
    monkeypatch.setattr(results, "_recorded_dir", lambda: tmp_path)
    listing = results.recorded()
    assert {item["gpu"] for item in listing} == {"AMD Instinct MI300X", "NVIDIA H200"}
    assert all(item["date"] == "2026-11-30" and item["rows"] == 1 for item in listing)
    assert [r.gpu for r in results.load_recorded("mi300x")] == ["AMD Instinct MI300X"]
    assert len(results.load_recorded()) == 2


def test_shipped_recorded_files_are_valid():
    for item in results.recorded():   # every shipped file passes the schema check
        assert item["rows"] > 0, item["file"]
