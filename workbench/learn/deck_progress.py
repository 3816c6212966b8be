"""A learner's progress through a flash-card deck: per family, cards seen and answered right.

A card counts as right by its first checked answer only: after a wrong choice the verdict
names the right option, so a second try shows that the learner read it, not that they knew.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .flashcards import Card, Deck
from ..harness.table import html_table


@dataclass
class Progress:
    deck: Deck
    seen: set[Card] = field(default_factory=set)
    first_answer: dict[Card, bool] = field(default_factory=dict)

    def _known(self, card: Card) -> Card:
        if not any(card is c for c in self.deck):
            raise ValueError(f"card {card.topic!r} is not in the deck {self.deck.title!r}")
        return card

    def saw(self, card: Card) -> None:
        self.seen.add(self._known(card))

    def answered(self, card: Card, correct: bool) -> None:
        self.first_answer.setdefault(self._known(card), correct)

    def rows(self) -> list[dict]:
        """One row per family, then the total."""
        rows = [{"family": name, "cards": len(cards), "seen": sum(c in self.seen for c in cards),
                 "answered": sum(c in self.first_answer for c in cards),
                 "right at first try": sum(self.first_answer.get(c, False) for c in cards)}
                for name, cards in self.deck.families().items()]
        total = {"family": "all", **{k: sum(r[k] for r in rows) for k in rows[0] if k != "family"}}
        return rows + [total]

    def html(self) -> str:
        return html_table(self.rows(), caption="your progress, per family")
