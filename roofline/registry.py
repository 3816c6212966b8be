"""Which GPUs are known, and name lookup.

Built-in specs ship as package data (found through importlib.resources, so a wheel works);
users add or override GPUs with YAML files in the directories named by the environment
variable ``ROOFLINE_SPECS_DIR`` (``os.pathsep``-separated). A user file whose ``name``
matches a built-in replaces it, so a corrected datasheet needs no code change.
"""

import os
import re
from functools import lru_cache
from importlib.resources import files
from pathlib import Path

from .loader import load_spec, parse_text
from .spec import GpuSpec

ENV_VAR = "ROOFLINE_SPECS_DIR"


def _key(name: str) -> str:
    """Lookup key: case, spaces, dashes and underscores do not matter ("h100-sxm")."""
    return re.sub(r"[\s_\-]+", "", str(name)).lower()


def _builtin_specs():
    folder = files("roofline").joinpath("specs")
    return [parse_text(f.read_text("utf-8"), f"roofline/specs/{f.name}")
            for f in sorted(folder.iterdir(), key=lambda f: f.name)
            if f.name.endswith(".yaml")]


def _user_specs(env_value: str):
    specs = []
    for folder in filter(None, env_value.split(os.pathsep)):
        path = Path(folder)
        if not path.is_dir():
            raise ValueError(f"{ENV_VAR}: {folder!r} is not a directory")
        specs += [load_spec(f) for f in sorted(path.iterdir())
                  if f.suffix in (".yaml", ".yml")]
    return specs


@lru_cache(maxsize=8)
def _registry(env_value: str):
    """name -> spec and alias key -> name, for one value of the environment variable."""
    by_name = {}
    for s in _builtin_specs() + _user_specs(env_value):
        by_name[_key(s.name)] = s   # later (user) files override built-ins
    owner = {}
    for s in by_name.values():
        for alias in s.aliases:
            other = owner.setdefault(_key(alias), s)
            if other is not s:
                raise ValueError(f"GPU alias {alias!r} is claimed by both {other.path} "
                                 f"and {s.path}")
    return {s.name: s for s in by_name.values()}, {k: s.name for k, s in owner.items()}


def _current():
    return _registry(os.environ.get(ENV_VAR, ""))


def gpus() -> list:
    """Names of every known GPU, built-in and user-supplied."""
    return sorted(_current()[0])


def spec(name) -> GpuSpec:
    """The spec for ``name`` or any alias ("mi300x", "H100", "h200 sxm"); a spec passes through."""
    if isinstance(name, GpuSpec):
        return name
    specs, aliases = _current()
    try:
        return specs[aliases[_key(name)]]
    except KeyError:
        raise KeyError(f"unknown GPU {name!r}; known: {', '.join(sorted(specs))}. "
                       f"Add a YAML file to ${ENV_VAR} or use roofline.load_spec(path)."
                       ) from None
