"""The ``workbench`` command: one subcommand per job, each described in ``workbench --help``.

Everything it lists comes from the rung registry (``kernels.variants``); it holds no
list of rungs or ops of its own.
"""
from __future__ import annotations

import argparse
import ast
import os
import sys
from pathlib import Path

import torch

import kernels

from .harness import environment, results
from .harness.check import all_passed, check, summarize
from .gpu_report import BUDGET_S, SECTIONS, gpu_report
from .harness.table import dtype_label, format_table
from .harness.suite import SUITES
from .harness.timing import PerformanceUnavailable

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def _parse_shape(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"shape must look like 64x48x32, got {text!r}") from None
    if any(s < 0 for s in shape):
        raise argparse.ArgumentTypeError(f"shape entries must be >= 0, got {text!r}")
    return shape


def _shapes(op: str | None, shape: tuple | None) -> list[tuple] | None:
    """``--shape`` as the list of shapes to run, after checking it names one per entry of the
    op's ``shape_names`` (some entries are flags or codes, e.g. attention's causal 0/1)."""
    if shape is None:
        return None
    if op is None:
        raise ValueError("--shape needs an op: shapes are in the op's own order")
    names = kernels.spec(op).shape_names
    if len(shape) != len(names):
        raise ValueError(f"{op} shapes are {'x'.join(names)} ({len(names)} numbers), "
                         f"got {'x'.join(map(str, shape))}")
    return [shape]


def _parse_seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"seconds must be a number, got {text!r}") from None
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"seconds must be positive, got {text!r}")
    return seconds


def _parse_rung(text: str) -> int | str:
    return int(text) if text.isdigit() else text


def _ladder_rows() -> list[dict]:
    here = kernels.backend.current()
    rows = []
    for op in kernels.ops():
        for r in kernels.variants(op):
            why_not = r.unavailable or f"no ({here.name})"  # a missing extra, else the backend
            rows.append(dict(op=op, rung=r.label, name=r.name, kind=r.kind,
                             dtypes=",".join(map(dtype_label, r.dtypes)),
                             backends=",".join(sorted(r.backends)),
                             runs_here="yes" if r.runs_here() else why_not))
    return rows


def cmd_info(args) -> int:
    for key, value in environment.describe().items():
        print(f"{key:>14}: {value}")
    print()
    print(format_table(_ladder_rows()))
    shipped = results.recorded()
    print(f"\nrecorded GPU results shipped: {len(shipped)} file(s)")
    for item in shipped:
        print(f"  {item['gpu']} ({item['date']}): {item['rows']} rows, {item['file']}")
    return 0


def _run_checks(ops, rung, shapes, dtypes) -> list:
    reports = []
    for op in ops:
        reports += check(op, rung=rung, shapes=shapes, dtypes=dtypes, layouts=("row", "col"),
                         progress=True)
    return reports


def _print_failures(reports) -> list:
    """Each failing check with what reproduces it (shape, dtype, layout, seed, the tensor)."""
    failed = [r for r in reports if not r.passed]
    for r in failed:
        print(f"FAIL {r.op} {r.rung} {r.dtype} shape={r.shape} layout={r.layout}: {r.message}; "
              f"worst at {r.worst_index}: got {r.worst_value}, expected {r.worst_expected}")
    return failed


def cmd_check(args) -> int:
    ops = [args.op] if args.op else list(kernels.ops())
    dtypes = [DTYPES[d] for d in args.dtype] if args.dtype else None
    reports = _run_checks(ops, args.rung, _shapes(args.op, args.shape), dtypes)
    print(format_table(summarize(reports)))
    failed = _print_failures(reports)
    if not reports:
        print("no rung ran: nothing matched the filters on this backend")
        return 1
    print(f"\n{len(reports) - len(failed)} passed, {len(failed)} failed")
    return 0 if all_passed(reports) else 1


def _bench_rows(args):
    from .harness.bench import bench
    from .harness.suite import run_suite

    if args.suite:
        reports, rows = run_suite(args.suite, out=args.out)
        print(format_table(summarize(reports)))
        return rows
    if not args.op:
        raise ValueError("name an op to benchmark, or --suite quick for every op")
    spec = kernels.spec(args.op)
    shapes = _shapes(args.op, args.shape) or [spec.bench_shapes[p] for p in args.preset or ()] or None
    dtypes = [DTYPES[d] for d in args.dtype] if args.dtype else None
    return bench(args.op, shapes=shapes, dtypes=dtypes, rungs=args.rung, out=args.out)


def cmd_bench(args) -> int:
    if args.op == "overhead":
        from .harness import host_overhead
        from .train import host_cost
        report = host_overhead.run()
        print(host_overhead.table(report))
        report["step"] = host_cost.run()
        print(f"\n{host_cost.table(report['step'])}")
        if args.out:
            host_overhead.save(report, args.out)
            print(f"wrote {args.out}")
        return 0
    try:
        rows = _bench_rows(args)   # saved to --out row by row, as they are measured
    except PerformanceUnavailable as exc:
        print(f"workbench bench: {exc}", file=sys.stderr)
        return 2
    print(format_table(results.table(rows)))
    if args.out and rows:
        print(f"wrote {args.out}")
    return 0 if all(r.ok for r in rows) else 1


def cmd_comm(args) -> int:
    from .comm.bench import main

    return main(backend=args.backend, out=args.out, world=args.world, collectives=args.collective,
                repeats=args.repeats)


def cmd_gpu_report(args) -> int:
    return gpu_report(budget_s=args.budget_s, sections=args.sections)


_TRAIN_OPS = "gemm, attention, moe, norm, rope, swiglu, loss"   # workbench.train.ops.OPS, not imported for --help


def _parse_kernels(text: str) -> str | dict[str, str]:
    """``torch``, ``workbench``, or per op: ``attention=workbench,moe=torch``."""
    if "=" not in text:
        return text
    try:
        return dict(item.split("=", 1) for item in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"kernels must be torch, workbench or op=impl,..., "
                                         f"got {text!r}") from None


FP8_RECIPES = kernels.fp8.names()
FP8_KEEP_HELP = (f"with --fp8: the layers left in high precision, comma-separated module names or "
                 f"patterns (default '{','.join(kernels.fp8.KEEP_HIGH_PRECISION)}'; first and last are the "
                 f"model's first and last Linear); leave out *shared_experts to run the MoE layers' "
                 f"shared experts in FP8 (with --kernels moe=workbench; not under delayed), '' for every layer")
TRAIN_COLUMNS = ("step", "loss", "grad_norm", "step_ms", "tokens_per_s", "tflops", "mfu", "peak_mem_gib",
                 "untuned")


_left_a_group = False   # set once this process has left a torchrun group: :func:`main` then ends it


def _leaving_the_group(work):
    """``work()``; then a torchrun process leaves its group before it exits (NCCL warns otherwise).
    Only a torchrun rank (``WORLD_SIZE`` > 1, as :func:`.train.distributed.setup` reads it) is then
    ended by :func:`main`: a notebook or test calling ``main`` in a process that holds a group of
    its own keeps running."""
    global _left_a_group
    try:
        return work()
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
            _left_a_group = _left_a_group or int(os.environ.get("WORLD_SIZE", "1")) > 1


def _exit_without_finalizing(code: int):
    """End a rank that has left its group now, its output flushed, skipping Python's finalization.

    Leaving the group does not free gloo's process group while anything still holds it (FSDP2's
    parameter groups and DDP do), so its C++ worker threads live into finalization; one that
    releases a collective's tensors there takes the GIL while Python shuts down, which aborts the
    process with std::terminate ("terminate called without an active exception"; the mechanism of
    pytorch/pytorch#179291). That is the likely cause of the ranks that died so after training on
    loaded CI cores (2026-12-03 to 12-07, twice in a row in one run; never reproduced alone): the
    gloo tests whose ranks are multiprocessing's (``kernels.comm.run_local``, fork server children,
    which end with ``os._exit``) were never seen dying that way. Nothing is left to run here: the
    outputs are written and closed, and the CLI registers no exit handlers."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _rank0() -> bool:
    """Under torchrun, rank 0 speaks for all."""
    return int(os.environ.get("RANK", "0")) == 0


def cmd_tune(args) -> int:
    from kernels import tuning_cache

    from . import train

    try:
        report = _leaving_the_group(lambda: train.tune(args.preset, args.kernels, args.seed,
                                                       compile=args.compile, parallel=args.parallel,
                                                       fp8=args.fp8, fp8_keep=_fp8_keep(args)))
    except NotImplementedError as exc:
        print(f"workbench tune: {exc}", file=sys.stderr)
        return 2
    if not _rank0():
        return 0
    print(format_table([{**row, "config": ",".join(f"{k}={v}" for k, v in row["config"].items())}
                        for row in report.rows()]))
    print(f"\n{len(report.keys)} keys in {report.seconds:.1f} s: {report.count('timed')} timed, "
          f"{report.count('cached')} from the cache, {report.count('only')} with a single candidate "
          f"(no timing), {report.count('predicted')} the model's pick untimed, {report.count('untuned')} "
          f"untuned; cache {tuning_cache.store().path}")
    return 0


def _fp8_keep(args) -> tuple[str, ...] | None:
    """``--fp8-keep``'s patterns, None when not given (convert's default)."""
    from .train import fp8_layers

    return None if args.fp8_keep is None else fp8_layers.parse(args.fp8_keep)


def cmd_train(args) -> int:
    from . import train
    from .train import fp8_layers
    from .train.files import FileArgumentError

    try:
        rows = _leaving_the_group(lambda: train.run(
            preset=args.preset, kernels=args.kernels, steps=args.steps, seed=args.seed,
            compile=args.compile, profile=args.profile, out=args.out, checkpoint=args.checkpoint,
            resume=args.resume, gpu=args.gpu, parallel=args.parallel, fp8=args.fp8,
            fp8_keep=_fp8_keep(args)))
    except FileArgumentError as exc:   # named as the flag that was typed
        print(f"workbench train: --{exc.argument} {exc.path}: {exc.reason}", file=sys.stderr)
        return 2
    except NotImplementedError as exc:
        print(f"workbench train: {exc}", file=sys.stderr)
        return 2
    if not _rank0():
        return 0
    print(format_table(rows, TRAIN_COLUMNS))
    print(f"\ntuning pass before the steps: {rows[0]['tuning_s']:.1f} s; "
          f"untuned keys in the steps: {sum(r['untuned'] for r in rows)}")
    if args.fp8:
        print(f"FP8 recipe {args.fp8}: {kernels.fp8.get(args.fp8).summary}; layers kept in high "
              f"precision: {fp8_layers.described(rows[0]['fp8_keep'])}")
    if args.profile:
        print("\nbusiest ops of the last step (ms):")
        print(format_table([dict(op=k, ms=v) for k, v in rows[-1]["op_ms"].items()]))
    if rows[-1]["backend"] == "interpreter":
        print("\nbackend interpreter (no GPU): step times are not performance; no TFLOP/s or MFU.")
    if args.out:
        print(f"wrote {args.out}")
    return 0


def _isa_rows(target: str) -> list[dict]:
    from . import isa

    rows = []
    for op in kernels.ops():
        for r in kernels.variants(op, include_ref=False):
            if r.aot is not None:
                report = isa.inspect(op, r.label, target)
                rows.append(dict(op=op, rung=r.title, dtype=report.dtype,
                                 matrix=", ".join(report.matrix_instructions) or "-",
                                 lds_bytes=report.lds_bytes, vgprs=report.vgprs,
                                 vgpr_spills=report.spills, sgpr_spills=report.sgpr_spills,
                                 waves_per_simd=f"{report.occupancy.value} ({report.occupancy.limited_by})"))
    return rows


def cmd_tour(args) -> int:
    here = kernels.backend.current()
    print(f"AMD kernel workbench: backend {here.name} ({here.device_name}, {here.arch})\n")
    print("The ladders:")
    print(format_table(_ladder_rows()))
    print("\nCorrectness of every rung that runs here (smoke shapes, row- and column-major):")
    reports = _run_checks(kernels.ops(), None, None, None)
    print(format_table(summarize(reports)))
    _print_failures(reports)
    print("\nMachine code on MI300X (gfx942), compiled ahead of time here, no GPU needed:")
    print(format_table(_isa_rows("gfx942")))
    shipped = results.load_recorded()
    if shipped:
        print("\nRecorded GPU results (measured earlier on the GPU named in each row, not here):")
        print(format_table(results.table(shipped, ("gpu", "date", "op", "rung", "shape", "dtype",
                                                   "pass", "ms", "tflops", "vs_ref"))))
    else:
        print("\nNo recorded GPU results ship with this version yet; `workbench bench` on a GPU makes them.")
    if here.is_interpreter:
        print("\nNo timings shown: this machine has no GPU, and interpreter times are not performance.")
    ok = all_passed(reports)
    print("\nNext, the learning path: `workbench exercise load gemm/v1` writes your first exercise "
          "(a rung with its idea cut out); `workbench exercise check gemm/v1` grades it.")
    print(f"\n{'all checks passed' if ok else 'SOME CHECKS FAILED'} "
          f"({sum(r.passed for r in reports)}/{len(reports)})")
    return 0 if ok else 1


def _parse_answer(text: str):
    """A number, a tuple or a string, as typed: ``6``, ``0.5``, ``(2, 3)``, ``v_mfma_f32_32x32x8_f16``."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def cmd_exercise(args) -> int:
    from .learn import exercises

    if args.action == "list":
        print(format_table(exercises.list_exercises()))
        return 0
    if not args.key:
        raise ValueError(f"`workbench exercise {args.action}` needs an exercise key, e.g. gemm/v1")
    if args.action == "load":
        loaded = exercises.load(args.key, args.path, overwrite=args.overwrite)
        print(f"Edit {loaded}, then run: workbench exercise check {args.key}"
              if isinstance(loaded, Path) else
              f"{loaded}\nAnswer with: workbench exercise check {args.key} --answer ...")
        return 0
    if args.action == "hint":
        print(exercises.hints(args.key).next_line())
        return 0
    verdict = exercises.check(args.key, args.path, None if args.answer is None else _parse_answer(args.answer))
    print(verdict)
    return 0 if verdict.passed else 1


def cmd_predict(args) -> int:
    """Modelled times (no GPU needed): every rung the model covers, or the ``--rung`` ones;
    ``--against FILE``: the model beside each measured row of a results file."""
    from . import model

    if args.against:
        if args.backward:   # a results file's rows name their own passes
            print("workbench predict: --against takes each row's pass from the file; drop --backward",
                  file=sys.stderr)
            return 2
        return _predict_against(args.against)
    if not args.op:
        print("workbench predict: name an op, or --against a results file", file=sys.stderr)
        return 2
    op_spec = kernels.spec(args.op)
    shape = args.shape or (op_spec.bench_shapes[op_spec.quick_shapes[0]] if op_spec.quick_shapes else None)
    predict = model.predict_backward if args.backward else model.predict
    try:
        rungs = args.rung or model.rungs(args.op, args.backward)
        rows = [predict(args.op, r, shape, args.dtype, args.gpu).row() for r in rungs]
    except model.NotCovered as exc:
        print(f"workbench predict: {exc}", file=sys.stderr)
        return 2
    print(format_table(rows))
    print(f"model{' of the backward pass (TFLOP/s on its FLOPs)' if args.backward else ''}: predicted from the "
          f"compiled code, not measured (workbench.model); shape {' x '.join(op_spec.shape_names)}")
    return 0


def _predict_against(path: str) -> int:
    from .model import measured

    print(measured.report(*measured.compare(results.load(path))))
    return 0


def cmd_grade(args) -> int:
    """A file's kernel judged like a rung; exit status 0 only when it is correct."""
    from .grade import grade

    try:
        report = grade(args.file, args.op, entry=args.entry, reference=args.reference, exercise=args.exercise,
                       dtypes=args.dtypes,
                       shapes=args.shape, machine_code=not args.no_machine_code, model=not args.no_model,
                       import_s=args.timeout_s, run_s=args.timeout_s)
    except (FileNotFoundError, KeyError, ValueError) as error:   # KeyError: an unknown exercise
        print(f"workbench grade: {error.args[0] if isinstance(error, KeyError) else error}", file=sys.stderr)
        return 2
    print(report)
    for path, write in ((args.json, report.write_json), (args.html, report.write_html)):
        if path:
            print(f"wrote {write(path)}")
    return 0 if report.passed else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="workbench", description="Check, time, model, learn and train with the kernels package's rungs.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="backend, GPU, versions, which rungs run here")
    p = sub.add_parser("check", help="correctness of every registered rung at smoke shapes")
    p.add_argument("op", nargs="?", choices=kernels.ops())
    p.add_argument("--rung", type=_parse_rung, help="rung number, label (v2) or name")
    p.add_argument("--dtype", action="append", choices=sorted(DTYPES))
    p.add_argument("--shape", type=_parse_shape, help="e.g. 64x48x32 (the op's shape order)")
    p = sub.add_parser("bench", help="time rungs vs the library baseline (GPU only; "
                                     "overhead: the public ops' host time per call and a training step's, launches stubbed)")
    p.add_argument("op", nargs="?", choices=(*kernels.ops(), "overhead"))
    p.add_argument("--suite", choices=SUITES, help="check and time every rung of every op")
    p.add_argument("--rung", type=_parse_rung, action="append")
    p.add_argument("--dtype", action="append", choices=sorted(DTYPES))
    p.add_argument("--shape", type=_parse_shape)
    p.add_argument("--preset", action="append", help="a named benchmark shape of the op")
    p.add_argument("--out", help="write the rows to this .json or .csv file")
    p = sub.add_parser("comm", help="collective rungs vs the library: gloo ranks on the CPU (alpha-beta fit, "
                                    "8-GPU model) or RCCL/NCCL on 2+ GPUs (bus bandwidth, EP layer)")
    p.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto",
                   help="auto: nccl on 2+ GPUs, else gloo")
    p.add_argument("--world", type=int, default=3, choices=range(2, 9), metavar="2..8",
                   help="gloo ranks (nccl: one rank per GPU)")
    p.add_argument("--out", help="nccl: write the rows to this .json or .csv file")
    p.add_argument("--collective", action="append",
                   choices=("all_reduce", "reduce_scatter", "all_gather", "all_to_all"))
    p.add_argument("--repeats", type=int, help="timed calls per size (default: gloo 3, nccl 20)")
    sub.add_parser("tour", help="the main job: check every rung, print the ladders and recorded results")
    p = sub.add_parser("exercise", help="the learning path: list, load, check an exercise, or show a hint")
    p.add_argument("action", choices=("list", "load", "check", "hint"))
    p.add_argument("key", nargs="?", help="e.g. gemm/v1 (see `workbench exercise list`)")
    p.add_argument("--path", help="the learner's file (default exercises/<key>.py)")
    p.add_argument("--answer", help="for a question: the answer, e.g. 6 or v_mfma_f32_32x32x8_f16")
    p.add_argument("--overwrite", action="store_true", help="load: start the file over")
    p = sub.add_parser("predict", help="modelled time, TFLOP/s and bound per rung (no GPU needed)")
    p.add_argument("op", nargs="?", choices=kernels.ops())
    p.add_argument("--rung", type=_parse_rung, action="append")
    p.add_argument("--shape", type=_parse_shape, help="e.g. 4096x4096x4096 (default: the op's first quick shape)")
    p.add_argument("--against", metavar="FILE", help="a results file (workbench/recorded/*.json): the model "
                   "beside each measured row it covers, at that row's shape, dtype and GPU")
    p.add_argument("--dtype", choices=sorted({*DTYPES, "fp8"}),
                   help="default: fp8 for the FP8 ops (their only one), bf16 for the rest")
    p.add_argument("--gpu", default="MI300X", help="a roofline GPU name (default MI300X)")
    p.add_argument("--backward", action="store_true",
                   help="the backward pass (attention v5, grouped_gemm v2 and v4, moe v3), "
                        "TFLOP/s on its backward FLOPs")
    p = sub.add_parser("grade", help="any kernel file judged like a rung: correctness, machine code, "
                                     "speed (model; measured on a GPU); exit 0 only when correct")
    p.add_argument("file", help="a .py file defining the op's callable, e.g. matmul(a, b) for gemm")
    p.add_argument("--op", choices=kernels.ops(), help="the workbench op it implements")
    p.add_argument("--reference", help="a .py file with make_inputs(shape, dtype) and reference(*inputs): "
                                       "an op of your own")
    p.add_argument("--entry", help="the callable's name (default: the op's public name, "
                                   "or `kernel` with --reference)")
    p.add_argument("--exercise", help="an exercise's key, e.g. gemm/v3: its own rules (program order, hot "
                                      "loop, ...) become a graded section; sets its op, callable and shapes")
    p.add_argument("--dtypes", nargs="+", help="the dtypes it claims, e.g. fp32 bf16 (default: all the op's)")
    p.add_argument("--shape", type=_parse_shape, action="append", help="check at this shape (repeatable; "
                                                                       "default: the op's smoke shapes)")
    p.add_argument("--json", help="write the whole report (schema-versioned) to this file")
    p.add_argument("--html", help="write a self-contained page to this file")
    p.add_argument("--timeout-s", type=_parse_seconds, default=300.0,
                   help="limit for the file's import and for each check (default %(default)s)")
    p.add_argument("--no-machine-code", action="store_true", help="skip the ahead-of-time compiles")
    p.add_argument("--no-model", action="store_true", help="skip the performance model")
    p = sub.add_parser("gpu-report", help="on a GPU: ceilings + quick suite into workbench/recorded/")
    p.add_argument("--budget-s", type=_parse_seconds, default=BUDGET_S,
                   help="no new case starts after this many seconds (default %(default)s)")
    p.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS),
                   help="what to run, in this order whatever the order given (default: all)")
    p = sub.add_parser("train", help="training steps of a small GPT(-MoE) on PyTorch or workbench kernels")
    p.add_argument("--preset", default="cpu-smoke", help="cpu-smoke, gpu-moe-small, gpu-dense-1b")
    p.add_argument("--kernels", type=_parse_kernels, default="torch",
                   help=f"torch, workbench, or per op ({_TRAIN_OPS}; those left out: torch), "
                        f"e.g. gemm=workbench,attention=workbench")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--profile", action="store_true", help="per-op times from torch.profiler")
    p.add_argument("--gpu", help="roofline GPU name for MFU (default: this GPU)")
    p.add_argument("--checkpoint", help="save the state to this file at the end")
    p.add_argument("--resume", help="continue from this checkpoint (--out: append the rows)")
    p.add_argument("--parallel", choices=("fsdp", "ddp"), help="data parallel under torchrun")
    p.add_argument("--fp8", choices=FP8_RECIPES, help="run the Linear layers' GEMMs in FP8 by this recipe")
    p.add_argument("--fp8-keep", metavar="PATTERNS", help=FP8_KEEP_HELP)
    p.add_argument("--out", help="write the rows to this .json file, step by step")
    p = sub.add_parser("tune", help="the training preset's tuning pass alone: fill the tuning cache")
    p.add_argument("--preset", default="cpu-smoke", help="cpu-smoke, gpu-moe-small, gpu-dense-1b")
    p.add_argument("--kernels", type=_parse_kernels, default="workbench",
                   help=f"workbench (default), torch, or per op ({_TRAIN_OPS}), e.g. gemm=workbench")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--compile", action="store_true", help="torch.compile the model, as train --compile")
    p.add_argument("--fp8", choices=FP8_RECIPES, help="FP8 recipe, as train --fp8")
    p.add_argument("--fp8-keep", metavar="PATTERNS", help="as train --fp8-keep")
    p.add_argument("--parallel", choices=("fsdp", "ddp"), help="data parallel under torchrun")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler = {"info": cmd_info, "check": cmd_check, "bench": cmd_bench, "tour": cmd_tour,
               "gpu-report": cmd_gpu_report, "train": cmd_train, "tune": cmd_tune, "comm": cmd_comm,
               "exercise": cmd_exercise, "predict": cmd_predict, "grade": cmd_grade}[args.command]
    try:
        code = handler(args)
    except (KeyError, ValueError, TypeError) as exc:
        print(f"workbench {args.command}: {exc}", file=sys.stderr)
        code = 2
    if _left_a_group:
        _exit_without_finalizing(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
