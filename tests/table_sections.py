"""What a tuned op's shipped table holds in each section (``kernels.tuning.section``: a target's
bf16 verdicts, and its float32 ones under ``"<target>:fp32"``), checked the same way for every op."""
from __future__ import annotations

from typing import Callable

import torch

from kernels import tuning
from workbench.isa import tune_space

TARGETS = ("gfx942", "gfx950", "sm90")
SECTIONS = (*TARGETS, *(tuning.section(t, torch.float32) for t in TARGETS))   # bf16's, then float32's
DEVICES = [("hip", "gfx942"), ("hip", "gfx950"), ("cuda", "sm_90")]   # (backend, arch), TARGETS' order
DEVICE_OF = dict(zip(TARGETS, DEVICES))   # a target -> its (backend, arch)


def config_key(cfg: dict) -> tuple:
    return tuple(sorted(cfg.items()))


def target_of(section: str) -> str:
    return section.removesuffix(tuning.WIDE)


def dtype_of(section: str) -> torch.dtype:
    return torch.float32 if section.endswith(tuning.WIDE) else tune_space.DTYPE


def assert_verdicts(section: str, table: dict, group: Callable[[dict], tuple] = lambda cfg: ()) -> None:
    """A kept config fits in every compile, unless its group (the configs a launch chooses among)
    has none that does: then the group keeps those that can launch, least spilling first, marked
    "spilling". A kept config has no 8/16-bit LDS ops where its group keeps one without
    (``tune_space.clean_lds``; tables that record none pass trivially). A dropped config fails a
    verdict in some compile, or has such ops where its group keeps one without. Every group
    keeps something."""
    target = target_of(section)
    clean = {group(e["config"]) for e in table["kept"] if not e.get("spilling")}
    clean_lds = {group(e["config"]) for e in table["kept"] if not tune_space.narrow_lds_ops(e)}
    assert not [e for e in table["kept"] if tune_space.narrow_lds_ops(e) and group(e["config"]) in clean_lds]
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
        assert any(tune_space.verdict(target, r) for r in tune_space.compiles(entry).values()) or \
            (tune_space.narrow_lds_ops(entry) and group(entry["config"]) in clean_lds), entry
    groups = {group(e["config"]) for e in table["kept"] + table["dropped"]}
    assert groups == {group(e["config"]) for e in table["kept"]}, f"a group keeps nothing in {section}"
