"""A flash-card widget: the question first, the answer only when "Show answer" is pressed.

Self-check works only if the answer stays out of sight until asked for, so the answer
area is empty whenever a card is shown and is filled by :meth:`FlashCards.show_answer`
(the button calls it). A choice is checked by :meth:`FlashCards.check` without revealing
the evidence. Tests drive those methods, users click. Saved in a notebook, the widget's
display carries the deck's static copy, every answer folded in ``<details>``.

The options are listed once, as the radio buttons, which span the output's width:
ipywidgets' default radio box is a narrow fixed width in which a long option wraps onto
the next one's line, covering its button. Progress per family (seen, right at the first
try) is kept in :attr:`FlashCards.progress` and shown under the card.
"""
from __future__ import annotations

import html

import ipywidgets as w

from ..learn.deck_progress import Progress
from ..learn.flashcards import Deck, Revealed, Verdict
from ..views.render import show

FULL_WIDTH = "100%"


class FlashCards:
    def __init__(self, deck: Deck):
        self.deck = deck
        self.picker = w.Dropdown(description="card", layout=w.Layout(width=FULL_WIDTH), options=[
            (f"{i + 1}. {card.topic}", i) for i, card in enumerate(deck)], value=0)
        self.question = w.HTML()
        self.choices = w.RadioButtons(options=[], value=None, layout=w.Layout(width=FULL_WIDTH))
        self.check_button = w.Button(description="Check my choice")
        self.verdict = w.HTML()
        self.answer_button = w.Button(description="Show answer", button_style="primary")
        self.answer = w.Output()
        self.progress = Progress(deck)
        self.progress_view = w.HTML()
        self.picker.observe(lambda change: self.show(change["new"]), names="value")
        self.check_button.on_click(lambda _: self._safely(self.check))
        self.answer_button.on_click(lambda _: self._safely(self.show_answer))
        self.widget = w.VBox([self.picker, self.question, self.choices, self.check_button,
                              self.verdict, self.answer_button, self.answer, self.progress_view])
        self.show(0)

    @property
    def card(self):
        return self.deck.card(self.picker.value)

    @property
    def answer_shown(self) -> bool:
        return bool(self.answer.outputs)

    def show(self, index: int) -> "FlashCards":
        """Put card ``index`` up with its answer hidden."""
        card = self.deck.card(index)
        if self.picker.value != index:
            self.picker.value = index      # its observer comes back here
            return self
        self.question.value = card.question_html(index + 1, options=False)
        self.choices.options = card.options
        self.choices.value = None
        self.choices.layout.display = None if card.options else "none"
        self.check_button.layout.display = None if card.options else "none"
        self.verdict.value = ""
        self.answer.outputs = ()
        self.progress.saw(card)
        self.progress_view.value = self.progress.html()
        return self

    def check(self, option: str | None = None) -> Verdict:
        """Check ``option`` (default: the selected radio button) and say whether it is right."""
        if option is not None:
            self.choices.value = option
        if self.choices.value is None:
            raise ValueError("choose an option first")
        verdict = self.card.choose(self.choices.value)
        self.verdict.value = f"<b>{html.escape(str(verdict))}</b>"
        self.progress.answered(self.card, verdict.correct)
        self.progress_view.value = self.progress.html()
        return verdict

    def show_answer(self) -> Revealed:
        revealed = self.card.reveal()
        show(self.answer, [revealed.html()])
        return revealed

    def _safely(self, action) -> None:
        try:
            action()
        except Exception as error:  # a click has no caller to raise to: show the reason
            self.verdict.value = f"<b>failed:</b> {html.escape(str(error))}"

    def _repr_mimebundle_(self, **kwargs) -> dict:
        """The widget for a live frontend; the folded static deck for any other viewer."""
        return {**self.widget._repr_mimebundle_(**kwargs), "text/html": self.deck.static_html(),
                "text/plain": f"{self.deck.title} (a flash-card widget: run the notebook to use it)"}
