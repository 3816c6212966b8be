"""Which layers a training run keeps in high precision under FP8 (``fp8_keep``, ``--fp8-keep``,
the training comparison's control): built into the model, recorded in every row, refused
without a recipe or in a form a row cannot record."""
from __future__ import annotations

import warnings

import pytest
import torch

import kernels
from kernels.fp8 import Float8Linear
from workbench import cli, train
from workbench.train import flops, fp8_layers, fp8_parity, loop, ops, store, tuning_pass

SMOKE = train.PRESETS["cpu-smoke"]
MOE = ops.resolve({"moe": "workbench"})   # the FP8 MoE layer (and its shared experts) needs the workbench MoE
ROUTED_ONLY = ("first", "last", "*router")   # the default but the shared experts


def _build(fp8="rowwise", fp8_keep=None):
    return tuning_pass.build(SMOKE, MOE, 0, torch.device("cpu"), 1, None, fp8, fp8_keep)


def _shared_in_fp8(model) -> list[bool]:
    return [block.ffn.fp8_shared_experts for block in model.blocks if hasattr(block.ffn, "fp8_shared_experts")]


def test_the_default_keeps_the_shared_experts_and_leaving_them_out_quantizes_them():
    default, routed_only = _build(), _build(fp8_keep=ROUTED_ONLY)
    assert SMOKE.shared_experts and _shared_in_fp8(default) == [False] and _shared_in_fp8(routed_only) == [True]
    # MFU counts their three GEMMs at the FP8 peak once they run in FP8
    assert flops.fp8_step_flops(routed_only, SMOKE) > flops.fp8_step_flops(default, SMOKE)
    assert type(default.head) is torch.nn.Linear and type(routed_only.head) is torch.nn.Linear


def test_an_empty_list_converts_every_linear_and_the_shared_experts():
    model = _build(fp8_keep=())
    assert type(model.head) is Float8Linear and type(model.blocks[1].ffn.router) is Float8Linear
    assert _shared_in_fp8(model) == [True]


def test_cli_records_the_kept_layers_in_each_row_and_says_them(tmp_path, capsys):
    out = tmp_path / "rows.json"
    assert cli.main(["train", "--steps", "1", "--kernels", "moe=workbench", "--fp8", "rowwise",
                     "--fp8-keep", " first, last,*router ", "--out", str(out)]) == 0
    assert "layers kept in high precision: first, last, *router\n" in capsys.readouterr().out
    assert [r["fp8_keep"] for r in store.load(out)] == [list(ROUTED_ONLY)]


def test_the_applied_list_is_the_default_under_a_recipe_and_none_without_one():
    """What a run's rows record (the CLI test above records a list of its own)."""
    assert fp8_layers.applied("rowwise", None) == kernels.fp8.KEEP_HIGH_PRECISION
    assert fp8_layers.applied(None, None) is None
    assert fp8_layers.applied("rowwise", ["*router"]) == ("*router",)


def test_run_builds_the_model_with_the_list_it_records(monkeypatch):
    built = []

    def build(*args):
        built.append(args[-2:])
        raise RuntimeError("built")   # no training: the arguments are what is checked

    monkeypatch.setattr(loop, "build", build)
    with pytest.raises(RuntimeError, match="built"):
        train.run("cpu-smoke", fp8="rowwise", fp8_keep=ROUTED_ONLY, progress=False)
    assert built == [("rowwise", ROUTED_ONLY)]


def test_a_pattern_that_names_no_layer_is_a_warning():
    """A typo would quantize the layer it meant to keep; the default list names the shared
    experts of models that have none, so it is never warned about."""
    with pytest.warns(RuntimeWarning, match=r"\*ruoter name no layer of this model"):
        model = _build(fp8_keep=("first", "last", "*ruoter"))
    assert type(model.blocks[1].ffn.router) is Float8Linear   # what the typo did
    assert fp8_layers.unmatched(model, ("first", "blocks.1.ffn", "*shared_experts", "*.q", "head")) == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _build()


def test_kept_layers_without_a_recipe_are_refused_before_training(tmp_path, capsys):
    out = tmp_path / "rows.json"
    assert cli.main(["train", "--fp8-keep", "first", "--out", str(out)]) == 2
    assert "without an FP8 recipe" in capsys.readouterr().err and not out.exists()
    assert cli.main(["tune", "--fp8-keep", ""]) == 2
    assert "without an FP8 recipe" in capsys.readouterr().err
    with pytest.raises(ValueError, match="without an FP8 recipe"):
        train.run("cpu-smoke", fp8_keep=("first",), progress=False)


@pytest.mark.parametrize("keep", ["*router", ("first", 3), lambda name, module: False, (p for p in ("first",)),
                                  {"first", "last"}, ("first,last",)],
                         ids=["a bare string", "a non-string", "a callable", "a generator", "a set", "a comma"])
def test_a_form_a_row_cannot_record_is_refused(keep):
    with pytest.raises(TypeError, match="list or tuple of module names or patterns"):
        train.run("cpu-smoke", fp8="rowwise", fp8_keep=keep, progress=False)


def test_the_text_form_reads_back():
    assert fp8_layers.parse(fp8_layers.text(kernels.fp8.KEEP_HIGH_PRECISION)) == kernels.fp8.KEEP_HIGH_PRECISION
    assert fp8_layers.parse("") == fp8_layers.parse(" , ") == ()


def test_cli_tune_builds_the_model_with_the_kept_layers(monkeypatch, capsys):
    built = []

    def build(*args):
        built.append(args[-1])
        return torch.nn.Linear(1, 1)

    monkeypatch.setattr(tuning_pass, "build", build)
    monkeypatch.setattr(tuning_pass, "tuning_pass", lambda *args: kernels.tune(lambda: None))
    assert cli.main(["tune", "--kernels", "torch", "--fp8", "rowwise", "--fp8-keep", "*router"]) == 0
    assert built == [("*router",)]


def test_the_comparison_passes_its_control_to_every_fp8_run_and_shows_it(monkeypatch):
    pytest.importorskip("ipywidgets", reason="the notebook extra is not installed (e.g. on a bare GPU image)")
    from workbench.widgets import TrainingComparison

    runs = []

    def run(preset, impls, **kw):
        runs.append((kw["fp8"], kw["fp8_keep"]))
        kept = fp8_layers.applied(kw["fp8"], kw["fp8_keep"])
        return [{**dict.fromkeys(store.FIELDS), "step": 1, "loss": 4.0 if kw["fp8"] is None else 4.02,
                 "fp8": kw["fp8"], "fp8_keep": None if kept is None else list(kept), "backend": "interpreter",
                 "kernels": ops.label(impls), "timestamp": "2026-12-06T00:00:00+00:00"}]

    monkeypatch.setattr(train, "run", run)
    widget = TrainingComparison().set(compare="fp8", recipes=("rowwise",), fp8_keep=ROUTED_ONLY, profile=False)
    assert widget.fp8_keep.value == "first, last, *router" and not widget.fp8_keep.disabled
    table = {r["run"]: r for r in widget.run().fp8}
    assert runs == [(None, None), ("rowwise", ROUTED_ONLY)]
    assert table[fp8_parity.HIGH]["kept_in_high_precision"] == "everything"
    assert table["fp8 rowwise"]["kept_in_high_precision"] == "first, last, *router"
    widget.set(fp8_keep=())
    widget.run()
    assert runs[-1] == ("rowwise", ())
    widget.set(fp8_keep=kernels.fp8.KEEP_HIGH_PRECISION)   # the default: convert's own, no list passed
    widget.run()
    assert runs[-1] == ("rowwise", None)
    assert widget.set(compare="sets").fp8_keep.disabled
    with pytest.raises(TypeError, match="list or tuple of module names"):
        widget.set(fp8_keep="*router")
