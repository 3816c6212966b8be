"""Three hints per exercise, revealed one at a time: the first points, the last nearly tells.

The count shown is kept in the learner's progress, so reopening a notebook does not hide
hints already read, and the progress table can say how much help a pass took.
"""
from __future__ import annotations

from . import progress
from .model import Exercise


class HintLadder:
    def __init__(self, exercise: Exercise, progress_file=None):
        self.exercise = exercise
        self._progress_file = progress_file
        self.shown = progress.load(progress_file).get(exercise.key, {}).get("hints", 0)

    @property
    def revealed(self) -> list[str]:
        return list(self.exercise.hints[:self.shown])

    @property
    def remaining(self) -> int:
        return len(self.exercise.hints) - self.shown

    def reveal(self) -> str | None:
        """The next hint, or None once all are shown: repeating the last would read as a new one."""
        if not self.remaining:
            return None
        self.shown += 1
        progress.record_hints(self.exercise.key, self.shown, self._progress_file)
        return self.exercise.hints[self.shown - 1]

    def next_line(self) -> str:
        """What ``workbench exercise hint`` prints: the next hint with its place on the ladder,
        or that there are no more (a terminal has no button to grey out)."""
        total = len(self.exercise.hints)
        hint = self.reveal()
        if hint is None:
            return f"no more hints for {self.exercise.key}: all {total} have been shown"
        return f"hint {self.shown} of {total}: {hint}"

    def widget(self):
        """A button that shows the next hint under the ones already shown."""
        from .widgets import HintWidget
        return HintWidget(self)
