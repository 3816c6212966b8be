"""Learning: the auto-graded exercises (:mod:`.exercises`, public as ``workbench.exercises``),
the interview deck (:mod:`.interview`) and flash cards (:mod:`.flashcards`,
:mod:`.deck_progress`).

May import: kernels, roofline, workbench.harness, .isa, .model, .comm, .views. Never train or
widgets: the exercise and flash-card widgets (``workbench.widgets``) import this package,
not the other way round.
"""
