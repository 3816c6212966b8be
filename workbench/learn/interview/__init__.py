"""Interview questions for AMD kernel and training engineers, answered by the workbench.

The deck is grouped in families, one module each, in the order an interview loop tends
to run: porting, the matrix-core fragment, wave reductions, LDS swizzles, occupancy, the
attention backward, FP8, expert-parallel collectives, triage, GPU trade-offs, tuning.
Each card's answer and evidence are computed when revealed: ISA facts from ahead-of-time
compiles (:mod:`workbench.isa`), hardware facts from the roofline specs, FP8 facts from
torch's dtypes, collective times from the alpha-beta model (labelled model), tuning
stories from the shipped ``tuned_space.json`` tables. A performance number is a model
number: ``workbench/recorded/`` holds measured rows when there are some.

    >>> from workbench.learn import interview                             # doctest: +SKIP
    >>> deck = interview.deck()                                     # doctest: +SKIP
    >>> deck.families().keys(), deck.mock(5, seed=1)                # doctest: +SKIP
"""
from __future__ import annotations

from ..flashcards import Deck
from . import (attention_backward, distributed, fp8, gpus, mfma, occupancy, porting, reduction, swizzle,
               triage, tuning)

FAMILIES = (porting, mfma, reduction, swizzle, occupancy, attention_backward, fp8, distributed, triage,
            gpus, tuning)


def deck() -> Deck:
    """Every card, family by family."""
    return Deck("Interview prep: AMD kernel and training engineering",
                tuple(card for family in FAMILIES for card in family.cards()))
