"""What a tuned op's shipped table holds in each section (``kernels.tuning.section``: a target's
bf16 verdicts, and its float32 ones under ``"<target>:fp32"``), checked the same way for every op."""
from __future__ import annotations

from typing import Callable

import torch

from kernels import tuning
from workbench.isa import tune_space

TARGETS = ("gfx942", "gfx950", "sm90")
SECTIONS = (*TARGETS, *(tuning.section(t, torch.float32) for t in TARGETS))   # bf16's, then float32's


def target_of(section: str) -> str:
    return section.removesuffix(tuning.WIDE)


def dtype_of(section: str) -> torch.dtype:
    return torch.float32 if section.endswith(tuning.WIDE) else tune_space.DTYPE


def assert_verdicts(section: str, table: dict, group: Callable[[dict], tuple] = lambda cfg: (),
                    clean_lds: bool = False) -> None:
    """A kept config fits in every compile, unless its group (the configs a launch chooses among)
    has none that does: then the group keeps those that can launch, least spilling first, marked
    "spilling". A dropped config fails a verdict in some compile, or (``clean_lds``, an op whose
    table drops them: ``tune_space.least_narrow``) has 8/16-bit LDS ops where its group keeps a
    config without; then no kept config of that group has any. Every group keeps something."""
    target = target_of(section)
    clean = {group(e["config"]) for e in table["kept"] if not e.get("spilling")}
    wide = {group(e["config"]) for e in table["kept"] if not tune_space.narrow_ops(e)} if clean_lds else set()
    assert not [e for e in table["kept"] if group(e["config"]) in wide and tune_space.narrow_ops(e)]
    for entry in table["kept"]:
        resources = tune_space.compiles(entry).values()
        if entry.get("spilling"):
            assert group(entry["config"]) not in clean and all(tune_space.launchable(target, r) for r in resources)
        else:
            assert all(tune_space.verdict(target, r) is None for r in resources), entry
    for g in {group(e["config"]) for e in table["kept"] if e.get("spilling")}:
        costs = [sum(map(tune_space.spill_bytes, tune_space.compiles(e).values()))
                 for e in table["kept"] if group(e["config"]) == g]
        assert costs == sorted(costs), (section, g)
    for entry in table["dropped"]:
        assert (any(tune_space.verdict(target, r) for r in tune_space.compiles(entry).values())
                or (group(entry["config"]) in wide and tune_space.narrow_ops(entry))), entry
    groups = {group(e["config"]) for e in table["kept"] + table["dropped"]}
    assert groups == {group(e["config"]) for e in table["kept"]}, f"a group keeps nothing in {section}"
