"""torch.compile's on-disk caches keyed by this package's source.

Inductor's FX-graph cache and AOTAutograd's cache key a compiled graph by the graph, the
configs and the versions, not by the fake (meta) implementations of the custom ops in it.
A graph compiled against one version of a ``kernels::`` op's fake (say, contiguous
gradients) is reused after the fake changes (gradients in their inputs' layouts) and its
stride asserts then fail against the real op (seen with the attention backward's fakes on a
machine that kept ``/tmp/torchinductor_$USER`` across the change). torch's documented way to
break those caches is ``torch.compiler.config.cache_key_tag``: :func:`tag` appends a digest of
every source file of the package to it (about 1 MB, a few milliseconds), once, at import; a
user's own tag is kept in front.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import torch

PACKAGE = Path(__file__).resolve().parent


def digest(root: Path = PACKAGE) -> str:
    """A digest of the package's ``.py`` files, names and contents, in a fixed order."""
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def tag() -> str:
    """Append this source's digest to ``torch.compiler.config.cache_key_tag``; returns the part added."""
    ours = f"[kernels {digest()}]"
    config = getattr(torch.compiler, "config", None)
    if config is not None and hasattr(config, "cache_key_tag") and ours not in config.cache_key_tag:
        config.cache_key_tag = config.cache_key_tag + ours
    return ours
