"""tests/fp8_recipe_launches.py records a recipe's FP8 GEMMs with their launches stubbed (not
run): the set it returns must be the one a real run launches, for a pair of recipe and
gradient format whose backward mixes e4m3 and e5m2 operands."""
from __future__ import annotations

import pytest

from fp8_recipe_launches import recipe_launches


@pytest.mark.slow   # the real run interprets the forward and backward GEMMs
def test_stubbed_launches_are_the_ones_a_run_launches():
    stubbed = recipe_launches("tensorwise", "hybrid")
    assert stubbed and any("e5m2" in a for *_, a, _ in stubbed), stubbed
    assert recipe_launches("tensorwise", "hybrid", stub=False) == stubbed
