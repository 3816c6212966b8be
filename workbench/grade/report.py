"""The grade as data: one :class:`GradeReport`, written as schema-versioned JSON for CI
pipelines, as text for a terminal, and as a page (:mod:`.page`) for a reviewer."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from kernels.atomic import write_atomic

from .cases import case_row

SCHEMA_VERSION = 1
@dataclass(repr=False)
class GradeReport:
    """Everything one grade found; ``passed`` is the verdict (the command's exit status 0)."""

    file: str
    op: str
    entry: str
    passed: bool
    verdict: str
    contract: dict
    autograd: dict
    cases: list[dict]
    machine_code: dict
    speed: dict
    environment: dict
    reference: str | None = None
    failure: str | None = None          # the file's process crashed or hung: what and when
    exercise: dict | None = None        # --exercise: {"key", "passed", "message"} of its own rules
    check_reports: list = field(default_factory=list, repr=False)   # failing CheckReports (heat maps)
    isa_reports: dict = field(default_factory=dict, repr=False)     # {target: {"yours": [...], "top": [...]}}

    @property
    def first_failure(self) -> dict | None:
        return next((c for c in self.cases if not c["passed"]), None)

    def to_dict(self) -> dict:
        return {"schema_version": SCHEMA_VERSION, "file": self.file, "op": self.op, "entry": self.entry,
                "reference": self.reference, "passed": self.passed, "verdict": self.verdict,
                "contract": self.contract, "autograd": self.autograd, "failure": self.failure,
                "exercise": self.exercise,
                "correctness": {"cases": [case_row(c) for c in self.cases],
                                "first_failure": case_row(self.first_failure) if self.first_failure else None},
                "machine_code": self.machine_code, "speed": self.speed, "environment": self.environment}

    def write_json(self, path: str | Path) -> Path:
        path = Path(path)
        write_atomic(path, json.dumps(self.to_dict(), indent=1, default=str) + "\n")
        return path

    def write_html(self, path: str | Path) -> Path:
        from .page import page

        path = Path(path)
        write_atomic(path, page(self))
        return path

    def __repr__(self) -> str:
        return f"GradeReport({self.file}: {self.verdict.splitlines()[0][:120]})"

    def __str__(self) -> str:
        from .text import summary

        return summary(self)

    def _repr_html_(self) -> str:
        from .page import body

        return body(self)
