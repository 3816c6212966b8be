"""The fuzz profiles do what conftest.py and the README say: ``ci`` by default, repeatable
and bounded; ``long`` from ``make fuzz``, with more examples from a fresh seed."""
from __future__ import annotations

import re
from pathlib import Path

from hypothesis import settings

MAKEFILE = (Path(__file__).resolve().parents[2] / "Makefile").read_text()


def test_ci_is_the_default_and_the_command_line_chooses_another(pytestconfig):
    chosen = pytestconfig.getoption("--hypothesis-profile")
    assert settings.get_current_profile_name() == (chosen or "ci")


def test_ci_is_repeatable_and_long_draws_more_from_fresh_seeds():
    ci, long = settings.get_profile("ci"), settings.get_profile("long")
    assert ci.derandomize and not long.derandomize
    assert ci.deadline is None and long.deadline is None
    assert long.max_examples >= 10 * ci.max_examples


def test_make_fuzz_runs_only_the_fuzz_tests_in_the_long_profile():
    recipe = re.search(r"^fuzz:.*\n\t(.*)$", MAKEFILE, re.M).group(1)
    assert "pytest" in recipe and " tests/fuzz " in recipe and "--hypothesis-profile=long" in recipe
