"""``workbench grade``: any engineer's kernel file, judged like a rung.

    >>> from workbench.grade import grade                                  # doctest: +SKIP
    >>> report = grade("my_gemm.py", op="gemm", dtypes=["fp32"])           # doctest: +SKIP
    >>> report.passed, report.verdict                                      # doctest: +SKIP
    >>> report.write_json("grade.json"); report.write_html("grade.html")   # doctest: +SKIP

One report answers what a take-home or a review asks of every kernel: is it right (the
harness, as every rung gets it: :mod:`.correctness`), what it compiles to on MI300X,
MI355X and H100-class GPUs (:mod:`.machine_code`), and how fast it is expected to be and
is (:mod:`.speed`: the model beside the ladder; measured on a GPU only). The file is
imported and run only in processes of its own (:mod:`.session`, :mod:`.worker`), with a
time limit per step: a crash, a hang or an out-of-bounds access is a failing grade with
its message. The contract (which callable, which problem) is :mod:`.contract`.

A tool, like ``cli``: a command a user runs, on top of every layer (the harness judges,
isa compiles, the model predicts, the file is read by :mod:`workbench.harness.kernel_file`).
Nothing imports it but the CLI.
"""
from __future__ import annotations

from pathlib import Path

from .contract import ENTRY
from .report import SCHEMA_VERSION, GradeReport
from .speed import GPUS
from .machine_code import TARGETS

__all__ = ["ENTRY", "GPUS", "GradeReport", "SCHEMA_VERSION", "TARGETS", "grade"]

IMPORT_S = 120.0
RUN_S = 300.0


def grade(file, op: str | None = None, *, entry: str | None = None, reference=None,
          exercise: str | None = None, dtypes=None, shapes=None, layouts=("row", "col"), targets=TARGETS, gpus=GPUS,
          machine_code: bool = True, model: bool = True, import_s: float = IMPORT_S,
          run_s: float = RUN_S, seed: int | None = None) -> GradeReport:
    """Grade ``file``'s callable for ``op`` (or for the problem in the ``reference`` file).

    ``dtypes`` (names: "fp32", "bfloat16", ...) and ``shapes`` narrow what is checked
    (default: every dtype of the op, its smoke shapes); ``machine_code``/``model`` off skip
    the compiles; ``import_s``/``run_s`` limit the file's import and each step.
    ``exercise`` ("gemm/v3") adds that exercise's own rules as a graded section
    (:mod:`.exercise_rules`) and sets its op, callable, shapes, dtypes and seed where
    these are not given."""
    from .exercise_rules import defaults
    from .grader import run

    if exercise is not None:
        found = defaults(exercise)
        if op is not None and op != found["op"]:
            raise ValueError(f"exercise {exercise} is graded as {found['op'] or 'no op'}, not {op}")
        op, entry, dtypes, shapes = (op or found["op"], entry or found.get("entry"),
                                     dtypes or found.get("dtypes"), shapes or found.get("shapes"))
        seed = seed if seed is not None else found.get("seed")
    elif (op is None) == (reference is None):
        raise ValueError("grade needs an op (one of the workbench's), a reference file or an exercise")
    if exercise is not None and reference is not None:
        raise ValueError("an exercise is graded on its own op, not on a reference file")
    return run(Path(file), op, entry=entry, reference=reference, exercise=exercise, dtypes=dtypes, shapes=shapes,
               layouts=tuple(layouts), targets=tuple(targets), gpus=tuple(gpus),
               machine_code=machine_code, model=model, import_s=import_s, run_s=run_s, seed=seed)
