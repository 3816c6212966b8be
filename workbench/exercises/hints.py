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

    def reveal(self) -> str:
        """The next hint (the last one again once all are shown)."""
        if self.remaining:
            self.shown += 1
            progress.record_hints(self.exercise.key, self.shown, self._progress_file)
        return self.exercise.hints[self.shown - 1]

    def widget(self):
        """A button that shows the next hint under the ones already shown."""
        from ..widgets.exercise_views import HintWidget
        return HintWidget(self)
