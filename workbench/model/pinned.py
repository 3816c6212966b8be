"""The tile config a tuner's question pins for one prediction (:func:`.candidates.predict_config`).

A rung's plan (:func:`.gemm.plan`) reads :func:`pinned` in place of its own choice. The pin
lives apart from the prediction that sets it, so the plan reads it without importing the
model's entry point (which imports the plan).
"""
from __future__ import annotations

import contextlib
import contextvars

_PINNED: contextvars.ContextVar[dict | None] = contextvars.ContextVar("model_pinned_config", default=None)


def pinned() -> dict | None:
    """The config :func:`pinning` pinned for the prediction under way, else None."""
    return _PINNED.get()


@contextlib.contextmanager
def pinning(config: dict):
    """Within the block, :func:`pinned` is (a copy of) ``config``."""
    token = _PINNED.set(dict(config))
    try:
        yield
    finally:
        _PINNED.reset(token)
