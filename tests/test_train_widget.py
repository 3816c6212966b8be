"""The training comparison widget, driven through its Python API as notebook 04 drives it.

On the CPU it must show the losses of both kernel sets and their parity, never an
interpreter time; GPU numbers come only from GPU rows, recorded ones with GPU and date.
"""
from __future__ import annotations

import pytest

pytest.importorskip("ipywidgets", reason="the notebook extra is not installed (e.g. on a bare GPU image)")
pytest.importorskip("altair", reason="the notebook extra is not installed (e.g. on a bare GPU image)")

import kernels
from workbench import train
from workbench.train import model, store
from workbench.widgets import TrainingComparison
from workbench.widgets import training_rows as tr
from workbench.views.render import bundle

ON_CPU = kernels.backend.current().is_interpreter
cpu_only = pytest.mark.skipif(not ON_CPU, reason="checks what the CPU interpreter shows")


@pytest.fixture
def no_recorded(tmp_path, monkeypatch):
    monkeypatch.setattr(tr, "_recorded_dir", lambda: tmp_path)
    return tmp_path


def _gpu_rows(kernels_label: str, ms: list[float], gpu="AMD Instinct MI300X",
              stamp="2026-11-20T10:00:00+00:00") -> list[dict]:
    rows = []
    for step, t in enumerate(ms, start=1):
        row = dict.fromkeys(store.FIELDS)
        row.update(step=step, loss=4.0 - 0.1 * step, grad_norm=1.0, step_ms=t, tokens_per_s=1e6 / t,
                   tflops=100.0 / t, mfu=0.1 / t, peak_mem_gib=20.0, preset="gpu-moe-small",
                   kernels=kernels_label, compile=False, dtype="bfloat16", world_size=1, seed=0,
                   backend="hip", gpu=gpu, commit="test", timestamp=stamp,
                   op_ms={"kernels::matmul": t / 2, "aten::mm": t / 4})
        rows.append(row)
    return rows


@cpu_only
def test_two_sets_on_cpu_smoke_show_losses_and_parity_but_no_times(no_recorded):
    widget = TrainingComparison().set(preset="cpu-smoke", a="torch", b="workbench", steps=2)
    result = widget.run()
    assert list(result.rows) == ["A: torch", "B: workbench"]
    assert all([r["step"] for r in rows] == [1, 2] for rows in result.rows.values())
    assert result.errors == {} and result.source == "interpreter"
    assert result.parity == pytest.approx(0.0, abs=1e-4)   # fp32: rounding apart

    spec = result.charts["loss"].to_dict()
    assert spec["mark"]["type"] == "line" and spec["encoding"]["color"]["field"] == "set"
    assert {v["set"] for v in spec["data"]["values"]} == set(result.rows)

    # No interpreter time anywhere it is shown: not in the table, the ops list or a chart.
    assert all(row[k] is None for row in result.table for k in tr.GPU_ONLY)
    assert list(result.charts) == ["loss"]
    assert all(isinstance(v, (int, str, type(None))) for row in result.ops for v in row.values())
    ran = {name for row in result.ops for name in row.values() if isinstance(name, str)}
    # the switch is visible by name: the custom op, or, for an eager call that needs gradients
    # (kernels.eager.path), the op's own autograd.Function
    assert ran & {"kernels::matmul", "_Matmul", "_Linear"}
    shown = "".join(p for p in result.parts() if isinstance(p, str))
    assert "step_ms" not in shown and "tokens_per_s" not in shown and "not performance" in shown
    assert "No GPU training results are recorded yet" in shown


@cpu_only
def test_a_set_that_cannot_run_is_reported_and_the_other_still_runs(no_recorded, monkeypatch):
    real = model.moe_ffn

    def workbench_moe_out_of_memory(cfg, impl):
        if impl == "workbench":
            raise RuntimeError("HIP out of memory (pretended)")
        return real(cfg, impl)
    monkeypatch.setattr(model, "moe_ffn", workbench_moe_out_of_memory)
    widget = TrainingComparison().set(a="torch", b={"moe": "workbench"}, steps=1, profile=False)
    result = widget.run()
    assert list(result.rows) == ["A: torch"] and result.parity is None
    assert "out of memory" in result.errors["B: gemm=torch, attention=torch, moe=workbench, norm=torch, rope=torch, "
                                            "swiglu=torch, loss=torch"]
    assert any("did not run" in note and "out of memory" in note for note in result.notes)
    widget.button.click()                 # a click shows the same result, not a traceback
    assert widget.status.value == "" and widget.result.errors


@cpu_only
def test_a_second_run_replaces_the_output(no_recorded):
    widget = TrainingComparison().set(steps=1, profile=False)
    one = len(widget.run().parts())
    widget.set(steps=2).run()
    assert len(widget.output.outputs) == one
    assert widget.result.steps == 2
    assert "not run yet" not in widget._repr_mimebundle_()["text/html"]


def test_default_set_b_is_every_op_on_the_workbench_kernels():
    widget = TrainingComparison()
    assert list(widget.kernel_sets()) == ["A: torch", "B: workbench"]
    assert widget.preset.value == ("cpu-smoke" if ON_CPU else "gpu-moe-small")


def test_gpu_rows_give_medians_after_the_first_step_and_a_side_by_side_breakdown():
    a, b = _gpu_rows("torch", [50.0, 10.0, 12.0]), _gpu_rows("workbench", [90.0, 8.0, 8.0])
    summary = tr.summary("A: torch", a)
    assert summary["step_ms"] == 11.0 and summary["source"] == "measured"
    assert summary["mfu"] == pytest.approx(0.1 / 11.0, rel=0.1)
    table = tr.breakdown({"A": a, "B": b})
    assert table[0] == {"op": "kernels::matmul", "A": 5.5, "B": 4.0}
    assert tr.loss_parity(a, b) == 0.0


def test_a_corrupt_recorded_training_file_is_skipped_with_a_warning(no_recorded):
    store.save(_gpu_rows("torch", [40.0, 10.0]), no_recorded / "mi300x.json")
    (no_recorded / "broken.json").write_text('{"schema": ')
    with pytest.warns(UserWarning, match="broken.json"):
        shipped = tr.recorded_rows()
    assert list(shipped) == ["mi300x.json"] and len(shipped["mi300x.json"]) == 2


def test_recorded_gpu_runs_are_shown_with_gpu_and_date(no_recorded, monkeypatch):
    rows = _gpu_rows("torch", [40.0, 10.0]) + _gpu_rows("workbench", [40.0, 9.0])
    cpu = dict(rows[0], backend="interpreter", kernels="cpu run")   # never shown as recorded
    store.save(rows + [cpu], no_recorded / "mi300x.json")
    table = tr.recorded_summary(tr.recorded_rows())
    assert [(r["kernels"], r["step_ms"], r["gpu"], r["date"]) for r in table] == [
        ("torch", 10.0, "AMD Instinct MI300X", "2026-11-20"),
        ("workbench", 9.0, "AMD Instinct MI300X", "2026-11-20")]
    assert all(r["file"] == "mi300x.json" for r in table)
    names = list(tr.recorded_runs(tr.recorded_rows()))
    assert names[0] == "AMD Instinct MI300X · gpu-moe-small · torch · 2026-11-20"

    def out_of_memory(*_, **__):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(train, "run", out_of_memory)   # neither set runs: the recorded runs still show
    result = TrainingComparison().run()
    assert result.rows == {} and len(result.errors) == 2 and result.parity is None
    assert result.recorded == table and list(result.charts) == ["recorded_breakdown"]
    assert any(note.startswith("Recorded GPU runs, not measured here: " + names[0]) for note in result.notes)


def test_gpu_rows_are_shown_as_measured_with_the_breakdown_side_by_side(no_recorded, monkeypatch):
    mixed = "gemm=workbench,attention=torch,moe=torch,norm=torch,rope=torch,swiglu=torch,loss=torch"
    fake = {"torch": [50.0, 10.0, 12.0], mixed: [90.0, 8.0, 8.0]}
    monkeypatch.setattr(train, "run", lambda preset, impls, **_: _gpu_rows(
        train.ops.label(impls), fake[train.ops.label(impls)]))
    result = TrainingComparison().set(a="torch", b={"gemm": "workbench"}, steps=3).run()
    assert result.source == "measured" and [r["step_ms"] for r in result.table] == [11.0, 8.0]
    assert result.ops[0] == {"op": "kernels::matmul", "A: torch": 5.5,
                             f"B: {mixed.replace(',', ', ')}": 4.0}
    # a mixed set's label breaks at its commas rather than overflowing its table column
    assert max(len(word) for row in result.table for word in f"{row['set']} {row['kernels']}".split()) <= 16
    spec = result.charts["breakdown"].to_dict()
    assert spec["mark"]["type"] == "bar" and spec["encoding"]["column"]["field"] == "run"
    assert bundle(result.charts["breakdown"])["image/svg+xml"].lstrip().startswith("<svg")
    assert any("Measured here on AMD Instinct MI300X, 2026-11-20" in note for note in result.notes)
