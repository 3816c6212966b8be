"""Which Triton releases compile every Triton rung for gfx942, gfx950 and sm90 (``make compat``).

Users run the Triton their torch brings, so the supported range
(:data:`kernels.triton_version.GPU_RANGE`) has to be shown release by release, not
assumed from the one installed here. Each release is installed from PyPI into its own
folder next to one base venv (CPU torch and this package's dependencies, no Triton: a
``--system-site-packages`` venv would see the Triton installed here), all in a scratch
folder that the next run reuses, and one subprocess per release compiles every registered
rung's kernels ahead of time with the ISA inspector's own compile
(:func:`workbench.isa.compile.compile_rung`), so no GPU is needed. Each (rung, target)
gets "ok" or the first line of its error.

Triton 3.4 and older link AMD code with ROCm's ``ld.lld``; without ROCm, set
``TRITON_HIP_LLD_PATH`` to an LLVM ``ld.lld`` (Debian's ``lld-19`` works), which the
release subprocesses inherit.

    python -m workbench.isa.compat                      # every minor from below the oldest up
    python -m workbench.isa.compat --versions 3.3.1 3.4.0 --out compat.json
"""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RECORDED = Path(__file__).resolve().parents[1] / "triton_compat.json"
_DISTRIBUTION = "amd-kernel-workbench"


def cases() -> list[dict]:
    """Every (Triton rung, target) pair, with the dtype the inspector shows it in."""
    import kernels

    from .. import isa

    return [{"op": op, "rung": r.label, "target": target,
             "dtype": str(isa.default_dtype(r, target)).removeprefix("torch.")}
            for op in kernels.OPS for r in kernels.variants(op) if r.aot is not None
            for target in isa.TARGETS]


def case_name(case: dict) -> str:
    return f"{case['op']} {case['rung']} @ {case['target']}"


def error_line(message: str) -> str:
    """The first line of the exception a compile helper's traceback ends with."""
    lines = message.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback")]
    for line in lines[starts[-1] + 1 if starts else 0:]:
        if line.strip() and not line.startswith((" ", "\t")):
            return line.strip()
    return next((line.strip() for line in lines if line.strip()), "unknown error")


def probe() -> None:
    """Runs in a release's environment: cases (JSON) on stdin, one JSON line per case out."""
    import triton

    from .. import isa
    from . import compile as isa_compile

    print(json.dumps({"triton": triton.__version__}), flush=True)
    for case in json.load(sys.stdin):
        try:
            isa_compile.compile_rung(case["op"], case["rung"], isa.TARGETS[case["target"]],
                                     case["dtype"])
            error = None
        except RuntimeError as exc:
            error = error_line(str(exc))
        print(json.dumps({"case": case_name(case), "error": error}), flush=True)
    isa_compile.stop()


def _pip(python: Path, *args: str) -> None:
    subprocess.run([str(python), "-m", "pip", "install", "-q", *args], check=True)


def base_venv(work: Path, torch_spec: str) -> Path:
    """The venv every release shares (made once per work folder): torch and our dependencies."""
    python = work / "base" / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(work / "base")], check=True)
        try:
            needs = [r for r in importlib.metadata.requires(_DISTRIBUTION) or () if "extra" not in r]
        except importlib.metadata.PackageNotFoundError:
            raise SystemExit(f"{_DISTRIBUTION} is not installed here: run `make setup` first") from None
        _pip(python, torch_spec)
        _pip(python, *needs)
    return python


def release_folder(work: Path, python: Path, version: str) -> Path:
    """Triton ``version`` from PyPI in a folder of its own, put on PYTHONPATH by :func:`run_release`."""
    folder = work / f"triton-{version}"
    if not (folder / "triton").is_dir():
        _pip(python, "--target", str(folder), f"triton=={version}")
    return folder


def run_release(python: Path, folder: Path, todo: list[dict], timeout_s: float, cache: Path) -> dict:
    """Compile every case under one release; cases left when the time is up say so.

    ``cache`` is the release's own Triton cache: its keys hold the kernel source, options
    and target, so a rerun compiles again only what changed (and a stopped run resumes)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("KERNELS_BACKEND", "TRITON_INTERPRET", "NUMBA_ENABLE_CUDASIM")}
    env.update(PYTHONPATH=os.pathsep.join([str(folder), str(ROOT)]), TRITON_CACHE_DIR=str(cache))
    with subprocess.Popen([str(python), "-c", "from workbench.isa.compat import probe; probe()"],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                          env=env, cwd=ROOT) as proc:
        try:
            out, _ = proc.communicate(json.dumps(todo), timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    results = {line["case"]: line["error"] for line in lines if "case" in line}
    left = f"not run: the release's {timeout_s:.0f} s were used up (or its probe died)"
    return {"triton": next((line["triton"] for line in lines if "triton" in line), None),
            "results": {case_name(c): results.get(case_name(c), left) for c in todo}}


def available_versions(python: Path) -> list[str]:
    """The Triton releases on the package index, as pip lists them."""
    text = subprocess.run([str(python), "-m", "pip", "index", "versions", "triton"],
                          capture_output=True, text=True, check=True).stdout
    return re.search(r"Available versions: (.*)", text)[1].split(", ")


def newest_patches(versions: list[str]) -> list[str]:
    """The newest patch of every minor among plain releases (no rc, no dev), oldest first."""
    newest: dict[tuple[int, ...], tuple[int, ...]] = {}
    for version in versions:
        if re.fullmatch(r"\d+\.\d+\.\d+", version):
            parts = tuple(int(x) for x in version.split("."))
            newest[parts[:2]] = max(parts, newest.get(parts[:2], parts))
    return [".".join(map(str, newest[key])) for key in sorted(newest)]


def default_versions(python: Path) -> list[str]:
    """Every minor from one below the oldest that compiles (which shows it is the oldest) up
    to the newest, so a new release is tried too."""
    from kernels.triton_version import minor, oldest

    start = (oldest()[0], oldest()[1] - 1)
    return [v for v in newest_patches(available_versions(python)) if minor(v) >= start]


def all_compile(release: dict) -> bool:
    return all(error is None for error in release["results"].values())


def matrix(record: dict) -> str:
    """Rungs as rows, releases as columns: "ok", the targets that fail or "fails all"; then
    each release's errors, with how many cases each stopped."""
    versions = list(record["releases"])
    by_rung: dict[str, list[dict]] = {}
    for case in record["cases"]:
        by_rung.setdefault(f"{case['op']} {case['rung']}", []).append(case)
    body = []
    for rung, rung_cases in by_rung.items():
        cells = [rung]
        for version in versions:
            results = record["releases"][version]["results"]
            failing = [c["target"] for c in rung_cases if results[case_name(c)] is not None]
            cells.append("ok" if not failing else "fails all" if len(failing) == len(rung_cases)
                         else "fails " + ",".join(failing))
        body.append(cells)
    errors = [f"- {version}: {error} ({count} of {len(record['cases'])})" for version in versions
              for error, count in Counter(e for e in record["releases"][version]["results"].values()
                                          if e is not None).items()]
    return _markdown([["rung", *versions], *body]) + ("\n\nErrors:\n" + "\n".join(errors) if errors else "")


def _markdown(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["| " + " | ".join(cell.ljust(w) for cell, w in zip(row, widths)) + " |" for row in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def run(versions: list[str] | None, work: Path, torch_spec: str, timeout_s: float, out: Path) -> dict:
    """Every release in turn; ``out`` is rewritten after each, so a stopped run keeps the rest."""
    work.mkdir(parents=True, exist_ok=True)
    python = base_venv(work, torch_spec)
    todo = cases()
    record = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
              "python": platform.python_version(),
              "torch": subprocess.run([str(python), "-c", "import torch; print(torch.__version__)"],
                                      capture_output=True, text=True, check=True).stdout.strip(),
              "cases": todo, "releases": {}}
    for version in versions or default_versions(python):
        print(f"Triton {version}: compiling {len(todo)} cases", file=sys.stderr, flush=True)
        record["releases"][version] = run_release(
            python, release_folder(work, python, version), todo, timeout_s, work / f"cache-{version}")
        out.write_text(json.dumps(record, indent=1) + "\n")
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workbench.isa.compat", description=__doc__.split("\n")[0])
    parser.add_argument("--versions", nargs="+", help="Triton releases (default: every minor from "
                        "one below the oldest that compiles up, newest patch of each, from the package index)")
    parser.add_argument("--work-dir", type=Path, default=Path(tempfile.gettempdir()) / "workbench-compat",
                        help="where the base venv and the releases go (reused by the next run)")
    parser.add_argument("--torch", default="torch", help="pip spec of the torch for the base venv")
    parser.add_argument("--timeout-s", type=float, default=1800, help="limit per release")
    parser.add_argument("--out", type=Path, default=RECORDED, help="JSON file for the matrix")
    args = parser.parse_args(argv)
    record = run(args.versions, args.work_dir, args.torch, args.timeout_s, args.out)
    print(matrix(record))
    good = [v for v, release in record["releases"].items() if all_compile(release)]
    print(f"\nEvery rung compiles for every target under: {', '.join(good) or 'none'}")
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
