"""Results files: tidy rows round-trip; anything corrupt or foreign is refused clearly."""
from __future__ import annotations

import dataclasses
import json
import pickle

import pytest

from workbench import results
from workbench.results import ResultsFormatError
from workbench.harness.table import format_table


def _error_row(make_row, message="RuntimeError: launch failed", **change):
    return make_row(ms=None, tflops=None, gbps=None, ratio_to_ref=None, status="error", error=message,
                    **change)


@pytest.mark.parametrize("suffix", [".json", ".csv"])
def test_round_trip(tmp_path, suffix, make_row):
    rows = [make_row(), make_row(rung="ref", name="ref", ms=0.4, ratio_to_ref=1.0),
            _error_row(make_row, "ValueError: bad\nsecond line, with a comma"),
            make_row(rung="v3", ratio_to_ref=None),       # measured, but ref failed in that run
            make_row(pass_name="backward", ratio_to_ref=1.3),
            _error_row(make_row, pass_name="forward+backward")]
    path = results.save(rows, tmp_path / f"r{suffix}")
    assert results.load(path) == rows
    assert [r.pass_name for r in results.load(path)][-3:] == ["forward", "backward", "forward+backward"]
    if suffix == ".json":
        assert json.loads(path.read_text())["version"] == results.VERSION == 3


@pytest.mark.parametrize("change, message", [
    (dict(ms=None), "a measured row"),
    (dict(error="boom"), "a measured row"),
    (dict(status="error", error="boom"), "an error row has an error message and no numbers"),
    (dict(status="error", ms=None, tflops=None, gbps=None, ratio_to_ref=None),
     "an error row has an error message"),
    (dict(status="skipped"), "status must be 'ok' or 'error'"),
])
def test_inconsistent_rows_are_refused(make_row, change, message):
    with pytest.raises(ValueError, match=message):
        make_row(**change)


def test_inconsistent_row_in_a_file_names_the_row(tmp_path, make_row):
    row = {**dataclasses.asdict(make_row()), "ms": None}
    doc = {"schema": results.SCHEMA, "version": results.VERSION, "rows": [row]}
    with pytest.raises(ResultsFormatError, match="row 0: a measured row"):
        results.load(_write(tmp_path, "bad.json", json.dumps(doc)))


@pytest.mark.parametrize("suffix", [".json", ".csv"])
def test_version_1_files_load_as_measured_rows(tmp_path, suffix, make_row):
    row = {k: v for k, v in dataclasses.asdict(make_row()).items() if k in results.FIELDS_V1}
    if suffix == ".json":
        text = json.dumps({"schema": results.SCHEMA, "version": 1, "rows": [row]})
    else:
        text = ",".join(results.FIELDS_V1) + "\n" + ",".join(str(row[k]) for k in results.FIELDS_V1)
    assert results.load(_write(tmp_path, f"v1{suffix}", text)) == [make_row()]


@pytest.mark.parametrize("suffix", [".json", ".csv"])
def test_version_2_files_load_as_forward_rows(tmp_path, suffix, make_row):
    rows = [dataclasses.asdict(make_row()), dataclasses.asdict(_error_row(make_row))]
    rows = [{k: v for k, v in row.items() if k in results.FIELDS_V2} for row in rows]
    assert "pass_name" not in results.FIELDS_V2 and "status" in results.FIELDS_V2
    if suffix == ".json":
        text = json.dumps({"schema": results.SCHEMA, "version": 2, "rows": rows})
    else:
        text = ",".join(results.FIELDS_V2) + "\n" + "\n".join(
            ",".join("" if row[k] is None else str(row[k]) for k in results.FIELDS_V2) for row in rows)
    loaded = results.load(_write(tmp_path, f"v2{suffix}", text))
    assert loaded == [make_row(), _error_row(make_row)]
    assert {r.pass_name for r in loaded} == {"forward"}


def test_an_unknown_pass_is_refused(make_row):
    with pytest.raises(ValueError, match="pass_name must be one of"):
        make_row(pass_name="sideways")


def test_table_shows_the_pass_by_default(make_row):
    rows = results.table([make_row(), make_row(pass_name="forward+backward")])
    assert [r["pass"] for r in rows] == ["forward", "forward+backward"]
    assert list(rows[0])[:6] == ["op", "rung", "name", "shape", "dtype", "pass"]
    assert "forward+backward" in format_table(rows)


def test_save_replaces_the_file_whole_or_not_at_all(tmp_path, make_row, monkeypatch):
    path = results.save([make_row()], tmp_path / "rows.json")

    def broken(*args, **kwargs):
        raise OSError("disk full")
    monkeypatch.setattr(results.json, "dumps", broken)
    with pytest.raises(OSError):
        results.save([make_row(), make_row(rung="v3")], path)
    monkeypatch.undo()
    assert results.load(path) == [make_row()]


def test_recorder_saves_after_every_row_and_not_before(tmp_path, make_row):
    path = tmp_path / "rows.csv"
    recorder = results.Recorder(path)
    assert not path.exists()
    recorder.add(make_row())
    assert results.load(path) == [make_row()]
    recorder.add(_error_row(make_row))
    assert results.load(path) == recorder.rows and len(recorder.rows) == 2
    memory = results.Recorder()
    memory.add(make_row())
    assert memory.rows == [make_row()] and sorted(p.name for p in tmp_path.iterdir()) == ["rows.csv"]


def test_recorder_refuses_a_bad_file_name_before_anything_is_measured(tmp_path):
    with pytest.raises(ValueError, match=".json or .csv"):
        results.Recorder(tmp_path / "rows.txt")


def test_table_shows_error_rows_with_their_message_and_no_numbers(make_row):
    rows = results.table([make_row(), _error_row(make_row)], ("rung", "date", "ms", "vs_ref"))
    assert rows == [dict(rung="v2", date="2026-11-30", ms=0.5, vs_ref=0.8, error=""),
                    dict(rung="v2", date="2026-11-30", ms=None, vs_ref=None,
                         error="RuntimeError: launch failed")]
    assert "error" not in results.table([make_row()])[0]
    assert "–" in format_table(rows) and "None" not in format_table(rows)


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize("text, message", [
    ("{not json", "not valid JSON"),
    (json.dumps({"rows": []}), "not a workbench results file"),
    (json.dumps([1, 2]), "not a workbench results file"),
    (json.dumps({"schema": results.SCHEMA, "version": 99, "rows": []}), "schema version 99"),
    (json.dumps({"schema": results.SCHEMA, "version": 2, "rows": {}}), "'rows' must be a list"),
    (json.dumps({"schema": results.SCHEMA, "version": 2, "rows": [{"op": "gemm"}]}), "missing fields"),
])
def test_corrupt_or_foreign_json_is_refused(tmp_path, text, message):
    with pytest.raises(ResultsFormatError, match=message):
        results.load(_write(tmp_path, "bad.json", text))


def test_bad_field_type_names_the_field(tmp_path, make_row):
    row = dataclasses.asdict(make_row())
    row["ms"] = "fast"
    doc = {"schema": results.SCHEMA, "version": results.VERSION, "rows": [row]}
    with pytest.raises(ResultsFormatError, match="field 'ms'"):
        results.load(_write(tmp_path, "bad.json", json.dumps(doc)))


def test_unknown_field_is_refused(tmp_path, make_row):
    row = {**dataclasses.asdict(make_row()), "secret": 1}
    doc = {"schema": results.SCHEMA, "version": results.VERSION, "rows": [row]}
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
