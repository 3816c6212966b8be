"""Learning: the auto-graded exercises (:mod:`.exercises`, public as ``workbench.exercises``),
the interview deck (:mod:`.interview`) and flash cards (:mod:`.flashcards`,
:mod:`.deck_progress`).

May import: kernels, roofline, workbench.harness, .isa, .model, .comm, .views, .train. Never
workbench.widgets: the flash-card widget (``workbench.widgets.FlashCards``) imports this
package; the exercise widgets live beside the exercises (:mod:`.exercises.widgets`, loaded
only when one is asked for) and take what they show as plain data.
"""
