"""Conformance: every attribute the SIMT code uses on ``simt`` exists in numba-hip 0.2.1.

On ROCm ``simt`` is ``numba.hip``, which cannot be imported without ROCm, so the test
reads the package's sources from its wheel (PyPI, downloaded once into a cache) with
``ast``, without importing it. What the wheel shows about how ``numba.hip`` fills its
namespace (``numba/hip/__init__.py``):

* ``from .device_init import *``: ``device_init.py`` star-imports ``api.py``
  (``as_cuda_array``, ``external_stream``, ``to_device`` ... as in numba.cuda) and
  imports ``jit`` (decorators.py) and ``grid``/``gridsize`` (intrinsics.py);
* ``globals().update(_hip.thestubs)`` in ``device_init.py``: the ``Stub`` classes of
  ``typing_lowering/hip/hipstubs.py`` (``threadIdx``, ``blockIdx``, ``shared`` ...);
* ``globals().update(_hipdevicelib.thestubs)``: functions generated at import time from
  ROCm's HIP device library header (``__syncthreads`` becomes ``syncthreads``). That
  header is not in the wheel; ``intrinsics.py``'s docstring lists the ones that stand in
  for numba.cuda's intrinsics, and this test takes those.
"""
from __future__ import annotations

import ast
import importlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

import kernels

VERSION = "0.2.1"
WHEEL = f"numba_hip-{VERSION}-py3-none-manylinux_2_28_x86_64.whl"
STUB_BASES = {"Stub", "StubResolveAlways"}
# `globals().update(<module>.thestubs)` in device_init.py -> the module whose Stub classes those
# are, or None for the functions generated at import from ROCm's header (device_library_names)
STUB_SOURCES = {"numba.hip.typing_lowering.hip": "numba.hip.typing_lowering.hip.hipstubs",
                "numba.hip.typing_lowering.hipdevicelib": None}


# --- the names the project's SIMT code uses on `simt` --------------------------------------

def simt_attributes(source: str) -> set[str]:
    """Dotted attribute chains used on the name ``simt``: "jit", "shared.array", "threadIdx.x"."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        chain = []
        while isinstance(node, ast.Attribute):
            chain.append(node.attr)
            node = node.value
        if chain and isinstance(node, ast.Name) and node.id == "simt":
            found.add(".".join(reversed(chain)))
    return found


def simt_modules() -> list[str]:
    """kernels.simt and every SIMT rung module, from the registry."""
    rungs = {r.module for op in kernels.ops() for r in kernels.variants(op) if r.kind == "simt"}
    return ["kernels.simt", *sorted(rungs)]


def used_by_project() -> dict[str, set[str]]:
    return {name: simt_attributes(Path(importlib.import_module(name).__file__).read_text())
            for name in simt_modules()}


# --- the names numba.hip exposes, read from the wheel ---------------------------------------

def download_wheel() -> Path:
    """The numba-hip wheel from PyPI, cached per version (the test skips if PyPI is out of reach)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "amd-kernel-workbench"
    wheel = cache / WHEEL
    if wheel.exists():
        return wheel
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:  # then one atomic rename: safe under xdist
        result = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
             "--platform", "manylinux_2_28_x86_64", f"numba-hip=={VERSION}", "-d", tmp],
            capture_output=True, text=True, timeout=300)
        if result.returncode != 0 or not (Path(tmp) / WHEEL).exists():
            pytest.skip(f"could not download numba-hip {VERSION} from PyPI with pip: "
                        f"{(result.stderr or result.stdout).strip()[-500:]}")
        os.replace(Path(tmp) / WHEEL, wheel)
    return wheel


class WheelApi:
    """``numba.hip``'s namespace as its sources define it: name -> members of it that the
    wheel defines (for the stub classes, e.g. ``shared`` -> {"array"}), or None when the
    name is not a class of the wheel and its members are not checked."""

    def __init__(self, sources: dict[str, str]):
        self.sources = sources
        self.names = self.module_names("numba.hip", set())

    def path(self, module: str) -> str:
        base = module.replace(".", "/")
        return base + ".py" if base + ".py" in self.sources else base + "/__init__.py"

    def tree(self, module: str) -> ast.Module:
        return ast.parse(self.sources[self.path(module)])

    def absolute(self, module: str, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        package = module if self.path(module).endswith("__init__.py") else module.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        return f"{package}.{node.module}" if node.module else package

    def module_names(self, module: str, seen: set[str]) -> dict[str, set[str] | None]:
        """name -> members for every name bound at the top level of ``module`` (and not deleted)."""
        names: dict[str, set[str] | None] = {}
        if module in seen:
            return names
        seen.add(module)
        aliases = {}
        for node in self.tree(module).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names[node.name] = None
            elif isinstance(node, ast.ClassDef):
                names[node.name] = self.class_members(module, node.name)
            elif isinstance(node, ast.Assign):
                names.update((t.id, None) for t in node.targets if isinstance(t, ast.Name))
            elif isinstance(node, ast.Delete):
                for target in node.targets:
                    names.pop(ast.unparse(target), None)
            elif isinstance(node, ast.Import):
                names.update((a.asname or a.name.split(".")[0], None) for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                source = self.absolute(module, node)
                for alias in node.names:
                    if alias.name == "*":
                        if source.startswith("numba.hip"):
                            names.update(self.star_names(source, seen))
                        continue
                    aliases[alias.asname or alias.name] = f"{source}.{alias.name}"
                    names[alias.asname or alias.name] = None
            elif stubs := self.stub_update(node, aliases):
                names.update(stubs)
        return names

    def star_names(self, module: str, seen: set[str]) -> dict[str, set[str] | None]:
        """What ``from module import *`` binds: ``__all__``, else the names without a leading _."""
        exported = next((ast.literal_eval(n.value) for n in self.tree(module).body
                         if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "__all__"), None)
        return {name: members for name, members in self.module_names(module, seen).items()
                if ((name in exported) if exported is not None else not name.startswith("_"))}

    def stub_update(self, node: ast.stmt, aliases: dict[str, str]):
        """The names ``globals().update(<module>.thestubs)`` adds, or None for any other statement."""
        call = node.value if isinstance(node, ast.Expr) else None
        if not (isinstance(call, ast.Call) and ast.unparse(call.func) == "globals().update"):
            return None
        owner = ast.unparse(call.args[0]).removesuffix(".thestubs")
        module = STUB_SOURCES[aliases[owner]]   # a KeyError here: numba-hip changed its structure
        if module is None:
            return [(name, None) for name in self.device_library_names()]
        return [(name, self.class_members(module, name)) for name in self.classes(module)
                if self.bases(module, name) & STUB_BASES]

    def classes(self, module: str) -> dict[str, ast.ClassDef]:
        return {n.name: n for n in self.tree(module).body if isinstance(n, ast.ClassDef)}

    def bases(self, module: str, name: str) -> set[str]:
        """Every base-class name of a class, following bases defined in the same module."""
        found, todo, classes = set(), [name], self.classes(module)
        while todo:
            for base in classes[todo.pop()].bases:
                base_name = ast.unparse(base)
                if base_name not in found:
                    found.add(base_name)
                    if base_name in classes:
                        todo.append(base_name)
        return found

    def class_members(self, module: str, name: str) -> set[str]:
        classes = self.classes(module)
        members = set()
        for cls in [name, *(b for b in self.bases(module, name) if b in classes)]:
            for node in classes[cls].body:
                if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                    members.add(node.name)
                elif isinstance(node, ast.Assign):
                    members |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        return members

    def device_library_names(self) -> list[str]:
        """The ``syncthreads``-style functions intrinsics.py says hipdevicelib provides."""
        doc = ast.get_docstring(self.tree("numba.hip.intrinsics")) or ""
        listed = doc.partition("via hipdevicelib")[2]
        names = [line.strip().removeprefix("* ``").removesuffix("``") for line in listed.splitlines()
                 if line.strip().startswith("* ``")]
        assert names, "numba-hip's intrinsics.py no longer lists its device-library functions"
        return names


def missing(used: set[str], api: dict[str, set[str] | None]) -> list[str]:
    """The attribute chains in ``used`` that ``api`` lacks (the first two levels are checked)."""
    gaps = []
    for chain in sorted(used):
        head, *rest = chain.split(".")
        if head not in api or (rest and api[head] is not None and rest[0] not in api[head]):
            gaps.append(chain)
    return gaps


@pytest.fixture(scope="module")
def numba_hip() -> WheelApi:
    with zipfile.ZipFile(download_wheel()) as wheel:
        sources = {name: wheel.read(name).decode() for name in wheel.namelist()
                   if name.startswith("numba/hip/") and name.endswith(".py")}
    return WheelApi(sources)


# --- the tests ----------------------------------------------------------------------------

def test_the_simt_code_uses_the_api_the_rungs_are_written_against():
    used = set().union(*used_by_project().values())
    assert {"jit", "grid", "shared.array", "syncthreads", "threadIdx.x", "as_cuda_array",
            "external_stream"} <= used


def test_every_attribute_used_on_simt_exists_in_numba_hip(numba_hip):
    gaps = {module: missing(used, numba_hip.names) for module, used in used_by_project().items()}
    assert not any(gaps.values()), f"numba-hip {VERSION} lacks: {gaps}"


def test_the_wheel_reader_finds_numba_hips_api(numba_hip):
    api = numba_hip.names
    assert {"jit", "grid", "as_cuda_array", "external_stream", "to_device", "syncthreads"} <= set(api)
    assert {"x", "y", "z"} <= api["threadIdx"] and "array" in api["shared"]
    assert "as_hip_array" not in api and "sys" not in api   # __init__.py ends with `del sys`


def test_a_name_numba_hip_lacks_is_caught(numba_hip):
    source = "def to_device(t):\n    return simt.as_hip_array(t), simt.threadIdx.w, simt.shared.array\n"
    assert missing(simt_attributes(source), numba_hip.names) == ["as_hip_array", "threadIdx.w"]


def test_the_checker_on_a_made_up_api():
    api = {"jit": None, "shared": {"array"}}
    used = simt_attributes("@simt.jit\ndef k(x):\n    a = simt.shared.array(4, x)\n    simt.sync()\n"
                           "    simt.shared.local(4, x)\n")
    assert used == {"jit", "shared", "shared.array", "shared.local", "sync"}
    assert missing(used, api) == ["shared.local", "sync"]
