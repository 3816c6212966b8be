"""Flash cards whose answers the workbench computes: a deck a reader checks themselves on.

A card is a question plus three callables: the answer text, the evidence (HTML parts:
tables of ISA counts, spec rows, model numbers) and, for multiple choice, the claims
each option makes, evaluated on that evidence. Nothing in an answer is typed in: an
instruction name comes from a compile, a ridge point from the spec, an FP8 maximum from
``torch.finfo``. So the deck stays right when a kernel, a spec or torch changes, and a
test that pins the answers fails when it does not.

    >>> from workbench.learn.interview import deck                        # doctest: +SKIP
    >>> card = deck().card(0)                                       # doctest: +SKIP
    >>> card.options, card.choose(card.options[0]).correct          # doctest: +SKIP
    >>> card.reveal()                                               # doctest: +SKIP

Rendered without a widget (a committed notebook, GitHub), every answer stays folded in a
``<details>`` element: a reader sees the question first and opens the answer on purpose.
"""
from __future__ import annotations

import functools
import html
import random
import re
from dataclasses import dataclass, field
from typing import Callable


def inline_html(text: str) -> str:
    """One paragraph of prose as HTML: whitespace folded, `backticks` mark code."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(" ".join(text.split())))


def text_html(text: str) -> str:
    """Answer prose as HTML: blank lines split paragraphs."""
    return "".join(f"<p>{inline_html(b)}</p>" for b in text.split("\n\n") if b.strip())


def one_of(right, candidates, label: str = "{}") -> dict[str, bool]:
    """Claims for a question whose answer is one computed value: each candidate, formatted
    with ``label``, holds where it equals ``right`` (none holds if the computation moved
    off every candidate, and the card then says so)."""
    return {label.format(candidate): candidate == right for candidate in candidates}


@dataclass(frozen=True)
class Revealed:
    """A card's answer with the evidence behind it, as computed just now."""

    answer: str
    evidence: tuple[str, ...]

    def html(self) -> str:
        return text_html(self.answer) + "".join(self.evidence)

    def _repr_html_(self) -> str:
        return self.html()


@dataclass(frozen=True)
class Verdict:
    """The result of choosing an option: right or wrong, and which one was right."""

    chosen: str
    correct: bool
    right: str

    def __str__(self) -> str:
        return "correct" if self.correct else f"incorrect: the answer is {self.right!r}"


@dataclass(eq=False)
class Card:
    """One question. ``claims`` maps each option to whether the evidence bears it out;
    exactly one must hold, else the card is wrong and says so rather than guessing.

    The options are shown in an order shuffled with the topic as seed: the claims are
    written with the right one wherever it reads best (often first), and a learner must
    not learn that position instead of the answer. The order is the same on every run."""

    topic: str
    question: str
    answer: Callable[[], str] = field(repr=False)
    evidence: Callable[[], list[str]] = field(repr=False)
    claims: Callable[[], dict[str, bool]] | None = field(default=None, repr=False)
    family: str = "other"

    @functools.cached_property
    def _claims(self) -> dict[str, bool]:
        if self.claims is None:
            return {}
        claims = self.claims()
        true = [option for option, holds in claims.items() if holds]
        if len(true) != 1:
            raise RuntimeError(f"card {self.topic!r}: exactly one option must hold, "
                               f"the evidence bears out {true or 'none'}")
        order = list(claims)
        random.Random(self.topic).shuffle(order)
        return {option: claims[option] for option in order}

    @property
    def options(self) -> list[str]:
        """The multiple-choice options, shuffled (empty for an open question)."""
        return list(self._claims)

    @property
    def correct_option(self) -> str:
        if not self._claims:
            raise ValueError(f"card {self.topic!r} is an open question: it has no options")
        return next(option for option, holds in self._claims.items() if holds)

    def choose(self, option: str) -> Verdict:
        """Check a choice: ``option`` must be one of :attr:`options`."""
        right = self.correct_option
        if option not in self._claims:
            raise ValueError(f"option must be one of {self.options}, got {option!r}")
        return Verdict(option, option == right, right)

    @functools.cached_property
    def _revealed(self) -> Revealed:
        return Revealed(self.answer(), tuple(self.evidence()))

    def reveal(self) -> Revealed:
        """The answer and its evidence (computed once per card, then kept)."""
        return self._revealed

    def question_html(self, number: int | None = None, options: bool = True) -> str:
        """The question; ``options=False`` leaves the options out, for a widget whose
        radio buttons list them (listed twice, they read as two questions)."""
        label = f"{number}. " if number is not None else ""
        listed = "".join(f"<li>{html.escape(o)}</li>" for o in self.options) if options else ""
        return (f"<p><b>{label}{html.escape(self.topic)}.</b> {inline_html(self.question)}</p>"
                + (f"<ol type='a'>{listed}</ol>" if listed else ""))

    def folded_html(self, number: int | None = None) -> str:
        """The question in the open, the answer in a closed ``<details>``."""
        return (f"<div>{self.question_html(number)}<details><summary>Show answer</summary>"
                f"{self.reveal().html()}</details></div>")

    def _repr_html_(self) -> str:
        return self.folded_html()


@dataclass(frozen=True)
class Deck:
    title: str
    cards: tuple[Card, ...]

    def __len__(self) -> int:
        return len(self.cards)

    def __iter__(self):
        return iter(self.cards)

    def card(self, index: int) -> Card:
        if not isinstance(index, int) or not 0 <= index < len(self.cards):
            raise IndexError(f"index must be an int in 0..{len(self.cards) - 1}, got {index!r}")
        return self.cards[index]

    def families(self) -> dict[str, tuple[Card, ...]]:
        """The cards by family, families in the order of their first card."""
        grouped: dict[str, list[Card]] = {}
        for card in self.cards:
            grouped.setdefault(card.family, []).append(card)
        return {name: tuple(cards) for name, cards in grouped.items()}

    def family(self, name: str) -> "Deck":
        """One family's cards as a deck of their own (a notebook section shows one)."""
        families = self.families()
        if name not in families:
            raise KeyError(f"family must be one of {list(families)}, got {name!r}")
        return Deck(f"{self.title}: {name}", families[name])

    def mock(self, n: int, seed: int = 0) -> "Deck":
        """A mock interview: ``n`` cards drawn at random (``seed``), one family after
        another, so the interview spans as many families as ``n`` allows before it
        repeats one, as an interviewer moves from topic to topic."""
        if not isinstance(n, int) or not 1 <= n <= len(self.cards):
            raise ValueError(f"n must be an int in 1..{len(self.cards)}, got {n!r}")
        rng = random.Random(seed)
        pools = [rng.sample(cards, len(cards)) for cards in self.families().values()]
        rng.shuffle(pools)
        drawn: list[Card] = []
        while len(drawn) < n:
            for pool in pools:
                if pool and len(drawn) < n:
                    drawn.append(pool.pop())
        return Deck(f"Mock interview ({n} cards, seed {seed})", tuple(drawn))

    def static_html(self) -> str:
        """Every card, answers folded: what a viewer that cannot run widgets shows."""
        cards = "".join(card.folded_html(i + 1) for i, card in enumerate(self.cards))
        return (f"<div><b>{html.escape(self.title)}</b> <i>({len(self.cards)} cards; "
                f"each answer is folded: open it after answering)</i>{cards}</div>")

    def _repr_html_(self) -> str:
        return self.static_html()
