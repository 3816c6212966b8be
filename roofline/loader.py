"""Read and validate one GPU spec file (YAML) into a ``GpuSpec``.

Spec files are data that users write by hand, so every mistake must fail loudly at load
time with the file and the field named, instead of surfacing later as a wrong roof. The
format is documented in roofline/README.md; in short every number is a mapping
``{value: <number or null>, source: [<tags>], note/derived/uncertain: <text>}``, because a
number without a source is not allowed into a roofline.
"""

import re
from functools import lru_cache
from importlib.resources import files
from numbers import Real
from pathlib import Path
from types import MappingProxyType

import yaml

from .dtypes import DTYPES
from .spec import LEVELS, GpuSpec, Provenance

_TOP = {"name", "aliases", "vendor", "arch", "target", "notes", "sources", "wave_size",
        "compute_units", "xcds", "clock_ghz", "peak_tflops", "peak_tflops_vector",
        "capacity", "bandwidth_tbps", "interconnect"}
_CAPACITY = ("hbm_gb", "l2_mib", "llc_mib", "lds_kib_per_cu", "l1_kib_per_cu",
             "regfile_kib_per_cu")
# GPU-to-GPU fabric (Infinity Fabric / NVLink), per GPU, bidirectional GB/s as datasheets quote it.
_INTERCONNECT = ("links", "link_gbps", "total_gbps")
_ENTRY = {"value", "source", "note", "derived", "uncertain", "format"}
_INTEGER_FIELDS = {"wave_size", "compute_units", "xcds"}


def _tag_order(tag: str):
    """S2 before S10, S7a before S7b."""
    letters, number, rest = re.fullmatch(r"([^\d]*)(\d*)(.*)", tag).groups()
    return letters, int(number or 0), rest


def _citation(entry) -> str:
    if isinstance(entry, str):
        return entry
    return " | ".join(str(entry[k]) for k in ("title", "url", "where") if k in entry)


@lru_cache(maxsize=None)
def shared_sources() -> dict:
    """Citations for the tags used by the built-in spec files (roofline/sources.yaml)."""
    data = yaml.safe_load(files("roofline").joinpath("sources.yaml").read_text("utf-8"))
    return {tag: _citation(entry) for tag, entry in data.items()}


class _Reader:
    """Validates one parsed file; remembers the file name for every error message."""

    def __init__(self, where: str, data, known_sources: dict):
        self.where = where
        if not isinstance(data, dict):
            self.fail("(file)", f"expected a mapping at top level, got {type(data).__name__}")
        self.data = data
        own = data.get("sources") or {}
        if not isinstance(own, dict):
            self.fail("sources", "must be a mapping of tag -> citation")
        self.sources = {**known_sources, **{str(k): _citation(v) for k, v in own.items()}}
        self.provenance = {}
        self.used_tags = set()

    def fail(self, field, problem):
        raise ValueError(f"{self.where}: field {field!r}: {problem}")

    def text(self, field, required=True):
        value = self.data.get(field)
        if value is None and not required:
            return None
        if not isinstance(value, str) or not value.strip():
            self.fail(field, "missing" if value is None else "must be a non-empty string")
        return value.strip()

    def texts(self, field):
        value = self.data.get(field, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            self.fail(field, "must be a list of strings")
        return tuple(value)

    def number(self, field, entry, nullable, integer=False):
        """One ``{value, source, ...}`` entry -> its value; records its provenance."""
        if entry is None:
            self.fail(field, "missing")
        if not isinstance(entry, dict):
            self.fail(field, f"must be a mapping {{value: ..., source: [...]}}, "
                             f"got {type(entry).__name__}")
        extra = set(entry) - _ENTRY
        if extra or ("format" in entry and not field.startswith("peak_tflops.")):
            self.fail(field, f"unknown key(s) {sorted(extra) or ['format']}")
        if "value" not in entry:
            self.fail(field, "missing 'value'")
        value = entry["value"]
        if value is None:
            if not nullable:
                self.fail(field, "must not be null")
        elif isinstance(value, bool) or not isinstance(value, Real):
            self.fail(field, f"must be a number, got {type(value).__name__}")
        elif integer and value != int(value):
            self.fail(field, f"must be an integer, got {value}")
        elif value <= 0:
            self.fail(field, f"must be positive, got {value}")
        source = entry.get("source")
        if not isinstance(source, list) or not source or \
                not all(isinstance(s, str) for s in source):
            self.fail(field, "needs 'source': a non-empty list of source tags")
        unknown = [s for s in source if s not in self.sources]
        if unknown:
            self.fail(field, f"unknown source tag(s) {unknown}; define them under 'sources:'")
        for key in ("note", "derived", "uncertain", "format"):
            if key in entry and not isinstance(entry[key], str):
                self.fail(field, f"'{key}' must be a string")
        self.used_tags.update(source)
        self.provenance[field] = Provenance(tuple(source), entry.get("note"),
                                            entry.get("derived"), entry.get("uncertain"))
        return int(value) if integer and value is not None else value

    def table(self, field, allowed, nullable, required=False):
        """A mapping of name -> entry, where the names must come from ``allowed``."""
        table = self.data.get(field)
        if table is None:
            if required:
                self.fail(field, "missing")
            return {}
        if not isinstance(table, dict):
            self.fail(field, "must be a mapping")
        unknown = [k for k in table if k not in allowed]
        if unknown:
            what = "dtype" if field.startswith("peak") else "key"
            self.fail(field, f"unknown {what}(s) {unknown}; known: {', '.join(allowed)}")
        return {k: self.number(f"{field}.{k}", table[k], nullable) for k in allowed
                if k in table}


def parse_spec(data, where: str, known_sources: dict) -> GpuSpec:
    """Validate already-parsed YAML ``data``; ``where`` names the file in errors."""
    r = _Reader(where, data, known_sources)
    unknown = set(r.data) - _TOP
    if unknown:
        r.fail(sorted(unknown)[0], f"unknown field; known fields: {', '.join(sorted(_TOP))}")
    scalars = {f: r.number(f, r.data.get(f), nullable=False, integer=f in _INTEGER_FIELDS)
               for f in ("wave_size", "compute_units", "clock_ghz")}
    xcds = (r.number("xcds", r.data["xcds"], nullable=False, integer=True)
            if "xcds" in r.data else None)
    peaks = r.table("peak_tflops", DTYPES, nullable=True, required=True)
    if not any(peaks.values()):
        r.fail("peak_tflops", "needs at least one supported dtype")
    vector = r.table("peak_tflops_vector", DTYPES, nullable=False)
    capacity = r.table("capacity", _CAPACITY, nullable=True)
    levels = r.table("bandwidth_tbps", LEVELS, nullable=False, required=True)
    interconnect = r.table("interconnect", _INTERCONNECT, nullable=False)
    if "hbm" not in levels:
        r.fail("bandwidth_tbps.hbm", "missing")
    formats = {d: e["format"] for d, e in r.data["peak_tflops"].items() if "format" in e}
    name = r.text("name")
    aliases = tuple(dict.fromkeys((name,) + r.texts("aliases")))
    return GpuSpec(
        name=name, vendor=r.text("vendor"), arch=r.text("arch"), target=r.text("target"),
        aliases=aliases, xcds=xcds, notes=r.texts("notes"), path=where,
        peak_tflops=MappingProxyType({d: peaks.get(d) for d in DTYPES}),
        peak_tflops_vector=MappingProxyType(vector), formats=MappingProxyType(formats),
        memory_levels=MappingProxyType(levels), interconnect=MappingProxyType(interconnect),
        provenance=MappingProxyType(r.provenance),
        sources=MappingProxyType({t: r.sources[t] for t in sorted(r.used_tags, key=_tag_order)}),
        **scalars, **capacity)


def load_spec(path) -> GpuSpec:
    """Load a user's GPU spec file; errors name the file and the field."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ValueError(f"{path}: cannot read spec file ({err.strerror})") from err
    return parse_text(text, str(path))


def parse_text(text: str, where: str) -> GpuSpec:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ValueError(f"{where}: not valid YAML: {err}") from err
    return parse_spec(data, where, dict(shared_sources()))
