"""workbench.train.run's files: a bad --resume, --checkpoint or --out fails before the first
step and names the flag and the file; a resumed run appends its rows to --out."""
from __future__ import annotations

import dataclasses
import fractions
import json
import pickle
import shutil

import pytest
import torch

from workbench import cli, train
from workbench.train import loop, store
from workbench.train.files import FileArgumentError

SMOKE = train.PRESETS["cpu-smoke"]


@pytest.fixture(scope="module")
def done(tmp_path_factory):
    """A 2-step run's checkpoint and rows, made once for the module."""
    folder = tmp_path_factory.mktemp("done")
    train.run("cpu-smoke", steps=2, seed=1, checkpoint=folder / "ckpt.pt", out=folder / "rows.json",
              progress=False)
    return folder


@pytest.fixture
def steps_taken(monkeypatch):
    """The steps a run trains; a file check that comes too late shows up here."""
    taken = []
    step = loop._step

    def counted(*args, **kwargs):
        taken.append(1)
        return step(*args, **kwargs)
    monkeypatch.setattr(loop, "_step", counted)
    return taken


def _damaged(done, tmp_path, kind):
    path = tmp_path / "bad.pt"
    whole = (done / "ckpt.pt").read_bytes()
    if kind == "truncated":
        path.write_bytes(whole[: len(whole) // 2])
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "foreign pickle":   # plain pickle would run it; weights_only refuses the class
        path.write_bytes(pickle.dumps(fractions.Fraction(1, 3), protocol=2))
    elif kind == "foreign torch file":
        torch.save({"weights": torch.ones(2)}, path)
    elif kind == "folder":
        path.mkdir()
    return path


@pytest.mark.parametrize("kind, reason", [
    ("truncated", "not a readable checkpoint"),
    ("empty", "not a readable checkpoint"),
    ("foreign pickle", "not a readable checkpoint.*UnpicklingError"),
    ("foreign torch file", "not a workbench training checkpoint"),
    ("missing", "no such file"),
    ("folder", "not a file"),
])
def test_a_bad_resume_file_fails_before_training(done, tmp_path, steps_taken, capsys, kind, reason):
    path = _damaged(done, tmp_path, kind)
    with pytest.raises(FileArgumentError, match=f"resume='{path}': {reason}"):
        train.run("cpu-smoke", steps=1, resume=path, progress=False)
    assert cli.main(["train", "--steps", "1", "--resume", str(path)]) == 2
    assert capsys.readouterr().err.startswith(f"workbench train: --resume {path}: ")
    assert steps_taken == []


def test_a_checkpoint_of_another_model_fails_before_training(done, steps_taken):
    deeper = dataclasses.replace(SMOKE, layers=SMOKE.layers + 1)
    with pytest.raises(FileArgumentError, match="resume=.*a checkpoint of another model"):
        train.run(deeper, steps=1, seed=1, resume=done / "ckpt.pt", progress=False)
    assert steps_taken == []


def _saved_by(done, tmp_path, run: dict | None):
    """done's checkpoint as if a run with ``run``'s values (None: one from before runs were
    recorded) had saved it."""
    state = torch.load(done / "ckpt.pt", weights_only=True)
    if run is None:
        del state["run"]
    else:
        state["run"] = {**state["run"], **run}
    torch.save(state, tmp_path / "ckpt.pt")
    return tmp_path / "ckpt.pt"


@pytest.mark.parametrize("saved, asked, message", [
    ({}, dict(seed=2), "seed 1 there, 2 here"),
    ({}, dict(fp8="tensorwise"), r"fp8 None there, 'tensorwise' here; fp8_keep None there, \['first', 'last', .* here"),
    (dict(fp8="tensorwise", fp8_keep=["lm_head"]), dict(fp8="tensorwise", fp8_keep=["lm_head", "blocks.0.*"]),
     r"fp8_keep \['lm_head'\] there, \['lm_head', 'blocks.0.\*'\] here"),
    (dict(fp8="delayed", fp8_keep=["lm_head"]), dict(fp8="tensorwise", fp8_keep=["lm_head"]),
     "fp8 'delayed' there, 'tensorwise' here \\(resume with the saved run's values"),
], ids=["seed", "fp8 added", "fp8_keep", "recipe"])
def test_resuming_another_run_fails_before_training(done, tmp_path, steps_taken, saved, asked, message):
    """A tensorwise model's state loads into a plain one and a rowwise one's into a tensorwise
    one: only the checkpoint's record of its run tells the runs apart."""
    path = _saved_by(done, tmp_path, saved)
    with pytest.raises(FileArgumentError, match=f"resume=.*a checkpoint of another run: {message}"):
        train.run("cpu-smoke", steps=1, **{"seed": 1, **asked}, resume=path, progress=False)
    assert steps_taken == []


def test_another_run_is_refused_by_the_cli_naming_the_flag(done, capsys):
    assert cli.main(["train", "--steps", "1", "--seed", "1", "--fp8", "rowwise", "--resume",
                     str(done / "ckpt.pt")]) == 2
    assert "--resume" in (err := capsys.readouterr().err) and "fp8 None there, 'rowwise' here" in err


def test_a_checkpoint_from_before_runs_were_recorded_resumes(done, tmp_path):
    """Nothing to compare it with: it resumes as it did, and the checkpoint it saves records the run."""
    rows = train.run("cpu-smoke", steps=1, seed=1, resume=_saved_by(done, tmp_path, None),
                     checkpoint=tmp_path / "next.pt", progress=False)
    assert [r["step"] for r in rows] == [3]
    assert torch.load(tmp_path / "next.pt", weights_only=True)["run"] == dict(
        preset="cpu-smoke", seed=1, fp8=None, fp8_keep=None)


@pytest.mark.parametrize("flag", ["checkpoint", "out"])
def test_a_file_in_a_missing_folder_fails_before_training(tmp_path, steps_taken, capsys, flag):
    path = tmp_path / "absent" / "file.json"
    with pytest.raises(FileArgumentError, match=f"{flag}=.*folder {tmp_path / 'absent'} does not exist"):
        train.run("cpu-smoke", steps=1, progress=False, **{flag: path})
    assert cli.main(["train", "--steps", "1", f"--{flag}", str(path)]) == 2
    assert f"--{flag} {path}: folder" in capsys.readouterr().err
    with pytest.raises(FileArgumentError, match=f"{flag}=.*is a folder"):
        train.run("cpu-smoke", steps=1, progress=False, **{flag: tmp_path})
    assert steps_taken == []


def test_resume_appends_its_rows_to_out(done, tmp_path):
    out = shutil.copy(done / "rows.json", tmp_path / "rows.json")
    earlier = store.load(out)
    resumed = train.run("cpu-smoke", steps=1, seed=1, resume=done / "ckpt.pt", out=out, progress=False)
    assert [r["step"] for r in store.load(out)] == [1, 2, 3]
    assert store.load(out) == earlier + resumed
    # Resumed from the same checkpoint again: the first resume's step 3 is replaced, not kept.
    again = train.run("cpu-smoke", steps=1, seed=1, resume=done / "ckpt.pt", out=out, progress=False)
    assert store.load(out) == earlier + again


def test_resume_into_an_out_file_that_is_not_rows_fails_before_training(done, tmp_path, steps_taken):
    out = tmp_path / "rows.json"
    out.write_text("{not json")
    with pytest.raises(FileArgumentError, match="out=.*cannot append the resumed steps.*not valid JSON"):
        train.run("cpu-smoke", steps=1, seed=1, resume=done / "ckpt.pt", out=out, progress=False)
    assert steps_taken == [] and out.read_text() == "{not json"


@pytest.mark.parametrize("rows, message", [({}, "not a training-rows file"), ([5], "row 0: fields 5")])
def test_rows_files_of_the_wrong_shape_are_refused_naming_the_file(tmp_path, rows, message):
    path = tmp_path / "rows.json"
    path.write_text(json.dumps({"schema": store.SCHEMA, "version": store.VERSION, "rows": rows}))
    with pytest.raises(ValueError, match=message) as caught:
        store.load(path)
    assert str(path) in str(caught.value)
