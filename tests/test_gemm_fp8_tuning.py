"""FP8 GEMM tuning (v1, v2): the ahead-of-time pruned table, per binary a launch runs and
operand layout it runs at, the launch's choice among what its binary keeps at its layout, the
prior for untimed keys, and the XCD remap of program ids.

The shipped table (``kernels/gemm_fp8/tuned_space.json``) is checked for coverage and for its
verdicts from the numbers it stores; a sample of each part's entries (the prior on every target,
the last kept config and the first dropped one on one target) is recompiled to show the numbers are true; the
layouts the FP8 recipes' GEMMs run are recorded from real calls and checked to be the ones compiled.
The tuner runs on a pretended GPU (``fake_gpu``) with a fake clock and a launch that only notes its
config, so nothing big is interpreted.
"""
from __future__ import annotations

import json

import pytest
import torch

import kernels
from kernels import tuning, xcd
from kernels.gemm import configs as gemm_configs
from kernels.gemm_fp8 import configs, launch, operands, v1_triton_fp8_dot as v1, v2_triton_blockwise as v2
from kernels.gemm_fp8.formats import fp8_dtype
from kernels.outputs import poisoned_outputs
from workbench import isa
from workbench.check import compare
from workbench.isa import tune_space

from fp8_recipe_launches import part_of, recipe_launches
from table_sections import DEVICE_OF, TARGETS, assert_verdicts, config_key

SPEC = kernels.spec("gemm_fp8")
KERNELS = {"v1": v1._gemm_fp8_kernel, "v2": v2._gemm_fp8_blockwise_kernel}
BINARIES = configs.BINARIES
PARTS = configs.PARTS   # "binary:layout" -> (binary, layout)
# each binary: the rung that runs it and the scales its launch takes (spec granularity)
LAUNCHES = {"v1": ("v1", "channel"), "v2_blockwise": ("v2", "block128x128"), "v2_rowwise": ("v2", "channel"),
            "v2_tensorwise": ("v2", "tensor"), "v2_blockwise_128x1": ("v2", "block128x1")}
WIDE = [(128, 256), (256, 128)]


def _part(binary: str, layout: str = "NT") -> str:
    return configs.part(binary, layout)


def _section(target: str, part: str) -> dict:
    return tuning.shipped(configs.TABLE)[target][part]


def _entries(target: str, part: str) -> list[dict]:
    table = _section(target, part)
    return table["kept"] + table["dropped"]


def _kept(target: str, part: str) -> list[dict]:
    return [e["config"] for e in _section(target, part)["kept"]]


def _entry(target: str, part: str, cfg: dict) -> dict:
    return next(e for e in _entries(target, part) if e["config"] == cfg)


def _verdict(target: str, part: str, cfg: dict) -> str | None:
    """Why ``part``'s compile of ``cfg`` (NUM_XCDS, a launch's, left out) may not be timed."""
    cfg = {k: v for k, v in cfg.items() if k != "NUM_XCDS"}
    return tune_space.verdict(target, _entry(target, part, cfg)[part])


# -- the table ---------------------------------------------------------------------------

def test_the_table_has_one_section_per_target_split_per_binary_and_layout():
    """FP8 has no float32 section: each target is compiled at its own e4m3 format, as each binary
    at each operand layout its launches run (:data:`configs.PARTS`)."""
    assert sorted(tuning.shipped(configs.TABLE)) == sorted(TARGETS)
    assert all(sorted(parts) == sorted(PARTS) for parts in tuning.shipped(configs.TABLE).values())


@pytest.mark.parametrize("part", PARTS)
@pytest.mark.parametrize("target", TARGETS)
def test_shipped_table_covers_exactly_the_candidates(target, part):
    """A changed candidate list without ``python -m workbench.isa.tune_space --op gemm_fp8 --write`` fails here."""
    recorded = [config_key(entry["config"]) for entry in _entries(target, part)]
    wanted = [config_key(tuning.as_dict(c)) for c in configs.candidates(target)]
    assert sorted(recorded) == sorted(wanted)


@pytest.mark.parametrize("part", PARTS)
@pytest.mark.parametrize("target", TARGETS)
def test_each_part_keeps_the_configs_its_own_compile_fits(target, part):
    """Each part holds its own binary's compile at its own layout alone, judged alone: kept where
    it fits, dropped where it does not, whatever the other parts' compiles of the config do."""
    table = _section(target, part)
    assert all(list(tune_space.compiles(e)) == [part] for e in table["kept"] + table["dropped"])
    assert_verdicts(target, table)
    assert not any(tune_space.narrow_lds_ops(e) for e in table["kept"])   # as clean_lds says
    # an N-contiguous B or M-contiguous A goes through LDS a byte at a time at some gfx942 configs
    narrow = any(tune_space.narrow_lds_ops(e) for e in table["dropped"])
    assert narrow == (target == "gfx942" and PARTS[part][1] != "NT"), part
    assert not any(e.get("spilling") for e in table["kept"]), "every FP8 part keeps a config that fits"
    assert _kept(target, part) == [c for c in map(tuning.as_dict, configs.candidates(target))
                                   if c in _kept(target, part)]   # candidate order: the prior first
    tiles = {(c["BLOCK_M"], c["BLOCK_N"]) for c in _kept(target, part)}
    if target == "sm90" and part.startswith("v2_blockwise"):   # the fp32 partial product needs a stack frame wider
        assert tiles == {(128, 128)} and all(tune_space.verdict(target, e[part]) for e in table["dropped"])
    else:   # on gfx942 an M-contiguous A (TN) keeps K steps of 128 only
        steps = {128} if target == "gfx942" and PARTS[part][1] == "TN" else {64, 128}
        assert set(WIDE) <= tiles and {c["BLOCK_K"] for c in _kept(target, part)} == steps, tiles


def test_sm90_offers_the_wide_tiles_to_the_binaries_that_compile_clean_there():
    """128x256x128 and 256x128x128 with 8 warps: v1 and the binaries with scales constant along K (``SCALES_ALONG_K`` False, what
    ``kernels.matmul_fp8`` runs, per row and per tensor) compile them without a stack frame and
    are offered them; the blockwise binary needs one there and is not."""
    for bm, bn in WIDE:
        cfg = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=128, GROUP_M=8, num_warps=8, num_stages=3)
        for binary in ("v1", "v2_rowwise", "v2_tensorwise"):
            assert _entry("sm90", _part(binary), cfg)[_part(binary)]["scratch_bytes"] == 0
            assert cfg in [tuning.as_dict(c) for c in configs.space("cuda", "sm_90", binary)]
        blockwise = _part("v2_blockwise")
        assert _entry("sm90", blockwise, cfg)[blockwise]["scratch_bytes"] > 0
        assert cfg not in [tuning.as_dict(c) for c in configs.space("cuda", "sm_90", "v2_blockwise")]


def test_per_tensor_scales_are_a_binary_of_their_own():
    """The per-tensor recipes' scales (stride 0, not folded to a constant as the rowwise recipe's
    1 is) compile to another epilogue with other verdicts: on gfx950 a config the rowwise binary
    keeps spills VGPRs in theirs; on gfx942 one the rowwise binary drops (SGPR spills) is clean."""
    def apart(target, keeps, drops):
        return [e for e in _section(target, _part(drops))["dropped"] if e["config"] in _kept(target, _part(keeps))]
    assert apart("gfx950", "v2_rowwise", "v2_tensorwise")
    assert all(e[_part("v2_tensorwise")]["spills"] > 0 for e in apart("gfx950", "v2_rowwise", "v2_tensorwise"))
    assert apart("gfx942", "v2_tensorwise", "v2_rowwise")
    assert all(e[_part("v2_rowwise")]["sgpr_spills"] > 0 for e in apart("gfx942", "v2_tensorwise", "v2_rowwise"))


# configs the NT compile keeps that spill at a backward layout, per target: the configs docstring's counts
SPILL_APART = {"gfx942": {"v2_blockwise:NN": (7, 40), "v2_tensorwise:NN": (5, 53), "v2_tensorwise:TN": (4, 53),
                          "v1:NN": (4, 52), "v1:TN": (3, 52), "v2_rowwise:NN": (4, 52), "v2_rowwise:TN": (3, 52)},
               "gfx950": {"v2_blockwise:NN": (0, 40), "v2_tensorwise:NN": (3, 54), "v2_tensorwise:TN": (2, 54),
                          "v1:NN": (4, 55), "v1:TN": (2, 55), "v2_rowwise:NN": (4, 55), "v2_rowwise:TN": (2, 55)},
               "sm90": {"v2_blockwise:NN": (0, 2), "v2_tensorwise:NN": (0, 8), "v2_tensorwise:TN": (0, 8),
                        "v1:NN": (0, 8), "v1:TN": (0, 8), "v2_rowwise:NN": (0, 8), "v2_rowwise:TN": (0, 8)}}
# each target's kept configs per part at plain calls' layouts (the configs docstring's)
CALL_KEPT = {"gfx942": {"NN": 16, "TN": 10}, "gfx950": {"NN": 51, "TN": 53}, "sm90": {"NN": 8, "TN": 8}}


@pytest.mark.parametrize("target", TARGETS)
def test_the_backward_layouts_drop_configs_the_forwards_keeps(target):
    """Per layout, as the configs docstring counts: on gfx942 some configs NT keeps spill at the
    backward's NN or TN and more have 8/16-bit LDS ops there (dropped: their part keeps configs
    without); on gfx950 a few spill; on sm90 each layout keeps exactly NT's."""
    assert set(SPILL_APART[target]) == {p for p, (_, layout) in PARTS.items() if layout != "NT"}
    for binary in ("v1", "v2_rowwise"):
        assert {layout: len(_kept(target, _part(binary, layout))) for layout in ("NN", "TN")} == CALL_KEPT[target]
    for part, (spilling, forward) in SPILL_APART[target].items():
        nt = _kept(target, _part(PARTS[part][0]))
        assert len(nt) == forward
        assert sum(1 for c in nt if (_verdict(target, part, c) or "").startswith("spills")) == spilling, part
        lds = [c for c in nt if c not in _kept(target, part) and not _verdict(target, part, c)]
        assert all(tune_space.narrow_lds_ops(_entry(target, part, c)) for c in lds)
        assert bool(lds) == (target == "gfx942"), part
        if target == "sm90":
            assert _kept(target, part) == nt


def test_the_candidate_space_and_binaries_are_what_the_configs_docstring_says():
    def values(target, name):
        return {tuning.as_dict(c).get(name) for c in configs.candidates(target)}
    for target in ("gfx942", "gfx950"):
        assert {(c["BLOCK_M"], c["BLOCK_N"]) for c in map(tuning.as_dict, configs.candidates(target))} == \
            {(128, 128), (128, 256), (256, 128), (256, 256)}
        assert (values(target, "BLOCK_K"), values(target, "num_warps"), values(target, "num_stages")) == \
            ({64, 128}, {4, 8}, {2})
        assert (values(target, "matrix_instr_nonkdim"), values(target, "waves_per_eu")) == ({16, 32}, {0, 2})
    assert (values("sm90", "num_stages"), values("sm90", "GROUP_M"), values("gfx942", "GROUP_M")) == ({3}, {8}, {8})
    assert len(BINARIES) == 5 and gemm_configs.TILE_SIZES * gemm_configs.PER_TILE == 16


def _first(target: str, part: str, verdict: bool) -> dict | None:
    """The first candidate of ``target`` whose compile of ``part`` fails (``verdict``) or fits."""
    return next((e for e in _entries(target, part) if bool(tune_space.verdict(target, e[part])) == verdict), None)


def _measured(target: str, part: str, entry: dict) -> dict:
    """``entry``'s config compiled as ``part``'s binary at its layout at the target's e4m3
    format (dtype None), the way the generator compiles it."""
    (rung, extra), = [(tune_space.OPS["gemm_fp8"].compile_rung(name), extra) for name, extra
                      in tune_space.OPS["gemm_fp8"].compiles(entry["config"]).items() if name == part]
    return tune_space.measure("gemm_fp8", target, {**entry["config"], **extra}, None, rung)


# Per target and part the prior (what an untuned launch runs); per part, on one target in turn, the
# last kept config and the first dropped one (if any): the edge of the kept list. Every edge on every
# target was 70 compiles and two CPU minutes of CI (sm90's dropped configs 5 to 8 s each) for
# checking one generator against one compiler a third time over.
SAMPLE = [(target, part, which) for target in TARGETS for index, part in enumerate(PARTS)
          for which in ("prior", "last kept", "dropped")
          if which == "prior" or TARGETS[index % len(TARGETS)] == target]


@pytest.mark.parametrize("target,part,which", SAMPLE)
def test_table_entries_are_what_the_compiler_gives(target, part, which):
    kept = _section(target, part)["kept"]
    entry = {"prior": kept[0], "last kept": kept[-1], "dropped": _first(target, part, verdict=True)}[which]
    if entry is None:
        pytest.skip(f"{part} drops no config on {target}")
    if which == "last kept" and len(kept) == 1:
        pytest.skip(f"{part} keeps one config on {target}: its prior")
    assert _measured(target, part, entry) == entry[part]


@pytest.mark.parametrize("part", PARTS)
@pytest.mark.parametrize("target", TARGETS)
def test_space_is_the_binarys_kept_part_of_the_table_at_its_layout(target, part):
    assert [tuning.as_dict(c) for c in configs.space(*DEVICE_OF[target], *PARTS[part])] == _kept(target, part)


def test_an_unknown_binary_is_refused():
    with pytest.raises(ValueError, match="v2_rowwise"):
        configs.space("cuda", "sm_90", "v2")
    with pytest.raises(ValueError, match="v1 and v2"):
        configs.binary("v0")


AMD_PRIOR = dict(BLOCK_M=256, BLOCK_N=128, BLOCK_K=128, GROUP_M=8, matrix_instr_nonkdim=16, waves_per_eu=0,
                 num_warps=8, num_stages=2)


# gfx942's parts that do not keep AMD_PRIOR, and their prior
GFX942_PRIORS = {"v2_blockwise_128x1:NT": dict(AMD_PRIOR, num_warps=4),
                 "v2_blockwise:NN": dict(AMD_PRIOR, num_warps=4, matrix_instr_nonkdim=32),
                 **{_part(binary, layout): dict(AMD_PRIOR, num_warps=4)
                    for binary in ("v1", "v2_rowwise", "v2_tensorwise") for layout in ("NN", "TN")}}


@pytest.mark.parametrize("part", PARTS)
@pytest.mark.parametrize("arch", ("gfx942", "gfx950"))
def test_the_amd_prior_is_the_config_the_rungs_ran_untuned(arch, part):
    """Candidate order puts 256x128x128, 8 warps, 16x16 MFMAs first, and every binary keeps it at
    NT: the ISA claims of v1 and v2 (tests/test_isa_claims.py, tests/test_gemm_fp8_blockwise.py)
    hold for it. But on gfx942 the weight gradient's blockwise binary (B's scales per 128 x 1)
    spills there, and every NN and TN part (the blockwise dgrad's NN, the per-tensor dgrad's NN
    and wgrad's TN, v1's and the rowwise binary's plain calls') drops it: their prior is the same
    tile with 4 warps (the blockwise dgrad's with 32x32 MFMAs)."""
    prior = configs.prior("hip", arch, 8192, 8192, 8192, *PARTS[part])
    if arch == "gfx942" and part in GFX942_PRIORS:
        assert AMD_PRIOR not in _kept(arch, part)
        assert prior == GFX942_PRIORS[part]
    else:
        assert prior == AMD_PRIOR
    assert prior == _kept(arch, part)[0]


@pytest.mark.parametrize("part", PARTS)
@pytest.mark.parametrize("target", TARGETS)
def test_an_aot_compile_at_a_layout_runs_that_layouts_prior(target, part):
    """An ISA compile at a layout override without config overrides runs the binary's prior at
    that layout, a config its part keeps (on gfx942 NN's and TN's are not NT's), whole-chip XCDs."""
    (binary, layout), (backend, arch) = PARTS[part], DEVICE_OF[target]
    aot, = kernels.get("gemm_fp8", BINARIES[binary].rung).aot(fp8_dtype(arch), backend, arch,
                                                            {"binary": binary, "layout": layout})
    prior = configs.prior(backend, arch, 8192, 8192, 8192, binary, layout)
    ran = {**{k: v for k, v in aot.constexprs.items() if k in prior or k == "NUM_XCDS"}, **aot.options}
    assert ran == {**prior, "NUM_XCDS": xcd.full_chip_xcds(backend, arch)}
    assert prior in _kept(target, part)


@pytest.mark.parametrize("target", TARGETS)
def test_a_part_the_table_lacks_compiles_each_candidate_so_its_section_can_be_built(target, tmp_path, monkeypatch):
    """How a binary or layout is added: ``workbench.isa.tune_space`` compiles every candidate at
    the new part before the table has a section for it. A candidate's whole config replaces the
    prior, so the table is not read for it; a launch without a whole config still needs the
    part's section, and says so."""
    (binary, layout), (backend, arch) = PARTS["v2_blockwise:NN"], DEVICE_OF[target]
    table = json.loads(configs.TABLE.read_text())
    for section in table["targets"].values():
        del section["v2_blockwise:NN"]
    lacking = tmp_path / "tuned_space.json"
    lacking.write_text(json.dumps(table))
    monkeypatch.setattr(configs, "TABLE", lacking)
    rung = kernels.get("gemm_fp8", "v2")
    for candidate in configs.candidates(target)[-2:]:   # the space's last: no part's prior
        cfg = tuning.as_dict(candidate)
        aot, = rung.aot(fp8_dtype(arch), backend, arch, {"binary": binary, "layout": layout, **cfg})
        ran = {**{k: v for k, v in aot.constexprs.items() if k in cfg or k == "NUM_XCDS"}, **aot.options}
        assert ran == {**cfg, "NUM_XCDS": xcd.full_chip_xcds(backend, arch)}
    with pytest.raises(ValueError, match="no binary 'v2_blockwise:NN'"):
        rung.aot(fp8_dtype(arch), backend, arch, {"binary": binary, "layout": layout, "num_warps": 4})


def test_the_isa_page_at_the_blockwise_dgrads_layout_compiles_its_prior():
    """The ISA pages of v2 at NN on gfx942: the blockwise launch at NN's prior, 4 warps and 32x32
    MFMAs, which NN keeps; NT's (8 warps, 16x16) NN drops. The rowwise launch at its own NN prior
    (4 warps, 16x16 MFMAs: more of them) is the page's main kernel there."""
    blockwise, rowwise = isa.inspect_all("gemm_fp8", "v2", "gfx942", overrides={"layout": "NN"})
    assert (blockwise.options["num_warps"], blockwise.options["matrix_instr_nonkdim"]) == (4, 32)
    assert set(blockwise.matrix_instructions) == {"v_mfma_f32_32x32x16_fp8_fp8"}
    assert (rowwise.options["num_warps"], rowwise.options["matrix_instr_nonkdim"]) == (4, 16)
    assert isa.inspect("gemm_fp8", "v2", "gfx942", overrides={"layout": "NN"}) == rowwise


SM90_PRIOR_TILES = {"v1": (128, 256, 128), "v2_rowwise": (128, 256, 128), "v2_tensorwise": (128, 256, 128),
                    "v2_blockwise": (128, 128, 128), "v2_blockwise_128x1": (128, 128, 64)}


@pytest.mark.parametrize("part", PARTS)
def test_the_sm90_prior_is_each_binarys_first_kept_candidate(part):
    """Hopper's candidates put 128x256x128, 8 warps first: the prior of the binaries that keep it,
    at every layout; the blockwise binary's first kept is 128x128x128, 8 warps (NT and NN), the
    weight gradient's (B's scales per 128 x 1) 128x128x64, its only one: at 128x128x128 it needs
    a stack frame too."""
    binary = PARTS[part][0]
    tile = SM90_PRIOR_TILES[binary]
    prior = configs.prior("cuda", "sm_90", 8192, 8192, 8192, *PARTS[part])
    assert prior == dict(BLOCK_M=tile[0], BLOCK_N=tile[1], BLOCK_K=tile[2], GROUP_M=8, num_warps=8, num_stages=3)
    assert prior == _kept("sm90", part)[0]
    if binary == "v2_blockwise_128x1":
        wider = _entry("sm90", _part(binary), dict(prior, BLOCK_K=128))
        assert _measured("sm90", _part(binary), wider)["scratch_bytes"] == wider[_part(binary)]["scratch_bytes"] > 0


def test_the_interpreter_keeps_its_small_config():
    assert all([tuning.as_dict(c) for c in configs.space("interpreter", "cpu", *parts)] ==
               [tuning.as_dict(c) for c in configs.interpreter_configs()] for parts in [*PARTS.values(), ("v1", "TT")])


# -- the launch's choice, on a pretended GPU --------------------------------------------------

def _inputs(binary: str, shape: tuple, dtype: torch.dtype, layout: str = "NT") -> tuple:
    """The binary's operands at ``layout`` (A's letter, then B's: "N" for a contiguous row)."""
    a, b, sa, sb = SPEC.make_inputs(shape, dtype, seed=1, granularity=LAUNCHES[binary][1])
    a, b = (t.contiguous() if letter == "N" else t.t().contiguous().t() for t, letter in zip((a, b), layout))
    return a, b, sa, sb


def _settings(binary: str, a, b, sa, sb) -> dict:
    """What the binary's launch runs for these operands (nothing is launched: ``_run`` is a stub)."""
    rung = LAUNCHES[binary][0]
    if rung == "v2":
        return launch.plan_blockwise(KERNELS[rung], a, b, sa, sb, torch.bfloat16).config
    strides = operands.check(a, b, sa, sb, torch.bfloat16)
    return launch.settings(rung, KERNELS[rung], a, b, sa, sb, torch.bfloat16, strides, {})


@pytest.fixture
def pretend(fake_gpu, monkeypatch):
    """A pretended GPU of ``target``; the tuner's launches only note their config, and the fake
    clock makes the last candidate timed the fastest. Returns the configs timed."""
    def install(target: str) -> list[dict]:
        backend, arch = DEVICE_OF[target]
        fake_gpu(backend, arch, "AMD Instinct MI300X" if backend == "hip" else "NVIDIA H200")
        launched, timed = [], []
        monkeypatch.setattr(launch, "_run", lambda *args: launched.append(args[-1]))

        def time_ms(fn):
            fn()
            timed.append(launched[-1])
            return 100.0 - len(timed)
        monkeypatch.setattr(tuning, "time_ms", time_ms)
        return timed
    return install


# sm90's weight-gradient blockwise binary keeps one config: nothing to time or choose among
TUNED = [(t, p) for t in TARGETS for p in PARTS if (t, p) != ("sm90", "v2_blockwise_128x1:NT")]


@pytest.mark.parametrize("target, part", TUNED)
def test_the_launch_times_only_its_binarys_kept_configs_at_its_layout(pretend, target, part):
    timed = pretend(target)
    (binary, layout), shape = PARTS[part], (512, 512, 256)
    fp8 = fp8_dtype(DEVICE_OF[target][1])
    chosen = _settings(binary, *_inputs(binary, shape, fp8, layout))
    remap = {"NUM_XCDS": xcd.num_xcds()}
    tiles = [{k: v for k, v in c.items() if k != "NUM_XCDS"} for c in timed]
    assert tiles == [tuning.as_dict(c) for c in gemm_configs.prune(configs.space(*DEVICE_OF[target], binary, layout),
                                                                   *shape)]
    assert len(tiles) > 1 and all(t in _kept(target, part) for t in tiles)
    assert not any(_verdict(target, part, t) for t in tiles)
    assert all(c["NUM_XCDS"] == remap["NUM_XCDS"] for c in timed)
    assert chosen == timed[-1]                       # the fake clock's fastest
    assert _settings(binary, *_inputs(binary, (500, 400, 200), fp8, layout)) == chosen   # same buckets
    assert len(timed) == len(tiles)


@pytest.mark.parametrize("binary", ("v2_rowwise", "v2_tensorwise"))
def test_on_sm90_matmul_fp8s_binary_times_a_wide_tile_the_blockwise_one_never_does(pretend, binary):
    """The rowwise and per-tensor recipes' GEMMs (v2 with scales constant along K) time 128x256
    and 256x128 tiles, whose compile of their binary has no stack frame; the blockwise recipe's
    never times a config whose blockwise compile has one."""
    timed = pretend("sm90")
    shape = (1024, 1024, 512)
    _settings(binary, *_inputs(binary, shape, torch.float8_e4m3fn))
    wide = [c for c in timed if (c["BLOCK_M"], c["BLOCK_N"]) in WIDE]
    assert wide and not any(_verdict("sm90", _part(binary), c) for c in wide)
    timed.clear()
    _settings("v2_blockwise", *_inputs("v2_blockwise", shape, torch.float8_e4m3fn))
    assert timed and not any(_verdict("sm90", _part("v2_blockwise"), c) for c in timed)


def test_on_sm90_the_weight_gradients_blockwise_launch_runs_its_one_kept_config_untimed(pretend):
    timed = pretend("sm90")
    chosen = _settings("v2_blockwise_128x1", *_inputs("v2_blockwise_128x1", (512, 512, 256), torch.float8_e4m3fn))
    assert not timed and chosen == {**_kept("sm90", _part("v2_blockwise_128x1"))[0], "NUM_XCDS": xcd.num_xcds()}


@pytest.mark.parametrize("target, part", TUNED)
def test_an_untimed_key_takes_its_binarys_prior_at_its_layout(pretend, monkeypatch, target, part):
    pretend(target)
    monkeypatch.setattr(tuning, "time_ms", lambda fn: pytest.fail("timed in frozen mode"))
    (binary, layout), shape = PARTS[part], (8192, 256, 512)
    with tuning.recording() as seen, tuning.mode("frozen"):
        chosen = _settings(binary, *_inputs(binary, shape, fp8_dtype(DEVICE_OF[target][1]), layout))
    assert chosen == {**configs.prior(*DEVICE_OF[target], *shape, binary, layout), "NUM_XCDS": xcd.num_xcds()}
    assert [how for how, _ in seen.values()] == ["untuned"]


def test_the_key_tells_layouts_formats_and_scale_kinds_apart(pretend):
    """A new layout (B row-major instead of K-contiguous: timed among what that layout keeps),
    or v2's per-row or per-tensor scales instead of its block scales (other binaries: timed
    among their own kept configs), is a new key: timed again."""
    timed = pretend("gfx942")
    def space(binary, layout="NT"):
        return len(gemm_configs.prune(configs.space("hip", "gfx942", binary, layout), 512, 512, 256))
    a, b, sa, sb = _inputs("v2_blockwise", (512, 512, 256), torch.float8_e4m3fnuz)
    _settings("v2_blockwise", a, b, sa, sb)
    assert len(timed) == space("v2_blockwise")
    _settings("v2_blockwise", a, b.contiguous(), sa, sb)
    first = space("v2_blockwise") + space("v2_blockwise", "NN")
    assert len(timed) == first
    _settings("v2_blockwise", a, b, torch.ones(()), torch.ones(()))
    assert len(timed) == first + space("v2_tensorwise")
    _settings("v2_blockwise", *_inputs("v2_rowwise", (512, 512, 256), torch.float8_e4m3fnuz))
    assert len(timed) == first + space("v2_tensorwise") + space("v2_rowwise")


# -- the operand layouts the recipes run ---------------------------------------------------------

# What each recipe's three GEMMs (forward, dgrad, wgrad) run, as (binary, layout): the per-tensor
# recipes' backward reads views of the forward's x8 and w8 (dgrad B = w8, N-contiguous; wgrad
# A = dy8.t()), the rowwise recipe's reads transposed copies (all K-contiguous), the blockwise
# recipe's dgrad reads w8 itself (N-contiguous) and its wgrad the transposed copies.
RECIPE_LAUNCHES = {
    "tensorwise": {("v2_tensorwise", "NT"), ("v2_tensorwise", "NN"), ("v2_tensorwise", "TN")},
    "delayed": {("v2_tensorwise", "NT"), ("v2_tensorwise", "NN"), ("v2_tensorwise", "TN")},
    "rowwise": {("v2_rowwise", "NT")},
    "blockwise": {("v2_blockwise", "NT"), ("v2_blockwise", "NN"), ("v2_blockwise_128x1", "NT")},
}


@pytest.mark.parametrize("recipe", RECIPE_LAUNCHES)
def test_the_table_has_verdicts_at_every_layout_a_recipe_runs(recipe):
    ran = {(binary, layout) for binary, layout, *_ in recipe_launches(recipe)}
    assert ran == RECIPE_LAUNCHES[recipe]
    assert all(configs.part(*launched) in tuning.shipped(configs.TABLE)[target] for launched in ran
               for target in TARGETS)


# What plain calls run beyond the recipes' launches: v1 (no recipe's) and v2 with per-row and
# per-column scales (the rowwise binary) at NT, NN (row-major operands: the harness's default
# layout, its benchmark's) and TN (A transposed; with NT's B, the layout of the harness's "col", TT).
CALL_LAUNCHES = {("v1", "NT"), ("v1", "NN"), ("v1", "TN"), ("v2_rowwise", "NN"), ("v2_rowwise", "TN")}
# make_inputs' layouts (the harness's correctness checks run "row" and "col", its benchmark "row",
# the FP8 GPU report "NT") and the operand layout a call of them runs
HARNESS_LAYOUTS = {"row": "NN", "col": "TT", "NT": "NT"}


def test_every_part_is_a_layout_some_recipe_or_plain_call_runs():
    """The parts are the recipes' launches and plain calls' (:data:`CALL_LAUNCHES`), no more."""
    assert set().union(*RECIPE_LAUNCHES.values()) | CALL_LAUNCHES == set(PARTS.values())


def _harness_part(binary: str, layout: str) -> tuple[str, str]:
    """(binary, operand layout) of ``binary``'s launch of the harness's inputs at ``make_inputs``'
    ``layout``, read from its tuning key, on the interpreter."""
    with tuning.recording() as seen:
        _settings(binary, *SPEC.make_inputs((64, 48, 96), torch.float8_e4m3fn, seed=1,
                                            granularity=LAUNCHES[binary][1], layout=layout))
    key, = [json.loads(text) for _, text in seen]
    return part_of(key)


@pytest.mark.parametrize("binary", ["v1", "v2_rowwise", "v2_tensorwise"])
def test_a_harness_layout_is_compiled_or_each_operand_lies_as_in_a_compiled_one(binary):
    """What the harness's checks and benchmark run (v1; v2 per channel and per tensor) is compiled
    (NN, NT) or is TT, whose A lies as TN's and B as NT's: the premise of :func:`configs.space`'s
    intersection for a layout not compiled."""
    compiled = BINARIES[binary].layouts
    for layout, letters in HARNESS_LAYOUTS.items():
        assert _harness_part(binary, layout) == (binary, letters)
        assert letters in compiled or (any(c[0] == letters[0] for c in compiled) and
                                       any(c[1] == letters[1] for c in compiled)), (binary, letters)
    assert {"NN", "NT"} <= set(compiled)


@pytest.mark.parametrize("binary", ["v1", "v2_rowwise"])
def test_on_gfx942_a_harness_default_launch_never_times_a_config_that_spills_at_its_layout(pretend, binary):
    """The harness's inputs at ``make_inputs``' default layout ("row": its checks' and its
    benchmark's, and a plain call's of row-major operands) run v1 and, with per-channel scales,
    the rowwise binary at NN, where configs NT keeps spill on gfx942: compiled at NN, the launch
    times among what NN keeps, none of them."""
    timed = pretend("gfx942")
    shape, part = (512, 512, 256), _part(binary, "NN")
    with tuning.recording() as seen:
        _settings(binary, *SPEC.make_inputs(shape, torch.float8_e4m3fnuz, seed=1, granularity=LAUNCHES[binary][1]))
    key, = [json.loads(text) for _, text in seen]
    assert binary in key and "NN" in key
    forward = [tuning.as_dict(c) for c in gemm_configs.prune(configs.space("hip", "gfx942", binary), *shape)]
    assert any((_verdict("gfx942", part, c) or "").startswith("spills") for c in forward)
    tiles = [{k: v for k, v in c.items() if k != "NUM_XCDS"} for c in timed]
    assert tiles == [tuning.as_dict(c) for c in gemm_configs.prune(configs.space("hip", "gfx942", binary, "NN"),
                                                                   *shape)]
    assert tiles and not any(_verdict("gfx942", part, t) for t in tiles)


@pytest.mark.parametrize("part", ["v2_blockwise:NN", "v2_tensorwise:NN", "v2_tensorwise:TN"])
def test_on_gfx942_a_backward_layout_never_times_a_config_that_spills_there(pretend, part):
    """On gfx942 some configs the forward's layout (NT) keeps spill at the backward's: a launch
    at that layout times among what its own layout keeps, none of them."""
    timed = pretend("gfx942")
    (binary, layout), shape = PARTS[part], (512, 512, 256)
    forward = [tuning.as_dict(c) for c in gemm_configs.prune(configs.space("hip", "gfx942", binary), *shape)]
    assert any(_verdict("gfx942", part, c) for c in forward)   # what it timed when it took NT's verdicts
    _settings(binary, *_inputs(binary, shape, torch.float8_e4m3fnuz, layout))
    assert timed and not any(_verdict("gfx942", part, c) for c in timed)


def test_a_layout_nothing_compiled_tunes_among_what_every_compiled_layout_keeps(pretend):
    """"TT" (the harness's "col", no recipe's) takes, for v1 and the rowwise and tensorwise
    binaries, the configs NT, NN and TN all keep; the blockwise ones, compiled at fewer, take
    what theirs all keep."""
    timed = pretend("gfx942")
    shape = (512, 512, 256)
    _settings("v2_tensorwise", *_inputs("v2_tensorwise", shape, torch.float8_e4m3fnuz, "TT"))
    tiles = [{k: v for k, v in c.items() if k != "NUM_XCDS"} for c in timed]
    assert tiles == [tuning.as_dict(c) for c in gemm_configs.prune(configs.space("hip", "gfx942", "v2_tensorwise",
                                                                                 "TT"), *shape)]
    for binary in BINARIES:
        everywhere = [c for c in _kept("gfx942", _part(binary))
                      if all(c in _kept("gfx942", _part(binary, layout)) for layout in BINARIES[binary].layouts)]
        assert [tuning.as_dict(c) for c in configs.space("hip", "gfx942", binary, "TT")] == everywhere
        if binary == "v2_tensorwise":
            assert tiles and all(t in everywhere for t in tiles)
    assert all(configs.space(*DEVICE_OF[target], binary, layout) for target in TARGETS for binary in BINARIES
               for layout in ("NN", "NT", "TN", "TT"))   # never nothing to run


# -- the XCD remap, run on the interpreter ---------------------------------------------------

@pytest.mark.parametrize("xcds", ("8", "3"))
@pytest.mark.parametrize("rung", ("v1", "v2"))
def test_xcd_remap_writes_every_tile_once(monkeypatch, rung, xcds):
    """NUM_XCDS forced (``KERNELS_NUM_XCDS``) on tile counts that are not multiples of it: C is
    poisoned with NaN, so a tile the remap skipped (or mapped twice, leaving another unwritten)
    fails the comparison. The launch is seen taking the count."""
    monkeypatch.setenv(xcd.ENV_VAR, xcds)
    kernel, seen = KERNELS[rung], []
    real, at = kernel.run, kernel.arg_names.index("NUM_XCDS")   # launch plans pass it by position
    monkeypatch.setattr(kernel, "run", lambda *args, **kw: seen.append(args[at]) or real(*args, **kw))
    function = kernels.get("gemm_fp8", rung)
    for shape in ((96, 80, 40), (65, 33, 150), (160, 100, 70)):   # 3x3, 3x2, 5x4 tiles of 32
        inputs = _inputs(configs.binary(rung, True), shape, torch.float8_e4m3fn)
        with poisoned_outputs():
            out = function(*inputs)
        baseline = kernels.registry.reference_rung("gemm_fp8")(*inputs, out_dtype=torch.bfloat16)
        fields = compare(out, SPEC.reference(*inputs), baseline, torch.bfloat16)
        assert fields["passed"], (shape, fields)
    assert seen == [int(xcds)] * 3


def test_v1_on_hopper_runs_the_wgmma_its_docstring_names():
    """v1's sm90 prior is 128x256x128, 8 warps (v2's blockwise binary, which needs a stack frame
    there, keeps its own): m64n256k32, 194 registers, no stack frame."""
    report = isa.inspect("gemm_fp8", "v1", "sm90")
    assert set(report.matrix_instructions) == {"wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3"}
    assert configs.prior("cuda", "sm_90", 8192, 8192, 8192, "v1")["BLOCK_N"] == 256
    assert (report.vgprs, report.scratch_bytes) == (194, 0)


def test_v0_runs_the_blockwise_binarys_prior_which_fits_it_on_hopper():
    """v0 is not tuned and its fp16-upcast binary is not in the table: it runs the prior of the
    binary heaviest in registers, 128x128x128 on sm90, with no stack frame; at v1's sm90 prior
    (128x256x128) it would need one."""
    assert launch.aot_config("cuda", "sm_90", False, launch.V0_PRIOR) == \
        configs.prior("cuda", "sm_90", 8192, 8192, 8192, "v2_blockwise")
    report = isa.inspect("gemm_fp8", "v0", "sm90")
    assert (report.options["num_warps"], report.scratch_bytes) == (8, 0)
    assert set(report.matrix_instructions) == {"wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16"}
    assert isa.inspect("gemm_fp8", "v0", "sm90", overrides={"BLOCK_N": 256}).scratch_bytes > 0


@pytest.mark.parametrize("rung", ["v1", "v2"])
def test_the_model_predicts_each_tuned_rungs_candidates(rung):
    """The tuners' ranker (:class:`workbench.model.tuning.ModelRanker`) has a prediction for
    every candidate of both tuned rungs, so a key of either times a shortlist, not the space."""
    from workbench.model import tuning as tuning_model

    shape = (8192, 8192, 8192)
    cands = [tuning.as_dict(c) for c in configs.prune(configs.space("hip", "gfx942", configs.binary(rung, True)),
                                                        *shape)][:2]
    problem = tuning.Problem("gemm_fp8", rung, shape, torch.float8_e4m3fnuz)
    seconds = tuning_model.ModelRanker(gpu="MI300X").predictions(problem, cands)
    assert seconds is not None and len(seconds) == 2 and all(s > 0 for s in seconds)


@pytest.mark.parametrize("binary, layout", [("v2_rowwise", "NT"), ("v2_tensorwise", "NT"), ("v2_tensorwise", "TN"),
                                            ("v2_blockwise", "NN")])
def test_the_ranker_predicts_the_binary_the_launch_runs_at_its_layout(pretend, monkeypatch, binary, layout):
    """A v2 launch names its binary and operand layout in the Problem it hands the ranker
    (``kernel``), and the model compiles that binary's launch at that layout for each
    candidate, not the blockwise one at NT that v2's forward is predicted as."""
    from workbench.model import predict_launch
    from workbench.model import tuning as tuning_model

    pretend("gfx942")
    asked, part = [], configs.part(binary, layout)
    before = tuning.set_ranker(lambda problem, cands: asked.append(problem))
    try:
        _settings(binary, *_inputs(binary, (512, 512, 256), torch.float8_e4m3fnuz, layout))
    finally:
        tuning.set_ranker(before)
    assert asked == [tuning.Problem("gemm_fp8", "v2", (512, 512, 256), torch.float8_e4m3fnuz, part)]
    compiled, inspect = [], isa.inspect
    monkeypatch.setattr(isa, "inspect", lambda *args, **kw: compiled.append(kw["overrides"]) or inspect(*args, **kw))
    shape = (8192, 8192, 8192)
    cands = [tuning.as_dict(c) for c in configs.prune(configs.space("hip", "gfx942", binary, layout), *shape)][:2]
    problem = tuning.Problem("gemm_fp8", "v2", shape, torch.float8_e4m3fnuz, part)
    tuning_model.predicted_seconds.cache_clear()
    assert tuning_model.ModelRanker(gpu="MI300X").predictions(problem, cands) is not None
    assert compiled == [{**c, "binary": binary, "layout": layout} for c in cands]
    prior = predict_launch("gemm_fp8", "v2", part, shape, "fp8")
    assert prior.inputs["config"][0] == {**configs.prior("hip", "gfx942", *shape, binary, layout), "NUM_XCDS": 8}
    assert compiled[-1] == {**configs.prior("hip", "gfx942", *shape, binary, layout), "binary": binary,
                            "layout": layout}
