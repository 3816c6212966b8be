"""The graded file's own process: everything that imports or runs the file happens here.

:mod:`.session` starts it with one pickled request on stdin; it answers with pickled
messages on its stdout (the file's prints go to stderr): ``("step", name, kind)`` before
each step, so the parent can time it out, and ``("result", name, payload)`` after. A
crash (a segfault, ``os.abort``) or a hang ends the process, never the grader.

Two stages, each in a fresh process: ``run`` (import, contract, correctness, with
``--exercise`` the exercise's own rules, the launch record, on a GPU the timing) and
``compile`` (the recorded kernels for each target: a process where no interpreted kernel
has run, as :mod:`workbench.isa.compile` needs).
"""
from __future__ import annotations

import inspect
import os
import pickle
import signal
import sys



def _sender(stream):
    def send(*message) -> None:
        pickle.dump(message, stream)
        stream.flush()
    return send


def _dtypes(names, problem):
    from kernels.triton_support import TRITON_DTYPE_NAMES

    from ..harness.table import dtype_label
    from .contract import ContractError

    known = {}
    for d in problem.spec.dtypes:
        known[dtype_label(d)] = known[TRITON_DTYPE_NAMES.get(d, dtype_label(d))] = d
    if not names:
        return list(problem.spec.dtypes)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ContractError(f"{problem.op} takes dtypes {', '.join(map(dtype_label, problem.spec.dtypes))}; "
                            f"not {', '.join(unknown)}")
    return [known[n] for n in names]


def _problem(request):
    from .contract import custom_problem, registered_problem

    if request["reference"]:
        return custom_problem(request["reference"])
    return registered_problem(request["op"])


def run(request, send) -> None:
    """The ``run`` stage; ``send(*message)`` carries each step and result out (a test can
    collect them in its own process: the same code, without the isolation)."""
    import kernels

    from ..harness.table import dtype_label
    from . import correctness, launches, speed
    from .contract import ContractError, check_callable, file_rung, load_entry, with_grad_inputs

    if request.get("exercise") and not request["op"]:   # a helper's exercise: its rules alone
        send("result", "contract", {"passed": True, "entry": None,
                                    "message": f"no op callable: graded by exercise {request['exercise']}'s rules"})
        _judge_exercise(request, send)
        return
    try:
        if not request["reference"]:    # the op's package loads before the file's clock starts
            problem = _problem(request)
        send("step", "import", "import")
        if request["reference"]:
            problem = _problem(request)
        module, entry = load_entry(request["file"], request["entry"] or problem.entry, problem)
        name = request["entry"] or problem.entry
        dtypes = _dtypes(request["dtypes"], problem)
        shapes = [tuple(s) for s in (request["shapes"] or problem.spec.smoke_shapes)]
        if not shapes:
            raise ContractError(f"no shapes to check: give --shape, or `shapes` in {request['reference']}")
        device = kernels.backend.current().device
        probe = problem.spec.make_inputs(shapes[0], dtypes[0], device=device, seed=0)
        check_callable(entry, name, probe, problem)
    except ContractError as error:
        send("result", "contract", {"passed": False, "message": str(error)})
        return
    send("result", "contract", {"passed": True, "entry": name, "module": module.__name__,
                                "signature": f"{name}{inspect.signature(entry)}",
                                "expected": problem.signature, "dtypes": [dtype_label(d) for d in dtypes],
                                "shapes": shapes})
    send("step", "autograd probe", "run")
    names = correctness.gradient_names(problem, entry, probe)
    try:
        backward = correctness.supports_autograd(entry, probe, names)
    except Exception as error:   # the first case will say it again, where it fails
        backward, names = False, ()
        send("result", "autograd", {"backward": False, "why": f"{type(error).__name__}: {error}"})
    else:
        send("result", "autograd", {"backward": backward, "inputs": list(names) if backward else []})
    graded = with_grad_inputs(problem, names) if backward else problem
    rung = file_rung(correctness.poisoning(entry), name, graded, dtypes, backward, module.__name__)
    for dtype, shape, layout in correctness.plan(shapes, dtypes, request["layouts"]):
        send("step", correctness.case_name(shape, dtype, layout), "run")
        send("result", "case", correctness.run_case(rung, graded, shape, dtype, layout, request["seed"]))
    if request.get("exercise"):
        _judge_exercise(request, send)
    dtype = speed.machine_code_dtype(dtypes)
    shape = speed.model_shape(problem.spec) if problem.registered else shapes[0]
    if request.get("record", True):
        send("step", f"launch record at {'x'.join(map(str, shape))}", "run")
        try:
            with launches.recorded(stub=True) as records:
                entry(*problem.spec.make_inputs(shape, dtype, device=device, seed=0))
            error = None
        except Exception as caught:
            error = f"{type(caught).__name__}: {caught}"
        send("result", "launches", {"records": records, "shape": shape, "dtype": str(dtype),
                                    "error": error, "module": module.__name__})
    if request.get("time", kernels.backend.current().is_gpu):   # a test asks with a fake timer
        send("step", "timing", "run")
        send("result", "timing", speed.measure(entry, problem, shape, dtype))


def _judge_exercise(request, send) -> None:
    from ..learn.exercises.grading import _root_cause
    from .exercise_rules import judge

    key = request["exercise"]
    send("step", f"exercise {key}", "run")
    try:
        found = judge(key, request["file"])
    except Exception as error:   # the exercise's checker met code it could not run
        cause = _root_cause(error)
        found = {"key": key, "passed": False, "message": f"{type(cause).__name__}: {cause}"}
    send("result", "exercise", found)


def compile_kernels(request, send) -> None:
    from ..learn.exercises.learner import import_file
    from ..isa.compile import compile_aot
    from . import launches

    send("step", "import", "import")
    module, _ = import_file(request["file"], request["op"])
    aots = launches.aot_kernels(request["records"], {request["module"]: module})
    for target_name, target in request["targets"]:
        send("step", f"compile for {target_name}", "compile")
        compiled = []
        for aot in aots:
            if isinstance(aot, str):
                compiled.append({"error": aot})
                continue
            try:
                compiled.append(compile_aot(aot, target))
            except Exception as error:   # one kernel that does not compile is a finding, not a stop
                last = (str(error).strip().splitlines() or [""])[-1]
                compiled.append({"error": f"{getattr(aot.jit_fn, '__name__', aot.jit_fn)}: "
                                          f"{type(error).__name__}: {last}"})
        send("result", "compiled", {"target": target_name, "kernels": compiled})


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # the parent decides when this process ends
    send = _sender(os.fdopen(os.dup(1), "wb"))
    os.dup2(2, 1)
    request = pickle.load(sys.stdin.buffer)
    import kernels  # noqa: F401  (the backend is chosen here, before any kernel is defined)

    {"run": run, "compile": compile_kernels}[request["stage"]](request, send)
    send("done")


if __name__ == "__main__":
    main()
