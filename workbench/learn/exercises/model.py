"""What an exercise is: a kernel to complete, or a question whose answer the workbench computes.

A :class:`KernelExercise` is a rung with its one idea cut out (:mod:`.source`); the
package's rung is the solution, so an exercise is right exactly when the rung it teaches
is. An :class:`AnswerExercise` is for a rung whose idea is not a kernel edit (a program
order, a roofline reading, an instruction in the ISA): its answer is a function of the
workbench's own data, so a change to a spec or a kernel changes the expected answer with it.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Callable


@dataclass(frozen=True)
class Verdict:
    """A check's outcome; ``message`` states the rule that failed (or what passed).

    ``predict`` gives the performance model's line for a correct kernel (its predicted
    time beside the rung below's): shown, never graded. It compiles the learner's file
    ahead of time (seconds), so it is worked out when the verdict is first shown
    (:attr:`predicted`), not when it is graded."""

    passed: bool
    message: str
    reports: tuple = ()          # the harness's CheckReports, the failing one last
    speed: str = ""              # the speed target's outcome, or why it was not checked
    predict: Callable[[], str] | None = field(default=None, compare=False, repr=False)

    @functools.cached_property
    def predicted(self) -> str:
        """The model's line ("" without one); never part of ``passed``."""
        return self.predict() if self.predict else ""

    def __str__(self) -> str:
        head = "PASS" if self.passed else "FAIL"
        return "\n".join(part for part in (f"{head}: {self.message}", self.speed, self.predicted) if part)

    def _repr_html_(self) -> str:
        """In a notebook: the message, and a wrong tile as the error heat map."""
        from .widgets import verdict_html
        return verdict_html(self)


@dataclass(frozen=True)
class KernelExercise:
    """Complete the marked blocks of ``module`` (a rung, or a comm algorithm's module).

    ``todo`` is what stands in each block in the learner's copy: code that imports and
    runs but is wrong, so the exercise fails as shipped. ``wrong`` holds plausible wrong
    answers (an off-by-one mask, a missing barrier) that its tests prove the checker
    rejects. Registry rungs (``op``, ``rung``) are graded by the correctness harness on
    ``shapes`` and ``dtypes``; anything else brings its own ``grade(module) -> Verdict``.
    """

    key: str
    module: str
    title: str
    task: str
    todo: dict[str, str]
    hints: tuple[str, str, str]
    wrong: dict[str, dict[str, str]]
    op: str | None = None
    rung: str | None = None
    shapes: tuple[tuple, ...] = ()
    dtypes: tuple = ()
    seeds: tuple[int, ...] = ()
    """Input seeds to check at (default: one fresh random seed per shape and dtype); for an op
    whose inputs vary by seed in kind, e.g. FP8's per-tensor (even) and per-channel (odd) scales."""
    grade: Callable[[ModuleType, list], Verdict] | None = field(default=None, compare=False)
    speed_target: float = 1.0
    """On a GPU the learner's rung must reach this fraction of the previous rung's speed
    or more (1.0: at least as fast, within 5 % noise)."""
    kind = "kernel"

    def __post_init__(self):
        if self.op is None and self.grade is None:
            raise ValueError(f"{self.key}: give op and rung (the harness grades it), or grade")
        if (self.op is None) != (self.rung is None):
            raise ValueError(f"{self.key}: op and rung go together")
        if len(self.hints) != 3:
            raise ValueError(f"{self.key}: a hint ladder has three hints")
        if not self.wrong:
            raise ValueError(f"{self.key}: name at least one plausible wrong answer")


@dataclass(frozen=True)
class AnswerExercise:
    """A question whose expected answer ``answer()`` computes from the workbench.

    Numbers pass within ``tolerance`` (relative); strings compare without case or
    surrounding space; sequences element by element. ``wrong`` lists plausible wrong
    answers the tests prove the checker rejects; ``explain`` is shown once it passes.
    """

    key: str
    title: str
    question: str
    answer: Callable[[], Any] = field(compare=False)
    hints: tuple[str, str, str]
    wrong: tuple
    tolerance: float = 0.0
    explain: str = ""
    kind = "answer"

    def __post_init__(self):
        if len(self.hints) != 3:
            raise ValueError(f"{self.key}: a hint ladder has three hints")
        if not self.wrong:
            raise ValueError(f"{self.key}: name at least one plausible wrong answer")


Exercise = KernelExercise | AnswerExercise
