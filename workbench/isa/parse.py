"""Reading compiled kernels: AMDGCN text, PTX text and CUDA cubins.

Instructions are classified by mnemonic only, so the same code reads both
dialects; the dialect ("amdgcn" or "ptx") picks the prefixes.
"""
from __future__ import annotations

import re
import struct
from collections import Counter

# A category -> mnemonic prefixes, per dialect. Async copies (cp.async*) move global
# memory into shared memory, so on PTX they count as global loads and as LDS writes.
_PREFIXES = {
    "amdgcn": {
        "matrix": ("v_mfma", "v_smfmac"),
        "lds_read": ("ds_read", "ds_load"),
        "lds_write": ("ds_write", "ds_store"),
        "global_load": ("global_load", "buffer_load", "flat_load"),
        "global_store": ("global_store", "buffer_store", "flat_store"),
    },
    "ptx": {
        "matrix": ("wgmma.mma_async", "mma.sync", "mma.sp"),
        "lds_read": ("ld.shared", "ldmatrix"),
        "lds_write": ("st.shared", "stmatrix", "cp.async"),
        "global_load": ("ld.global", "cp.async"),
        "global_store": ("st.global", "cp.async.bulk.tensor"),
    },
}
_NOT_A_COPY = ("commit_group", "wait_group", "wait_all", "prefetch")

_LABEL = re.compile(r"^\s*([.$\w]+):")
_BRANCH = {
    "amdgcn": re.compile(r"^\s*s_(?:cbranch_\w+|branch)\s+([.$\w]+)"),
    "ptx": re.compile(r"^\s*(?:@!?%\w+\s+)?bra(?:\.uni)?\s+([.$\w]+)\s*;"),
}
# A branch or end that control never falls through: AMD's unconditional jump, return and end;
# PTX's jump without a predicate, and its return and exit.
_NO_FALLTHROUGH = {
    "amdgcn": re.compile(r"^\s*s_(?:branch|setpc_b64|endpgm)\b"),
    "ptx": re.compile(r"^\s*(?:bra(?:\.uni)?|ret|exit)\b"),
}


def mnemonic(line: str) -> str | None:
    """The instruction's opcode, or None for labels, directives, comments and braces."""
    code = re.sub(r"^@!?%\w+\s+", "", line.strip())     # PTX predicate guard
    code = re.split(r";|//", code, maxsplit=1)[0].strip()  # AMDGCN comment / PTX terminator
    match = re.match(r"[a-z][\w.:]*", code)
    return None if match is None or code.endswith(":") else match.group(0)


_NARROW_LDS = re.compile(r"ds_(?:read|write|load|store)_[bui](?:8|16)(?:_d16(?:_hi)?)?$")


def narrow_lds(op: str) -> bool:
    """An AMDGCN LDS read or write of one 8- or 16-bit element (``ds_read_u16``,
    ``ds_write_b16_d16_hi``, ...): the sign of a layout change that the tile and warp
    split force through LDS an element at a time."""
    return bool(_NARROW_LDS.match(op))


def category(op: str, dialect: str) -> str | None:
    """The first matching category; a global->shared async copy reports "global_load"."""
    for name in ("matrix", "global_load", "lds_read", "lds_write", "global_store"):
        if _is(op, name, dialect):
            return name
    return None


def _is(op: str, name: str, dialect: str) -> bool:
    if not op.startswith(_PREFIXES[dialect][name]) or any(part in op for part in _NOT_A_COPY):
        return False
    if op.startswith("cp.async"):  # direction: the destination state space comes first
        to_shared = op.find(".shared") < op.find(".global") or ".global" not in op
        return to_shared == (name in ("global_load", "lds_write"))
    return True


def code_lines(asm: str, dialect: str) -> list[str]:
    """The kernel body: on AMDGCN the metadata and debug sections after it are cut off."""
    lines = asm.splitlines()
    if dialect == "amdgcn":
        end = next((i for i, line in enumerate(lines) if line.startswith(".Lfunc_end")), len(lines))
        lines = lines[:end]
    return lines


# A path in a ``.file`` directive (AMDGCN: directory and name; PTX: the whole path), up to the
# last package folder the project's kernels come from.
_FILE_PATH = re.compile(r'(\.file\s+\d+\s+")(?:[^"]*/)?((?:kernels|workbench|triton|exercises)(?:/[^"]*)?")')


def portable_paths(line: str) -> str:
    """``line`` with a ``.file`` directive's path cut to start at the package folder
    (``kernels/gemm``, ``triton/language``): listings shown in a notebook or a page then read
    the same on every machine, rather than naming the checkout, the virtual environment or
    the clone that filled Triton's cache (whose cached binary keeps the path it was compiled
    from)."""
    return _FILE_PATH.sub(r"\1\2", line)


def histograms(lines: list[str], dialect: str) -> dict[str, Counter]:
    """Mnemonic counts per category."""
    counts = {name: Counter() for name in _PREFIXES[dialect]}
    for line in lines:
        op = mnemonic(line)
        if op is None:
            continue
        for name in counts:
            if _is(op, name, dialect):
                counts[name][op] += 1
    return counts


def hot_loop(lines: list[str], dialect: str) -> list[str]:
    """The innermost loop holding matrix instructions (else the innermost loop), as lines.

    A loop is a backward branch, from a branch to a label earlier in the text, that the
    label's code can reach again (:func:`_reaches`; LLVM also branches back to a shared tail
    of code that jumps elsewhere, no loop). The span
    runs from that label to the last branch back to it, so a rotated loop (LLVM puts the
    body before the header) is included whole. The smallest such span is innermost.
    """
    loops = _loop_spans(lines, dialect)
    chosen = ([s for s in loops if _has_matrix(lines[s[0]:s[1] + 1], dialect)] or loops or [None])[0]
    return [] if chosen is None else lines[chosen[0]:chosen[1] + 1]


def matrix_loops(lines: list[str], dialect: str) -> list[list[str]]:
    """Every innermost loop holding matrix instructions (as :func:`hot_loop` finds loops),
    in text order: a kernel with two key loops (attention v3's unmasked and masked tiles)
    has two hot loops, and a model must weigh both."""
    loops = _loop_spans(lines, dialect)
    inner = [s for s in loops if _has_matrix(lines[s[0]:s[1] + 1], dialect)
             and not any(o != s and s[0] <= o[0] and o[1] <= s[1] for o in loops)]
    return [lines[a:b + 1] for a, b in sorted(inner)]


def _loop_spans(lines: list[str], dialect: str) -> list[tuple[int, int]]:
    """(first, last) line of every loop, smallest first: a backward branch that control from
    its label can reach again (:func:`_reaches`)."""
    labels = {m.group(1): i for i, line in enumerate(lines) if (m := _LABEL.match(line))}
    spans: dict[str, tuple[int, int]] = {}
    for i, line in enumerate(lines):
        target = branch_target(line, dialect)
        if labels.get(target, i) < i and _reaches(lines, labels, labels[target], i, dialect):
            spans[target] = (labels[target], i)
    return sorted(spans.values(), key=lambda span: span[1] - span[0])


def _reaches(lines: list[str], labels: dict[str, int], start: int, end: int, dialect: str) -> bool:
    """Whether control from line ``start`` can reach line ``end``, falling through or branching.
    A branch back to a label is a loop only then: one of v5's two-stage dQ kernels on gfx950
    branches back to a shared tail of MFMAs that ends in a jump past the branch, no loop."""
    todo, seen = [start], set()
    while todo:
        i = todo.pop()
        while i < len(lines) and i not in seen:
            seen.add(i)
            if i == end:
                return True
            target = branch_target(lines[i], dialect)
            if target in labels:
                todo.append(labels[target])
            if _NO_FALLTHROUGH[dialect].match(lines[i]):
                break
            i += 1
    return False


def _has_matrix(lines: list[str], dialect: str) -> bool:
    return any(_is(op, "matrix", dialect) for op in map(mnemonic, lines) if op)


def loads_into_lds(line: str) -> bool:
    """A global load that writes LDS instead of registers: gfx950's ``buffer_load_dwordx4 ...
    lds`` (``global_load_lds_dwordx4`` where the pointer has no 32-bit range). Its mnemonic
    is a plain load's; the ``lds`` modifier at the end says where the data goes."""
    code = line.split(";", 1)[0].split()
    return bool(code) and code[0].startswith(("buffer_load", "global_load_lds")) and (
        code[-1] == "lds" or code[0].startswith("global_load_lds"))


def prefetches_into_registers(loop: list[str]) -> bool:
    """An AMDGCN hot loop (mnemonics) that holds a later step's operands in registers:
    its global loads come before its LDS reads, and its LDS writes only after the last
    read and a barrier, so the loads wait in VGPRs while this step's operands are read
    out of LDS (Triton's gfx942 pipeliner from ``num_stages=2``). A one-stage loop
    stores to LDS before it reads."""
    kinds = [category(op, "amdgcn") for op in loop]
    where = {kind: [i for i, k in enumerate(kinds) if k == kind] for kind in ("global_load", "lds_read", "lds_write")}
    if not all(where.values()):
        return False
    last_read, first_write = where["lds_read"][-1], where["lds_write"][0]
    return (where["global_load"][0] < where["lds_read"][0] and last_read < first_write
            and "s_barrier" in loop[last_read:first_write])

_FRAME = re.compile(r"([\w.-]+):(\d+):\d+")
_PTX_FILE = re.compile(r'^\s*\.file\s+(\d+)\s+"([^"]*)"')
_PTX_LOC = re.compile(r"^\s*\.loc\s+(\d+)\s+(\d+)\s+(\d+)(?:,.*?\binlined_at\s+(\d+)\s+(\d+)\s+(\d+))?")


def by_source_line(lines: list[str], file: str, dialect: str = "amdgcn") -> list[tuple[str, int | None]]:
    """Each instruction with the line of ``file`` it came from, per the line table: the
    innermost inlined frame in ``file`` counts (a ``tl.sum`` of Triton's standard.py charges
    the caller's line); None where the last ``.loc`` has no frame in ``file``.

    AMDGCN: the comment of each ``.loc`` lists its inlined frames innermost first. PTX: a
    ``.loc`` names one frame (by its ``.file`` number) and, if inlined, the call site it was
    inlined at; that call site's own ``.loc``, emitted before it, names the next one out."""
    if dialect == "ptx":
        return _ptx_by_source_line(lines, file)
    line, out = None, []
    for text in lines:
        if text.lstrip().startswith(".loc"):
            frames = [int(n) for name, n in _FRAME.findall(text.partition(";")[2]) if name == file]
            line = frames[0] if frames else None
        elif op := mnemonic(text):
            out.append((op, line))
    return out


def _ptx_by_source_line(lines: list[str], file: str) -> list[tuple[str, int | None]]:
    names = {m.group(1): m.group(2).rsplit("/", 1)[-1] for text in lines if (m := _PTX_FILE.match(text))}
    callers: dict[tuple, tuple | None] = {}   # (file number, line, column) -> where it was last inlined
    line, out = None, []
    for text in lines:
        if m := _PTX_LOC.match(text):
            frame, seen = m.group(1, 2, 3), set()
            callers[frame] = m.group(4, 5, 6) if m.group(4) else None
            while frame is not None and names.get(frame[0]) != file and frame not in seen:
                seen.add(frame)
                frame = callers.get(frame)
            line = int(frame[1]) if frame is not None and names.get(frame[0]) == file else None
        elif op := mnemonic(text):
            out.append((op, line))
    return out


def branch_target(line: str, dialect: str) -> str | None:
    """The label a branch instruction jumps to (None for any other line)."""
    m = _BRANCH[dialect].match(line)
    return m.group(1) if m else None


def amdgpu_resources(asm: str) -> dict[str, int | None]:
    """Register, spill and occupancy figures from the AMDGCN text (kernel info + metadata)."""
    def number(pattern: str) -> int | None:
        m = re.search(pattern, asm, re.MULTILINE)
        return int(m.group(1)) if m else None

    return {
        "vgprs": number(r"^; NumVgprs: (\d+)"),            # arch VGPRs
        "agprs": number(r"\.agpr_count:\s+(\d+)"),
        "total_vgprs": number(r"^; TotalNumVgprs: (\d+)"),   # unified count used for occupancy
        "sgprs": number(r"\.sgpr_count:\s+(\d+)"),
        "vgpr_spills": number(r"\.vgpr_spill_count:\s+(\d+)"),
        "sgpr_spills": number(r"\.sgpr_spill_count:\s+(\d+)"),
        "scratch_bytes": number(r"\.private_segment_fixed_size:\s+(\d+)"),
        "occupancy": number(r"^; Occupancy: (\d+)"),
    }


# CUDA ELF .nv.info attributes (EIATTR_*): each record is format byte, attribute byte,
# then for format 4 a u16 size and a payload whose first u32 is the function's symbol.
_EIATTR_REGCOUNT = 0x2F
_EIATTR_FRAME_SIZE = 0x11


def cubin_resources(cubin: bytes) -> dict[str, int | None]:
    """Registers per thread and stack frame bytes (local memory: spills) from a cubin."""
    found: dict[str, int | None] = {"registers": None, "frame_bytes": None}
    for name, data in _elf_sections(cubin):
        if not name.startswith(".nv.info"):
            continue
        at = 0
        while at + 2 <= len(data):
            fmt, attr = data[at], data[at + 1]
            if fmt != 4:
                at += 4  # formats 1-3 keep their value (if any) in the 4-byte header
                continue
            (size,) = struct.unpack_from("<H", data, at + 2)
            if attr in (_EIATTR_REGCOUNT, _EIATTR_FRAME_SIZE) and size == 8:
                (value,) = struct.unpack_from("<I", data, at + 8)
                found["registers" if attr == _EIATTR_REGCOUNT else "frame_bytes"] = value
            at += 4 + size
    return found


def _elf_sections(elf: bytes):
    """(name, contents) of each section of a little-endian ELF64 file."""
    (offset,) = struct.unpack_from("<Q", elf, 0x28)
    entry_size, count, names_index = struct.unpack_from("<HHH", elf, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", elf, offset + i * entry_size) for i in range(count)]
    names_at = headers[names_index][4]
    for name_at, _, _, _, start, size in headers:
        end = elf.index(b"\0", names_at + name_at)
        yield elf[names_at + name_at:end].decode(), elf[start:start + size]
