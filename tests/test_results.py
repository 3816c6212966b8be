"""Results files: tidy rows round-trip; anything corrupt or foreign is refused clearly."""
from __future__ import annotations

import dataclasses
import json
import pickle

import pytest

from workbench import results
from workbench.results import ResultsFormatError


@pytest.mark.parametrize("suffix", [".json", ".csv"])
def test_round_trip(tmp_path, suffix, make_row):
    rows = [make_row(), make_row(rung="ref", name="ref", ms=0.4, ratio_to_ref=1.0)]
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


def test_bad_field_type_names_the_field(tmp_path, make_row):
    row = dataclasses.asdict(make_row())
    row["ms"] = "fast"
    doc = {"schema": results.SCHEMA, "version": 1, "rows": [row]}
    with pytest.raises(ResultsFormatError, match="field 'ms'"):
        results.load(_write(tmp_path, "bad.json", json.dumps(doc)))


def test_unknown_field_is_refused(tmp_path, make_row):
    row = {**dataclasses.asdict(make_row()), "secret": 1}
    doc = {"schema": results.SCHEMA, "version": 1, "rows": [row]}
    with pytest.raises(ResultsFormatError, match="unknown fields \\['secret'\\]"):
        results.load(_write(tmp_path, "bad.json", json.dumps(doc)))


def test_csv_with_foreign_header_is_refused(tmp_path):
    with pytest.raises(ResultsFormatError, match="CSV header"):
        results.load(_write(tmp_path, "bad.csv", "a,b\n1,2\n"))


def test_pickles_are_never_loaded(tmp_path, make_row):
    path = tmp_path / "rows.pkl"
    path.write_bytes(pickle.dumps([make_row()]))
    with pytest.raises(ValueError, match=".json or .csv"):
        results.load(path)


def test_recorded_results_are_listed_and_filtered_by_gpu(tmp_path, monkeypatch, make_row):
    results.save([make_row()], tmp_path / "mi300x.json")
    results.save([make_row(gpu="NVIDIA H200", backend="cuda", arch="sm_90")], tmp_path / "h200.json")
    monkeypatch.setattr(results, "_recorded_dir", lambda: tmp_path)
    listing = results.recorded()
    assert {item["gpu"] for item in listing} == {"AMD Instinct MI300X", "NVIDIA H200"}
    assert all(item["date"] == "2026-11-30" and item["rows"] == 1 for item in listing)
    assert [r.gpu for r in results.load_recorded("mi300x")] == ["AMD Instinct MI300X"]
    assert len(results.load_recorded()) == 2


def test_shipped_recorded_files_are_valid():
    for item in results.recorded():   # every shipped file passes the schema check
        assert item["rows"] > 0, item["file"]


def test_no_recorded_folder_means_no_recorded_results(tmp_path, monkeypatch):
    monkeypatch.setattr(results, "_recorded_dir", lambda: tmp_path / "absent")
    assert results.recorded() == [] and results.load_recorded() == []
