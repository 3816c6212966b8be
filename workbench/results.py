"""Tidy result rows, saved and loaded as JSON or CSV with a schema check.

One row is one (op, rung, shape, dtype) measurement on one GPU. Files carry a schema
name and version; loading refuses anything else with a clear error. Nothing is
unpickled: JSON and CSV only. Recorded rows measured on real GPUs ship in
``workbench/recorded/`` so CPU-only users still see real numbers, always with the GPU
and date they came from.
"""
from __future__ import annotations

import csv
import dataclasses
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Iterable

SCHEMA = "amd-kernel-workbench/results"
VERSION = 1


class ResultsFormatError(ValueError):
    """A results file that is corrupt, foreign, or of another schema version."""


@dataclass(frozen=True)
class ResultRow:
    op: str
    rung: str            # "v2", "ref", ...
    name: str            # rung short name
    shape: str           # "4096x4096x4096" (the op's shape_names order)
    dtype: str
    ms: float
    tflops: float
    gbps: float
    ratio_to_ref: float  # ref's ms / this rung's ms, same shape, dtype and run
    gpu: str
    backend: str
    arch: str
    torch_version: str
    triton_version: str
    commit: str
    timestamp: str       # ISO 8601, UTC


FIELDS = tuple(f.name for f in dataclasses.fields(ResultRow))
_TYPES = {f.name: (float if f.type == "float" else str) for f in dataclasses.fields(ResultRow)}


def _row_from_mapping(raw: dict, where: str) -> ResultRow:
    if not isinstance(raw, dict):
        raise ResultsFormatError(f"{where}: a row must be an object, got {type(raw).__name__}")
    missing = [f for f in FIELDS if f not in raw]
    extra = [k for k in raw if k not in _TYPES]
    if missing or extra:
        raise ResultsFormatError(f"{where}: missing fields {missing}, unknown fields {extra}")
    values = {}
    for name, kind in _TYPES.items():
        try:
            values[name] = kind(raw[name])
        except (TypeError, ValueError) as exc:
            raise ResultsFormatError(f"{where}: field {name!r} is not a {kind.__name__}: "
                                     f"{raw[name]!r}") from exc
    return ResultRow(**values)


def save(rows: Iterable[ResultRow], path: str | Path) -> Path:
    """Write rows as .json (with schema header) or .csv (header = field names)."""
    path, rows = Path(path), list(rows)
    if path.suffix == ".json":
        doc = {"schema": SCHEMA, "version": VERSION, "rows": [dataclasses.asdict(r) for r in rows]}
        path.write_text(json.dumps(doc, indent=1) + "\n")
    elif path.suffix == ".csv":
        with path.open("w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=FIELDS)
            writer.writeheader()
            writer.writerows(dataclasses.asdict(r) for r in rows)
    else:
        raise ValueError(f"{path}: results are saved as .json or .csv")
    return path


def load(path: str | Path) -> list[ResultRow]:
    path = Path(path)
    if path.suffix == ".json":
        try:
            doc = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ResultsFormatError(f"{path}: not valid JSON ({exc})") from exc
        if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
            raise ResultsFormatError(f"{path}: not a workbench results file (schema must be {SCHEMA!r})")
        if doc.get("version") != VERSION:
            raise ResultsFormatError(f"{path}: schema version {doc.get('version')!r}, "
                                     f"this workbench reads version {VERSION}")
        if not isinstance(doc.get("rows"), list):
            raise ResultsFormatError(f"{path}: 'rows' must be a list")
        return [_row_from_mapping(r, f"{path} row {i}") for i, r in enumerate(doc["rows"])]
    if path.suffix == ".csv":
        with path.open(newline="") as fh:
            reader = csv.DictReader(fh)
            if tuple(reader.fieldnames or ()) != FIELDS:
                raise ResultsFormatError(f"{path}: CSV header must be {','.join(FIELDS)}")
            return [_row_from_mapping(r, f"{path} line {i + 2}") for i, r in enumerate(reader)]
    raise ValueError(f"{path}: results are loaded from .json or .csv")


def _recorded_dir():
    return resources.files("workbench") / "recorded"


def recorded() -> list[dict]:
    """The GPU result files that ship with the package: gpu, date, rows, file name."""
    listing, folder = [], _recorded_dir()
    if not folder.is_dir():   # an installed wheel has the folder only once files ship in it
        return listing
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".json"):
            rows = load(Path(str(entry)))
            listing.append(dict(gpu=rows[0].gpu if rows else "?", rows=len(rows), file=entry.name,
                                date=max((r.timestamp for r in rows), default="")[:10]))
    return listing


def load_recorded(gpu: str | None = None) -> list[ResultRow]:
    """Rows of every shipped file, or of those whose GPU name contains ``gpu``."""
    rows = []
    for item in recorded():
        if gpu is None or gpu.lower() in item["gpu"].lower():
            rows += load(Path(str(_recorded_dir() / item["file"])))
    return rows
