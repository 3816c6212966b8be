"""Hypothesis profiles for the fuzz suite.

``ci`` (the default) is derandomized and bounded so that the whole suite runs in a few
minutes on two CPU cores under the interpreter: a CI run is repeatable, and a failure it
finds is found again. ``long`` (``make fuzz``, i.e. ``--hypothesis-profile=long``) draws
many more examples from a fresh seed each run, to find what ``ci`` does not.
"""
from __future__ import annotations

from hypothesis import HealthCheck, settings

_SHARED = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])   # the interpreter is slow
settings.register_profile("ci", derandomize=True, max_examples=16, print_blob=True, **_SHARED)
# derandomize=False stated: under CI=true Hypothesis makes derandomizing the default that
# profiles inherit, and `make fuzz` is meant to draw fresh examples there too.
settings.register_profile("long", max_examples=200, derandomize=False, **_SHARED)


def pytest_configure(config):
    """``ci`` unless the command line names a profile. This conftest may load after the
    hypothesis plugin applied ``--hypothesis-profile`` (when pytest is given ``tests``,
    not ``tests/fuzz``), so the choice is made again here."""
    settings.load_profile(config.getoption("--hypothesis-profile") or "ci")
