"""What one warp issues in one iteration of a kernel's hot loop, read from the PTX text (sm90).

The NVIDIA counterpart of :mod:`.loop`, into the same :class:`~.loop.LoopMix`, so the
combination rule (:mod:`.combine`) weighs both alike with an SM sub-partition in the
place of a SIMD (four per SM, as four SIMDs per CU):

* ``wgmma.mma_async`` (a warpgroup's instruction; each of its 4 warps issues it):
  tensor-core cycles ``2 x M x N x K`` / the SM's dense FLOP per clock for the operand type
  (``machine.yaml``), charged to every warp of the group, as each runs on its own
  sub-partition; its FLOPs shared by the 4 warps. Its shared-memory operands (B always, A
  unless it comes from registers) are charged to the shared memory: an assumption, as the
  tensor cores' path to shared memory is not documented.
* ``mma.sync`` (one warp's product, from registers: Triton's choice where a tile has no
  64-row warpgroup shape, a decode GEMM's 16-row tile): its sub-partition's tensor-core cycles at
  a quarter of the SM's rate (``machine.yaml``: an upper bound), all its FLOPs to the warp;
  its operands reach the registers through ``ldmatrix``/``ld.shared``, charged as such.
* ``cp.async`` (global to shared): its copy size per lane to global memory and to shared
  memory; ``ld``/``st`` ``.global`` and ``.shared`` and ``ldmatrix``/``stmatrix``: their
  vector width per lane. A TMA copy (``cp.async.bulk``) has its size in a descriptor the
  loop does not show: it is refused, not guessed. An access narrower than a 4-byte bank
  is charged a whole bank slot, as on AMD.
* Every other instruction but moves, branches, barriers and fences: one ALU issue
  (``ex2``, ``lg2``, ``rcp``, ``rsqrt``, ``sqrt``, ``sin``, ``cos``, ``tanh``: the MUFU, at
  its own rate). PTX is not SASS: ``ptxas`` schedules, fuses and drops instructions, so
  these counts are the PTX's, an assumption the prediction states.

``matrix_in_flight``: the fewest ``wgmma`` groups the loop's ``wgmma.wait_group`` leaves
running (Triton's pipelined GEMM loop: 1, so one iteration's products overlap the next
iteration's issue; a loop that needs the products, attention's softmax: 0).

Every lane is taken as active.
"""
from __future__ import annotations

import re
from collections import Counter

from ..isa import parse as isa_parse
from . import machine
from .loop import LoopMix

WARPS_PER_WARPGROUP = 4
_TYPE_BYTES = {"b8": 1, "u8": 1, "s8": 1, "b16": 2, "u16": 2, "s16": 2, "f16": 2, "bf16": 2, "b32": 4, "u32": 4,
               "s32": 4, "f32": 4, "b64": 8, "u64": 8, "s64": 8, "f64": 8, "b128": 16}
_OPERAND_BYTES = {"bf16": 2, "f16": 2, "tf32": 4, "e4m3": 1, "e5m2": 1}
_WIDTH = re.compile(r"\.(?:v(\d)\.)?([bfsu]\d+|bf16)(?:\.|$)")
_MATRIX = re.compile(r"\.x(\d)\.")
_COPY_SIZE = re.compile(r"\]\s*,\s*(0x[0-9a-fA-F]+|\d+)\s*[,;]")
_WGMMA_TYPES = re.compile(r"\.m64n(\d+)k(\d+)\.\w+\.(\w+)\.\w+$")
_TRANSCENDENTAL = re.compile(r"(?:ex2|lg2|rcp|rsqrt|sqrt|sin|cos|tanh)\.")
_WGMMA_WAIT = re.compile(r"wgmma\.wait_group\.sync\.aligned\s+(\d+)")
NOT_ALU = ("mov", "bra", "bar", "barrier", "fence", "membar", "wgmma.", "cp.async", "ret", "prefetch")


def access_bytes(op: str) -> int:
    """Bytes per lane of a PTX ``ld``/``st`` (vector width x type) or ``ldmatrix``/``stmatrix``
    (``.xN``: N 8x8 matrices of 16-bit elements per warp, 4 x N bytes per lane)."""
    if op.startswith(("ldmatrix", "stmatrix")):
        m = _MATRIX.search(op + ".")
        if m is None:
            raise ValueError(f"{op!r}: no .xN matrix count")
        return 8 * 8 * 2 * int(m.group(1)) // 32
    m = _WIDTH.search(op[op.find("."):])
    if m is None or m.group(2) not in _TYPE_BYTES:
        raise ValueError(f"{op!r} is not a PTX load or store this model knows")
    return int(m.group(1) or 1) * _TYPE_BYTES[m.group(2)]


def copy_bytes(line: str) -> int:
    """Bytes per lane of a ``cp.async`` from its copy-size operand."""
    m = _COPY_SIZE.search(line)
    if m is None:
        raise ValueError(f"no copy size in {line.strip()!r}")
    return int(m.group(1), 0)


def wgmma_shared_bytes(op: str, line: str) -> int:
    """Bytes a warpgroup's ``wgmma`` reads from shared memory: B (``N x K``), and A
    (``64 x K``) unless its operand after the accumulators is a register list."""
    m = _WGMMA_TYPES.search(op)
    if m is None:
        raise ValueError(f"{op!r} is not a wgmma.mma_async this model knows")
    n, k, kind = int(m.group(1)), int(m.group(2)), m.group(3)
    elem = _OPERAND_BYTES[kind]
    operands = line.split("}", 1)[1].lstrip(" ,")
    return (n * k + (0 if operands.startswith("{") else 64 * k)) * elem


def mix(loop_text: str, arch: str, lanes: int = 32) -> LoopMix:
    """Count and weigh the hot loop of a PTX kernel for NVIDIA target ``arch`` (``sm_90``)."""
    lines = [(op, line) for line in loop_text.splitlines() if (op := isa_parse.mnemonic(line))]
    if not lines:
        raise ValueError("the kernel has no hot loop to model")
    products, shared_ops = Counter(), Counter()
    valu = transcendental = shared_bytes = slot_bytes = global_bytes = 0
    bank = machine.constant("lds_bank_bytes", arch).value
    for op, line in lines:
        kind = isa_parse.category(op, "ptx")
        if op.startswith("cp.async.bulk"):
            raise ValueError(f"{op}: a TMA copy's size is in its descriptor; the model does not weigh TMA loops")
        if kind == "matrix":
            products[op] += 1
            if not machine.warp_product(op):   # a wgmma; mma.sync's operands are registers
                nbytes = wgmma_shared_bytes(op, line) // WARPS_PER_WARPGROUP
                shared_bytes += nbytes
                slot_bytes += nbytes
        elif op.startswith("cp.async"):
            if kind == "global_load":
                shared_ops[op] += 1
                nbytes = lanes * copy_bytes(line)
                global_bytes += nbytes
                shared_bytes += nbytes
                slot_bytes += lanes * max(copy_bytes(line), bank)
        elif kind in ("lds_read", "lds_write"):
            shared_ops[op] += 1
            shared_bytes += lanes * access_bytes(op)
            slot_bytes += lanes * max(access_bytes(op), bank)
        elif kind in ("global_load", "global_store"):
            global_bytes += lanes * access_bytes(op)
        elif not op.startswith(NOT_ALU):
            valu += 1
            transcendental += bool(_TRANSCENDENTAL.match(op))
    return LoopMix(
        mfma=dict(products),
        mfma_cycles=sum(n * machine.mfma_cycles(op, arch) for op, n in products.items()),
        mfma_flops=sum(n * machine.mfma_flops(op) // (1 if machine.warp_product(op) else WARPS_PER_WARPGROUP)
                       for op, n in products.items()),
        valu=valu, transcendental=transcendental, salu=0, lds_bytes=shared_bytes, lds_slot_bytes=slot_bytes,
        lds_ops=dict(shared_ops), global_bytes=global_bytes, lines=len(lines),
        matrix_in_flight=min((int(m.group(1)) for _, line in lines if (m := _WGMMA_WAIT.search(line))), default=0))
