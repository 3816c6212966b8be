"""One correctness case of a grade as plain data: what the JSON report, the terminal text and
the page all show. Apart from :mod:`.report` so that :mod:`.page` and :mod:`.text`, which the
report calls on, read it without importing the report back."""
from __future__ import annotations

# A case's numbers, as the harness's CheckReport has them (the error map stays out of JSON).
CASE_FIELDS = ("error", "baseline_error", "allowed", "mismatches", "numel", "worst_index",
               "worst_value", "worst_expected", "tensor", "finding", "seed")


def case_row(case: dict) -> dict:
    """A case as plain data: where it ran, the verdict, and the harness's numbers."""
    row = {k: case[k] for k in ("shape", "dtype", "layout", "passed", "message") if k in case}
    report = case.get("report")
    if report is not None:
        row.update({k: getattr(report, k, None) for k in CASE_FIELDS if hasattr(report, k)})
    for key in ("step",):
        if key in case:
            row[key] = case[key]
    return row
