"""``workbench grade``: a file's kernel judged like a rung (issue 23).

In-process tests run the worker's own ``run`` stage (:func:`workbench.grade.worker.run`)
without its process, so the harness part costs what a check costs; the tests of the
isolation itself (a crash, a hang, the CLI's exit status) start the grader's processes
and are marked slow: each pays the start of torch and Triton.
"""
from __future__ import annotations

import json
import re

import pytest
import torch

import kernels
from workbench.cli import main
from workbench import exercises
from workbench.learn.exercises import source
from workbench.learn.exercises.model import KernelExercise
from workbench.grade import ENTRY, SCHEMA_VERSION, exercise_rules, grade, launches, worker
from workbench.grade.examples import RIGHT as CORRECT, WRONG
from workbench.grade.correctness import poisoned_allocations

GEMM_SHAPES = [(37, 29, 53), (5, 67, 3)]
FAST = dict(machine_code=False, model=False)


def run_in_process(file, op=None, **request) -> dict[str, list]:
    """The worker's run stage here: {result name: [payloads]}."""
    results: dict[str, list] = {}

    def collect(kind, name=None, payload=None):
        if kind == "result":
            results.setdefault(name, []).append(payload)

    base = {"file": str(file), "op": op, "entry": None, "reference": None, "dtypes": None,
            "shapes": None, "layouts": ["row", "col"], "seed": None, "record": False}
    worker.run({**base, **request}, collect)
    return results


def test_every_op_has_a_public_callable_name():
    assert set(ENTRY) == set(kernels.ops())
    for op, name in ENTRY.items():
        if op != "moe":       # kernels.MoE is a module; a file defines moe(...) of its inputs
            assert callable(getattr(kernels, name)), op


def test_allocations_are_poisoned_inside_the_block_only():
    with poisoned_allocations():
        assert torch.empty(3).isnan().all() and torch.empty_like(torch.ones(2)).isnan().all()
        assert (torch.empty(2, dtype=torch.int32) == torch.iinfo(torch.int32).max).all()
        assert torch.ones(2).new_empty(4).isnan().all()
        assert torch.empty_strided((2, 2), (1, 2)).isnan().all()
    assert torch.empty is torch._C._VariableFunctions.empty or not torch.empty(0).numel()
    assert "poisoned" not in torch.empty.__qualname__


def test_a_launch_is_recorded_as_triton_splits_its_arguments():
    from workbench.learn.exercises.learner import import_file

    module, _ = import_file(CORRECT, "gemm")
    a, b = torch.randn(100, 70, dtype=torch.bfloat16), torch.randn(70, 90, dtype=torch.bfloat16)
    with launches.recorded(stub=True) as records:
        out = module.matmul(a, b)
    assert out.shape == (100, 90)
    (record,) = records
    assert record["qualname"] == "gemm_tile_kernel"
    assert record["signature"]["a_ptr"] == "*bf16" and record["signature"]["M"] == "i32"
    assert record["constexprs"] == {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "INTERP_BF16": False}
    assert record["scalars"]["K"] == 70 and record["options"] == {"num_warps": 4}


def _code(path) -> list[str]:
    """A file's lines of code: no docstrings, comments or blank lines."""
    import ast

    tree = ast.parse(path.read_text())
    docstrings = {n.body[0].lineno for n in ast.walk(tree) if isinstance(n, (ast.Module, ast.FunctionDef))
                  and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    skipped = {line for n in ast.walk(tree) if isinstance(n, ast.Expr) and n.lineno in docstrings
               for line in range(n.lineno, n.end_lineno + 1)}
    return [line for i, line in enumerate(path.read_text().splitlines(), 1)
            if i not in skipped and line.strip() and not line.strip().startswith("#")]


def test_the_shipped_wrong_example_differs_from_the_right_one_in_one_line_of_code():
    import difflib

    changed = [line for line in difflib.ndiff(_code(CORRECT), _code(WRONG)) if line[:1] in "+-"]
    assert changed == ["-         k_left = K - k0", "+         k_left = K - k0 - 1"], changed


def test_the_example_passes_and_the_wrong_one_fails_naming_the_missing_slice(tmp_path):
    shapes = {"shapes": GEMM_SHAPES, "dtypes": ["fp32", "bf16"]}
    good = run_in_process(CORRECT, "gemm", **shapes)
    assert good["contract"][0]["passed"] and len(good["case"]) == 8
    assert all(c["passed"] for c in good["case"]), [c["message"] for c in good["case"]]
    assert good["autograd"] == [{"backward": False, "inputs": []}]     # a bare Triton call: no graph
    bad = run_in_process(WRONG, "gemm", shapes=GEMM_SHAPES[:1], dtypes=["fp32"], layouts=["row"])
    (case,) = bad["case"]
    assert not case["passed"] and case["report"].worst_index is not None
    assert "the last of K = 53 slices of the reduction is missing" in case["message"]


def _wrapped(tmp_path, text: str):
    path = tmp_path / "wrapped.py"
    path.write_text(text)
    return path


def test_the_package_top_rungs_wrapped_as_files_pass_with_their_gradients(tmp_path):
    gemm = run_in_process(_wrapped(tmp_path, "from kernels import matmul\n"), "gemm",
                          shapes=GEMM_SHAPES[:1], dtypes=["fp32"])
    assert gemm["autograd"] == [{"backward": True, "inputs": ["a", "b"]}]   # kernels.matmul has autograd
    assert [c["passed"] for c in gemm["case"]] == [True, True], [c["message"] for c in gemm["case"]]
    assert "da " in gemm["case"][0]["message"] and "db " in gemm["case"][0]["message"]
    attention = run_in_process(_wrapped(tmp_path, "from kernels import flash_attention\n"), "attention",
                               shapes=[(1, 2, 1, 33, 40, 16, 1)], dtypes=["fp32"], layouts=["row"])
    assert attention["autograd"] == [{"backward": True, "inputs": ["q", "k", "v"]}]
    assert attention["case"][0]["passed"], attention["case"][0]["message"]


def test_a_file_without_the_entry_or_the_signature_fails_the_contract(tmp_path):
    missing = run_in_process(_wrapped(tmp_path, "def mm(a, b):\n    return a @ b\n"), "gemm")
    assert not missing["contract"][0]["passed"]
    assert re.search(r"defines no `matmul`: the gemm contract is matmul\(.*\).*it defines: mm",
                     missing["contract"][0]["message"])
    unary = run_in_process(_wrapped(tmp_path, "def matmul(a):\n    return a\n"), "gemm")
    assert "cannot take the gemm inputs (2 arguments" in unary["contract"][0]["message"]
    assert "case" not in unary


def _reason(message: str) -> str:
    """What a failure blames: the exception a kernel raised (out of bounds, a race), or the
    tensor whose values are wrong. Whether wrong values show as NaN poison or as errors over
    the bound can change with the seed (grouped GEMM's routing decides which rows a wrong
    schedule leaves unwritten), so the rule within a tensor is not compared."""
    found = re.search(r"FAIL \((\w+)\): \d+ elements|\b([A-Z]\w+(?:Error|Bounds|Race)): ", message)
    assert found, message
    return found.group(1) or found.group(2)


def _wrong_answers():
    """The first known wrong answer of every kernel exercise in the catalog, but the
    collectives' (run on gloo ranks, 10-40 s each: one of them is graded below). With
    ``exercise=`` the grade's verdict is the exercise's own checker's, and
    tests/test_exercise_catalog.py runs that checker on every known wrong answer, so this
    test shows the wiring for each exercise on one answer, not on all of them again."""
    for e in exercises._catalog().values():
        if isinstance(e, KernelExercise) and not e.key.startswith("comm/") and e.wrong:
            yield e.key, next(iter(e.wrong))


@pytest.mark.parametrize("key, wrong", list(_wrong_answers()))
def test_each_exercise_wrong_answer_fails_grade_for_the_exercise_reason(key, wrong, tmp_path):
    """With ``exercise=`` the grade runs the exercise's own rules: a wrong answer fails, and
    where the grade's own harness cases fail too they blame what the exercise blames. An
    exercise graded by the harness alone must fail there; one graded on an idea (an order,
    a hot loop, a race, the saved log-sum-exp) may pass the harness and fail its rules."""
    exercise = exercises.get(key)
    path = tmp_path / f"{key.replace('/', '_')}.py"
    path.write_text(source.render(exercise.module, exercise.wrong[wrong]))
    got = run_in_process(path, layouts=["row"], exercise=key, **exercise_rules.defaults(key))
    (judged,) = got["exercise"]
    assert not judged["passed"] and judged["key"] == key, judged["message"]
    failing = [c for c in got.get("case", []) if not c["passed"]]
    if failing:
        assert _reason(failing[0]["message"]) == _reason(judged["message"])
    else:
        assert exercise.grade is not None, f"the harness passed {wrong!r}: {[c['message'] for c in got['case']]}"


@pytest.mark.slow
def test_a_collective_exercise_has_no_op_and_is_graded_by_its_rules_alone(tmp_path):
    exercise = exercises.get("comm/ring")
    path = tmp_path / "ring.py"
    path.write_text(source.render(exercise.module, exercise.wrong["off-by-one segment in the reduce-scatter pass"]))
    got = run_in_process(path, exercise="comm/ring", **exercise_rules.defaults("comm/ring"))
    assert got["contract"][0]["passed"] and "case" not in got
    (judged,) = got["exercise"]
    assert not judged["passed"] and "all_reduce (sum) of 4 elements on 3 ranks" in judged["message"]


@pytest.mark.slow
def test_a_user_defined_op_from_a_reference_file(tmp_path):
    ref = tmp_path / "ref_softmax.py"
    ref.write_text("import torch\nshapes = [(7, 33)]\n"
                   "def make_inputs(shape, dtype):\n    return (torch.randn(*shape, dtype=dtype),)\n"
                   "def reference(x):\n    return torch.softmax(x, dim=-1)\n")
    mine = _wrapped(tmp_path, "import torch\ndef kernel(x):\n    e = torch.exp(x - x.amax(-1, keepdim=True))\n"
                              "    return e / e.sum(-1, keepdim=True)\n")
    report = grade(mine, reference=ref, **FAST)
    assert report.passed, report.verdict
    assert report.file == str(mine)                  # a learner's file: named as given
    assert report.autograd == {"backward": True, "inputs": ["x"]} and len(report.cases) == 2
    off = tmp_path / "off.py"
    off.write_text("import torch\ndef kernel(x):\n    return torch.softmax(x[:, :-1], dim=-1)\n")
    assert main(["grade", str(off), "--reference", str(ref), "--no-machine-code"]) == 1


@pytest.mark.slow
@pytest.mark.parametrize("body, died", [
    ("import os\n    os.abort()", "an abort (SIGABRT)"),
    ("import ctypes\n    ctypes.string_at(0)", "a segmentation fault (SIGSEGV)"),
])
def test_a_crashing_file_is_a_failing_grade_with_its_signal(tmp_path, body, died):
    path = _wrapped(tmp_path, f"def matmul(a, b):\n    {body}\n")
    report = grade(path, "gemm", dtypes=["fp32"], shapes=[(3, 4, 5)], **FAST)
    assert not report.passed and f"the process died of {died} during autograd probe" in report.failure
    assert report.verdict.startswith("FAIL at autograd probe: the process died")


@pytest.mark.slow
def test_an_endless_loop_or_a_hanging_import_is_killed_at_its_step_limit(tmp_path):
    path = _wrapped(tmp_path, "def matmul(a, b):\n    while True:\n        pass\n")
    report = grade(path, "gemm", dtypes=["fp32"], shapes=[(3, 4, 5)], run_s=3, **FAST)
    assert "autograd probe did not finish within 3 s (an endless loop or a hang?)" in report.failure
    sleeper = _wrapped(tmp_path, "import time\ntime.sleep(600)\n")
    report = grade(sleeper, "gemm", import_s=3, **FAST)
    assert report.failure.startswith("import did not finish within 3 s") and not report.passed


@pytest.mark.slow
def test_cli_exit_status_json_and_a_self_contained_page(tmp_path, capsys):
    out_json, out_html = tmp_path / "g.json", tmp_path / "g.html"
    assert main(["grade", str(WRONG), "--op", "gemm", "--dtypes", "fp32", "--shape", "37x29x53",
                 "--json", str(out_json), "--html", str(out_html), "--no-machine-code", "--no-model"]) == 1
    assert capsys.readouterr().out.startswith("FAIL at shape (37, 29, 53), float32, row-major")
    data = json.loads(out_json.read_text())
    assert data["schema_version"] == SCHEMA_VERSION and data["passed"] is False
    first = data["correctness"]["first_failure"]
    assert first["shape"] == [37, 29, 53] and first["tensor"] == "out" and len(first["worst_index"]) == 2
    page = out_html.read_text()
    assert "<svg" in page and "<script" not in page and "http" not in page.split("<svg")[0]


@pytest.mark.slow
def test_the_correct_example_passes_with_its_machine_code_beside_the_top_rung(tmp_path):
    report = grade(CORRECT, "gemm", dtypes=["bf16"], shapes=[(37, 29, 53)], layouts=("row",),
                   targets=("gfx942",), gpus=("MI300X",))
    assert report.passed, report.verdict
    # a bundled example: named by its place in the package, as on any other machine
    assert report.file == "workbench/grade/examples/gemm_tile.py" and CORRECT.is_absolute()
    model = report.speed["model"]
    (yours,) = [r for r in model["rows"] if r["rung"] == "yours"]      # its own compiled kernel, modelled
    assert yours["label"] == "model" and yours["gpu"] == "MI300X" and yours["ms"] > 0 and "yours" not in model
    assert {r["rung"] for r in model["rows"]} >= {"yours", "v2", "v6"}
    gfx942 = report.machine_code["targets"]["gfx942"]
    (mine,) = gfx942["yours"]
    assert mine["kernel"] == "gemm_tile_kernel" and "v_mfma_f32_32x32x8_bf16" in mine["matrix instructions"]
    assert report.machine_code["top_rung"] == kernels.variants("gemm", include_ref=False)[-1].title
    assert any(k["matrix instructions"] != "-" for k in gfx942["top"])
    assert report.speed["measured"]["note"].startswith("no GPU here")


def test_on_a_gpu_yours_ref_and_the_top_rung_are_timed_in_one_run(monkeypatch):
    """The worker's GPU step as a GPU runs it (``time`` is what ``is_gpu`` decides there), with
    the timer itself a stand-in: its medians become the rows and the ratios to yours."""
    from types import SimpleNamespace

    from workbench.harness import timing
    from workbench.grade import speed

    timed = []
    medians = iter([2.0, 1.0, 4.0])
    monkeypatch.setattr(timing, "time_ms", lambda call: timed.append(call) or SimpleNamespace(median_ms=next(medians)))
    got = run_in_process(CORRECT, "gemm", shapes=[(5, 67, 3)], dtypes=["fp32"], layouts=["row"], time=True)
    (result,) = got["timing"]
    top = speed.top_rung("gemm", torch.float32)
    assert len(timed) == 3 and all(callable(call) for call in timed)
    assert [r["kernel"] for r in result["rows"]] == ["yours", "ref", top.title]
    assert [r["speedup (its ms / yours)"] for r in result["rows"]] == [1.0, 0.5, 2.0]
    assert result["label"] == "measured" and result["shape"] == list(speed.model_shape(kernels.spec("gemm")))


def test_the_rungs_the_model_does_not_cover_are_one_line(monkeypatch):
    from types import SimpleNamespace

    import workbench.model
    from workbench.grade import speed
    from workbench.model import NotCovered

    def predict(op, label, shape, dtype, gpu):
        if label in ("v0", "v1", "ref"):
            raise NotCovered(f"the model covers gemm rungs v2, v3, not {label}")
        return SimpleNamespace(row=lambda: {"rung": label, "gpu": gpu})

    monkeypatch.setattr(workbench.model, "predict", predict)
    rows, notes = speed.predictions("gemm", (64, 64, 64), torch.bfloat16, ("MI300X", "MI355X"))
    assert len(rows) == 2 * (len(kernels.variants("gemm")) - 3)
    assert notes == ["not covered: v0, v1, ref on MI300X, MI355X (the model covers gemm rungs v2, v3)"]


def test_a_file_kernel_the_model_does_not_cover_is_said_in_one_line():
    from workbench.learn.exercises.learner import import_file
    from workbench.grade import file_model

    module, _ = import_file(CORRECT, "gemm")
    with launches.recorded(stub=True) as records:
        module.matmul(torch.empty(256, 128), torch.empty(128, 192))
    assert records[0]["grid"] == (4, 3, 1)
    recorded = {"records": records, "shape": [256, 192, 128], "dtype": "torch.bfloat16"}
    rows, why = file_model.predictions("gemm", str(CORRECT), recorded, {}, ("MI300X", "B200"))
    assert rows == [] and why == ("yours on MI300X: not modelled: gemm_tile_kernel was not compiled for gfx942 "
                                  "(the model reads the compiled loop); yours on B200: not modelled: the model "
                                  "covers targets gfx942, gfx950, sm_90; B200 is sm_100")
    one_d = {**recorded, "records": [{**records[0], "grid": (12, 1, 1)}]}
    assert "grid (12, 1, 1) is not (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N)) = (4, 3)" in \
        file_model.predictions("gemm", str(CORRECT), one_d, {}, ("MI300X",))[1]
    untiled = {**recorded, "records": [{**records[0], "constexprs": {}}]}
    assert "has no BLOCK_M, BLOCK_N, BLOCK_K constexpr" in \
        file_model.predictions("gemm", str(CORRECT), untiled, {}, ("MI300X",))[1]


@pytest.mark.slow
def test_an_exercise_answer_right_in_numbers_but_not_in_its_idea_fails_grade_with_the_exercise_reason(tmp_path):
    exercise = exercises.get("gemm/v3")
    path = tmp_path / "gemm_v3.py"
    path.write_text(source.render(exercise.module, exercise.wrong["row-major inside each group"]))
    report = grade(path, exercise="gemm/v3", machine_code=False, gpus=("MI300X",))
    assert all(c["passed"] for c in report.cases) and not report.passed
    assert report.verdict.startswith("FAIL at exercise gemm/v3's rules: correct (") and "not v3's program order" in report.verdict
    (yours,) = [r for r in report.speed["model"]["rows"] if r["rung"] == "yours"]   # v3 compiled from the file
    assert yours["label"] == "model" and yours["ms"] > 0
    assert report.to_dict()["exercise"] == report.exercise and report.exercise["key"] == "gemm/v3"
    assert "exercise gemm/v3's rules: FAIL: correct (" in str(report)
    assert "<h2>Exercise gemm/v3's rules</h2><p class='fail'>FAIL: correct (" in report._repr_html_()
    assert main(["grade", str(path), "--exercise", "gemm/v3", "--op", "attention"]) == 2


@pytest.mark.gpu
def test_grade_on_a_gpu_measures_yours_beside_ref_and_the_top_rung():
    report = grade(CORRECT, "gemm", dtypes=["bf16"], shapes=[(37, 29, 53)], layouts=("row",),
                   machine_code=False, model=False)
    assert report.passed, report.verdict
    rows = report.speed["measured"]["rows"]
    assert [r["kernel"] for r in rows][:2] == ["yours", "ref"] and all(r["ms"] > 0 for r in rows)
