"""Tidy result rows, saved and loaded as JSON or CSV with a schema check.

One row is one (op, rung, shape, dtype) case on one GPU: measured (``status`` "ok"), or
an error row (``status`` "error") that keeps the case and the error message and has no
numbers (``None``: JSON null, an empty CSV cell), so one failing case never costs the
rest of a run and is never drawn as a number. ``pass_name`` says which pass a row
times: "forward", or for rungs with a backward also "backward" and "forward+backward".
Files carry a schema name and version; version 1 files (no status or error: every row
measured) and version 2 files (no pass: every row a forward) still load; anything else
is refused with a clear error that names the file. Nothing is unpickled: JSON and CSV
only. A number is finite and not negative (``ms`` positive), a JSON number rather than a
string or a boolean: a NaN, "inf" or ``true`` in a file would otherwise be drawn on a chart.

A :class:`Recorder` saves its rows after each one, atomically, so a crash or Ctrl-C in
the middle of a benchmark leaves a valid file with every row measured so far. Recorded
rows measured on real GPUs ship in ``workbench/recorded/`` so CPU-only users still see
real numbers, always with the GPU and date they came from; a shipped file that does not
load is skipped with a warning, so it never hides the others.
"""
from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import warnings
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Iterable, Sequence

from kernels.atomic import write_atomic

SCHEMA = "amd-kernel-workbench/results"
VERSION = 3
SUFFIXES = (".json", ".csv")
PASSES = ("forward", "backward", "forward+backward")
MAX_BYTES = 64 * 2**20   # a quick suite's rows take well under 1 MiB; more is not a results file


class ResultsFormatError(ValueError):
    """A results file that is corrupt, foreign, or of another schema version."""


@dataclass(frozen=True)
class ResultRow:
    op: str
    rung: str            # "v2", "ref", ...
    name: str            # rung short name
    shape: str           # "4096x4096x4096" (the op's shape_names order)
    dtype: str
    ms: float | None     # None on an error row: nothing was measured
    tflops: float | None
    gbps: float | None
    ratio_to_ref: float | None  # ref's ms / this rung's ms, same shape, dtype, pass and run;
                                # None where ref itself failed in that run
    gpu: str
    backend: str
    arch: str
    torch_version: str
    triton_version: str
    commit: str
    timestamp: str       # ISO 8601, UTC
    status: str = "ok"   # "ok" (measured) or "error"
    error: str = ""      # an error row's message: why this case has no numbers
    pass_name: str = "forward"   # what was timed: one of PASSES (schema version 3)

    def __post_init__(self):
        for name in FIELDS:
            value = getattr(self, name)
            if name in NUMBERS:
                object.__setattr__(self, name, _number(name, value))
            elif not isinstance(value, str):
                raise ValueError(f"field {name!r} must be a str, got {value!r}")
        if self.ms == 0:
            raise ValueError("field 'ms' must be positive: nothing runs in 0 ms")
        if self.pass_name not in PASSES:
            raise ValueError(f"pass_name must be one of {PASSES}, got {self.pass_name!r}")
        numbers = [getattr(self, f) for f in MEASURED]
        if self.status == "ok":
            if self.error or any(v is None for v in numbers):
                raise ValueError("a measured row (status 'ok') has ms, tflops and gbps and no error")
        elif self.status == "error":
            if not self.error or any(v is not None for v in numbers + [self.ratio_to_ref]):
                raise ValueError("an error row has an error message and no numbers")
        else:
            raise ValueError(f"status must be 'ok' or 'error', got {self.status!r}")

    @property
    def ok(self) -> bool:
        """Measured: the row has numbers (an error row has only its message)."""
        return self.status == "ok"


FIELDS = tuple(f.name for f in dataclasses.fields(ResultRow))
FIELDS_V1 = FIELDS[:FIELDS.index("status")]   # version 1: every row was measured
FIELDS_V2 = FIELDS[:FIELDS.index("pass_name")]   # version 2: every row timed the forward
MEASURED = ("ms", "tflops", "gbps")
NUMBERS = (*MEASURED, "ratio_to_ref")


def _number(name: str, value) -> float | None:
    """None, or ``value`` as a finite float >= 0; a bool or a string is not a number."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value) if abs(value) < 1e308 else math.inf   # float(10**400) overflows
        if math.isfinite(number) and number >= 0:
            return number
    raise ValueError(f"field {name!r} must be a finite number >= 0 or None, got {value!r}")


def _cell(name: str, text: str | None):
    """A CSV cell as the field's value: numbers parsed, an empty number cell None."""
    if name not in NUMBERS or text is None:
        return text
    if text == "":
        return None
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"field {name!r} is not a number (or empty): {text!r}") from None


def _row_from_mapping(raw: dict, where: str, fields: Sequence[str] = FIELDS,
                      csv_cells: bool = False) -> ResultRow:
    if not isinstance(raw, dict):
        raise ResultsFormatError(f"{where}: a row must be an object, got {type(raw).__name__}")
    missing = [f for f in fields if f not in raw]
    extra = [k for k in raw if k not in fields]
    if missing or extra:
        raise ResultsFormatError(f"{where}: missing fields {missing}, unknown fields {extra}")
    try:
        return ResultRow(**{f: _cell(f, raw[f]) if csv_cells else raw[f] for f in fields})
    except ValueError as exc:
        raise ResultsFormatError(f"{where}: {exc}") from exc


def _suffix(path: Path) -> str:
    if path.suffix not in SUFFIXES:
        raise ValueError(f"{path}: results are saved and loaded as .json or .csv")
    return path.suffix


def save(rows: Iterable[ResultRow], path: str | Path) -> Path:
    """Write rows as .json (with schema header) or .csv (header = field names).

    Atomic (:func:`kernels.atomic.write_atomic`): ``path`` always holds a whole file,
    the old one or the new one, never half of one, even with two writers at once.
    """
    path, rows = Path(path), list(rows)
    if _suffix(path) == ".json":
        doc = {"schema": SCHEMA, "version": VERSION, "rows": [dataclasses.asdict(r) for r in rows]}
        text = json.dumps(doc, indent=1) + "\n"
    else:
        buffer = io.StringIO(newline="")
        writer = csv.DictWriter(buffer, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(dataclasses.asdict(r) for r in rows)
        text = buffer.getvalue()
    return write_atomic(path, text)


class Recorder:
    """Collects rows as they are measured and, given a path, saves them all after each one.

    A benchmark hands every row to :meth:`add` the moment it has it, so an exception or
    Ctrl-C later in the run leaves a valid results file with every row measured before.
    Nothing is written before the first row. Two recorders on one path never break the
    file: it holds, whole, the rows of the one that saved last.
    """

    def __init__(self, path: str | Path | None = None):
        self.path = None if path is None else Path(path)
        if self.path is not None:
            _suffix(self.path)   # refuse a bad file name before anything is measured
        self.rows: list[ResultRow] = []

    def add(self, row: ResultRow) -> None:
        self.rows.append(row)
        if self.path is not None:
            save(self.rows, self.path)


def _text(path: Path) -> str:
    if path.is_dir():
        raise ResultsFormatError(f"{path}: a folder, not a results file")
    size = path.stat().st_size
    if size > MAX_BYTES:
        raise ResultsFormatError(f"{path}: {size} bytes, more than a results file holds "
                                 f"(at most {MAX_BYTES})")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ResultsFormatError(f"{path}: not a text file ({exc})") from exc


def load(path: str | Path) -> list[ResultRow]:
    path = Path(path)
    suffix = _suffix(path)
    text = _text(path)
    if suffix == ".json":
        try:
            doc = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as exc:
            raise ResultsFormatError(f"{path}: not valid JSON ({type(exc).__name__}: {exc})") from exc
        if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
            raise ResultsFormatError(f"{path}: not a workbench results file (schema must be {SCHEMA!r})")
        fields = {1: FIELDS_V1, 2: FIELDS_V2, VERSION: FIELDS}.get(doc.get("version"))
        if fields is None:
            raise ResultsFormatError(f"{path}: schema version {doc.get('version')!r}, "
                                     f"this workbench reads versions 1 to {VERSION}")
        if not isinstance(doc.get("rows"), list):
            raise ResultsFormatError(f"{path}: 'rows' must be a list")
        return [_row_from_mapping(r, f"{path} row {i}", fields) for i, r in enumerate(doc["rows"])]
    try:
        reader = csv.DictReader(io.StringIO(text, newline=""))
        fields = tuple(reader.fieldnames or ())
        if fields not in (FIELDS, FIELDS_V2, FIELDS_V1):
            raise ResultsFormatError(f"{path}: CSV header must be {','.join(FIELDS)}")
        return [_row_from_mapping(r, f"{path} line {i + 2}", fields, csv_cells=True)
                for i, r in enumerate(reader)]
    except csv.Error as exc:
        raise ResultsFormatError(f"{path}: not valid CSV ({exc})") from exc


def table(rows: Iterable[ResultRow],
          columns: Sequence[str] = ("op", "rung", "name", "shape", "dtype", "pass", "ms", "tflops",
                                    "gbps", "vs_ref")) -> list[dict]:
    """Rows for :func:`workbench.harness.table.format_table` / ``html_table``.

    ``vs_ref`` is the ratio to ref (same pass), ``pass`` the pass timed and ``date`` the
    day of the timestamp; any other column is a field. Where a row is an error row, an ``error`` column is added with its message
    (its numbers are None: a dash, never a zero).
    """
    rows = list(rows)
    named = {"vs_ref": "ratio_to_ref", "date": "timestamp", "pass": "pass_name"}
    errors = any(not r.ok for r in rows)
    out = []
    for r in rows:
        cells = {c: getattr(r, named.get(c, c)) for c in columns}
        if "date" in cells:
            cells["date"] = cells["date"][:10]
        if errors:
            cells["error"] = " ".join(r.error.split())   # one line per row in a table
        out.append(cells)
    return out


def _recorded_dir():
    return resources.files("workbench") / "recorded"


def _shipped() -> list[tuple[str, list[ResultRow]]]:
    """(file name, rows) of each shipped file that loads; a warning names each one that does not."""
    shipped, folder = [], _recorded_dir()
    if not folder.is_dir():   # an installed wheel has the folder only once files ship in it
        return shipped
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".json"):
            try:
                shipped.append((entry.name, load(Path(str(entry)))))
            except (ResultsFormatError, OSError) as exc:
                warnings.warn(f"skipped a shipped results file that does not load: {exc}", stacklevel=3)
    return shipped


def _gpu(rows: list[ResultRow]) -> str:
    return rows[0].gpu if rows else "?"


def recorded() -> list[dict]:
    """The GPU result files that ship with the package: gpu, date, rows, file name."""
    return [dict(gpu=_gpu(rows), rows=len(rows), file=name,
                 date=max((r.timestamp for r in rows), default="")[:10]) for name, rows in _shipped()]


def load_recorded(gpu: str | None = None) -> list[ResultRow]:
    """Rows of every shipped file, or of those whose GPU name contains ``gpu``."""
    return [row for _, rows in _shipped() if gpu is None or gpu.lower() in _gpu(rows).lower()
            for row in rows]
