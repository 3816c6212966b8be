"""Which GPUs are known, and name lookup.

Built-in specs ship as package data (found through importlib.resources, so a wheel works);
users add or override GPUs with YAML files in the directories named by the environment
variable ``ROOFLINE_SPECS_DIR`` (``os.pathsep``-separated). A user file whose ``name``
matches a built-in replaces it, so a corrected datasheet needs no code change.

:func:`spec` takes a name or an alias; :func:`device_spec` takes a GPU as the device names
itself (torch's ``get_device_name``: "NVIDIA H100 80GB HBM3", "AMD Instinct MI300X VF"), the
one lookup by which the workbench knows which GPU it runs on or a results file came from.
"""

import os
import re
from functools import lru_cache
from importlib.resources import files
from pathlib import Path
from typing import Optional

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


def device_spec(device_name: str, target: Optional[str] = None, compute_units: Optional[int] = None) -> GpuSpec:
    """The spec of the GPU a device name names, as torch reports it ("NVIDIA H200", "NVIDIA
    H100 80GB HBM3", "AMD Instinct MI300X VF"); ``target`` ("sm_90", "gfx942") and
    ``compute_units`` (SMs or CUs), where known, must agree with it.

    In order: a name or alias (:func:`spec`; ``KeyError`` if it disagrees); else the spec whose name or alias is the
    longest found inside the device name ("H100" in "NVIDIA H100 80GB HBM3"); else, with
    both ``target`` and ``compute_units`` given, the first spec by name with those (a device
    name that names no known GPU). A name found inside is trusted: a variant with other
    clocks and the same SM count (H100 NVL) would take the SXM part's spec. ``KeyError``
    when nothing fits.
    """
    def agrees(s: GpuSpec) -> bool:
        return target in (None, s.target) and compute_units in (None, s.compute_units)

    try:
        named = spec(device_name)
    except KeyError:
        named = None
    if named is not None:
        if agrees(named):
            return named
        raise KeyError(f"{device_name!r} names {named.name} ({named.target}, {named.compute_units} compute "
                       f"units), which disagrees with {target} and {compute_units}")
    device = _key(device_name)

    def inside(s: GpuSpec) -> int:   # the longest of its names inside the device name; 0: none
        return max((len(_key(a)) for a in (s.name, *s.aliases) if _key(a) in device), default=0)

    fits = sorted((s for s in _current()[0].values() if agrees(s)), key=lambda s: s.name)
    best = max(fits, key=inside, default=None)
    if best is not None and inside(best):
        return best
    if target is not None and compute_units is not None and fits:
        return fits[0]
    where = (f" on {target}" if target else "") + (f" with {compute_units} compute units" if compute_units else "")
    raise KeyError(f"unknown GPU {device_name!r}{where}; known: {', '.join(gpus())}. "
                   f"Add a YAML file to ${ENV_VAR} or use roofline.load_spec(path).")
