"""FP8 GEMM tuning (v1, v2): the ahead-of-time pruned table, the launch's choice among what it
keeps, the prior for untimed keys, and the XCD remap of program ids.

The shipped table (``kernels/gemm_fp8/tuned_space.json``) is checked for coverage and for its
verdicts from the numbers it stores; a sample is recompiled to show the numbers are true. The
tuner runs on a pretended gfx942 / gfx950 (``fake_gpu``) with a fake clock and a launch that
only notes its config, so nothing big is interpreted.
"""
from __future__ import annotations

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

from table_sections import TARGETS, assert_verdicts

SPEC = kernels.spec("gemm_fp8")
KERNELS = {"v1": v1._gemm_fp8_kernel, "v2": v2._gemm_fp8_blockwise_kernel}


def _key(cfg: dict) -> tuple:
    return tuple(sorted(cfg.items()))


def _entries(target: str) -> list[dict]:
    table = tuning.shipped(configs.TABLE)[target]
    return table["kept"] + table["dropped"]


def _kept(target: str) -> list[dict]:
    return [e["config"] for e in tuning.shipped(configs.TABLE)[target]["kept"]]


# -- the table ---------------------------------------------------------------------------

def test_the_table_has_one_section_per_target():
    """FP8 has no float32 section: each target is compiled at its own e4m3 format."""
    assert sorted(tuning.shipped(configs.TABLE)) == sorted(TARGETS)


@pytest.mark.parametrize("target", TARGETS)
def test_shipped_table_covers_exactly_the_candidates(target):
    """A changed candidate list without ``python -m workbench.isa.tune_space --op gemm_fp8 --write`` fails here."""
    recorded = [_key(entry["config"]) for entry in _entries(target)]
    wanted = [_key(tuning.as_dict(c)) for c in configs.candidates(target)]
    assert sorted(recorded) == sorted(wanted)


@pytest.mark.parametrize("target", TARGETS)
def test_kept_configs_fit_both_rungs_and_dropped_ones_do_not(target):
    table = tuning.shipped(configs.TABLE)[target]
    assert all(list(tune_space.compiles(e)) == ["v1", "v2"] for e in table["kept"] + table["dropped"])
    assert_verdicts(target, table)
    assert not any(tune_space.narrow_lds_ops(e) for e in table["kept"] + table["dropped"])   # as clean_lds says
    assert not any(e.get("spilling") for e in table["kept"]), "every FP8 section keeps a config that fits"
    tiles = {(c["BLOCK_M"], c["BLOCK_N"]) for c in _kept(target)}
    assert {c["BLOCK_K"] for c in _kept(target)} == {64, 128}
    if target == "sm90":   # v2's fp32 partial product per K step needs a stack frame at larger tiles
        assert tiles == {(128, 128)} and all(tune_space.verdict(target, e["v2"]) for e in table["dropped"])
    else:
        assert len(tiles) > 1, tiles


def _first(target: str, rung: str, verdict: bool) -> dict:
    """The first candidate of ``target`` whose ``rung`` compile fails (``verdict``) or fits."""
    return next(e for e in _entries(target)
                if bool(tune_space.verdict(target, e[rung])) == verdict)


# (target, rung, which entry): the prior of each target, and a dropped config of each AMD target
SAMPLE = [("gfx942", "v1", "prior"), ("gfx942", "v2", "dropped"), ("gfx950", "v2", "prior"),
          ("gfx950", "v2", "dropped"), ("sm90", "v1", "prior")]


@pytest.mark.parametrize("target,rung,which", SAMPLE)
def test_table_entries_are_what_the_compiler_gives(target, rung, which):
    """Compiled at the target's e4m3 format (dtype None: the rung's own on the target)."""
    entry = (next(e for e in _entries(target) if e["config"] == _kept(target)[0]) if which == "prior"
             else _first(target, rung, verdict=True))
    assert tune_space.measure("gemm_fp8", target, entry["config"], None, rung) == entry[rung]


@pytest.mark.parametrize("backend,arch,target", [("hip", "gfx942", "gfx942"), ("hip", "gfx950", "gfx950"),
                                                 ("cuda", "sm_90", "sm90")])
def test_space_is_the_kept_part_of_the_table(backend, arch, target):
    assert [tuning.as_dict(c) for c in configs.space(backend, arch)] == _kept(target)


@pytest.mark.parametrize("arch", ("gfx942", "gfx950"))
def test_the_amd_prior_is_the_config_the_rungs_ran_untuned(arch):
    """Candidate order puts 256x128x128, 8 warps, 16x16 MFMAs first, and the table keeps it: the
    ISA claims of v1 and v2 (tests/test_isa_claims.py, tests/test_gemm_fp8_blockwise.py) hold for it."""
    prior = configs.prior("hip", arch, 8192, 8192, 8192)
    assert prior == dict(BLOCK_M=256, BLOCK_N=128, BLOCK_K=128, GROUP_M=8, matrix_instr_nonkdim=16,
                         waves_per_eu=0, num_warps=8, num_stages=2)
    assert prior == _kept(arch)[0]


def test_the_interpreter_keeps_its_small_config():
    assert [tuning.as_dict(c) for c in configs.space("interpreter", "cpu")] == \
        [tuning.as_dict(c) for c in configs.interpreter_configs()]


# -- the launch's choice, on a pretended AMD GPU ---------------------------------------------

def _inputs(rung: str, shape: tuple, dtype: torch.dtype) -> tuple:
    granularity = "block128x128" if rung == "v2" else "channel"
    return SPEC.make_inputs(shape, dtype, seed=1, granularity=granularity)


def _settings(rung: str, a, b, sa, sb) -> dict:
    """What the rung's launch runs for these operands (nothing is launched: ``_run`` is a stub)."""
    if rung == "v2":
        return launch.plan_blockwise(KERNELS[rung], a, b, sa, sb, torch.bfloat16).config
    strides = operands.check(a, b, sa, sb, torch.bfloat16)
    return launch.settings(rung, KERNELS[rung], a, b, sa, sb, torch.bfloat16, strides, {})


@pytest.fixture
def pretend(fake_gpu, monkeypatch):
    """A pretended AMD GPU; the tuner's launches only note their config, and the fake clock
    makes the last candidate timed the fastest. Returns the configs timed."""
    def install(arch: str) -> list[dict]:
        fake_gpu("hip", arch, "AMD Instinct MI300X")
        launched, timed = [], []
        monkeypatch.setattr(launch, "_run", lambda *args: launched.append(args[-1]))

        def time_ms(fn):
            fn()
            timed.append(launched[-1])
            return 100.0 - len(timed)
        monkeypatch.setattr(tuning, "time_ms", time_ms)
        return timed
    return install


@pytest.mark.parametrize("rung", ("v1", "v2"))
@pytest.mark.parametrize("arch", ("gfx942", "gfx950"))
def test_the_launch_times_only_the_tables_kept_configs(pretend, arch, rung):
    timed = pretend(arch)
    shape = (512, 512, 256)
    inputs = _inputs(rung, shape, fp8_dtype(arch))
    chosen = _settings(rung, *inputs)
    remap = {"NUM_XCDS": xcd.num_xcds()}
    tiles = [{k: v for k, v in c.items() if k != "NUM_XCDS"} for c in timed]
    assert tiles == [tuning.as_dict(c) for c in gemm_configs.prune(configs.space("hip", arch), *shape)]
    assert len(tiles) > 1 and all(t in _kept(arch) for t in tiles)
    assert all(c["NUM_XCDS"] == remap["NUM_XCDS"] for c in timed)
    assert chosen == timed[-1]                       # the fake clock's fastest
    assert _settings(rung, *_inputs(rung, (500, 400, 200), fp8_dtype(arch))) == chosen   # same buckets
    assert len(timed) == len(tiles)


@pytest.mark.parametrize("rung", ("v1", "v2"))
@pytest.mark.parametrize("arch", ("gfx942", "gfx950"))
def test_an_untimed_key_takes_the_prior(pretend, monkeypatch, arch, rung):
    pretend(arch)
    monkeypatch.setattr(tuning, "time_ms", lambda fn: pytest.fail("timed in frozen mode"))
    shape = (8192, 256, 512)
    with tuning.recording() as seen, tuning.mode("frozen"):
        chosen = _settings(rung, *_inputs(rung, shape, fp8_dtype(arch)))
    assert chosen == {**configs.prior("hip", arch, *shape), "NUM_XCDS": xcd.num_xcds()}
    assert [how for how, _ in seen.values()] == ["untuned"]


def test_the_key_tells_layouts_formats_and_scale_kinds_apart(pretend):
    """A new layout (B row-major instead of K-contiguous), or v2's per-tensor scales instead of
    its block scales (another loop), is a new key: timed again."""
    timed = pretend("gfx942")
    a, b, sa, sb = _inputs("v2", (512, 512, 256), torch.float8_e4m3fnuz)
    _settings("v2", a, b, sa, sb)
    first = len(timed)
    _settings("v2", a, b.contiguous() if b.stride(1) != 1 else b.t().contiguous().t(), sa, sb)
    assert len(timed) == 2 * first
    _settings("v2", a, b, torch.ones(()), torch.ones(()))
    assert len(timed) == 3 * first


# -- the XCD remap, run on the interpreter ---------------------------------------------------

@pytest.mark.parametrize("xcds", ("8", "3"))
@pytest.mark.parametrize("rung", ("v1", "v2"))
def test_xcd_remap_writes_every_tile_once(monkeypatch, rung, xcds):
    """NUM_XCDS forced (``KERNELS_NUM_XCDS``) on tile counts that are not multiples of it: C is
    poisoned with NaN, so a tile the remap skipped (or mapped twice, leaving another unwritten)
    fails the comparison. The launch is seen taking the count."""
    monkeypatch.setenv(xcd.ENV_VAR, xcds)
    kernel, seen = KERNELS[rung], []
    real = kernel.run
    monkeypatch.setattr(kernel, "run", lambda *args, **kw: seen.append(kw["NUM_XCDS"]) or real(*args, **kw))
    function = kernels.get("gemm_fp8", rung)
    for shape in ((96, 80, 40), (65, 33, 150), (160, 100, 70)):   # 3x3, 3x2, 5x4 tiles of 32
        inputs = _inputs(rung, shape, torch.float8_e4m3fn)
        with poisoned_outputs():
            out = function(*inputs)
        baseline = kernels.registry.reference_rung("gemm_fp8")(*inputs, out_dtype=torch.bfloat16)
        fields = compare(out, SPEC.reference(*inputs), baseline, torch.bfloat16)
        assert fields["passed"], (shape, fields)
    assert seen == [int(xcds)] * 3


def test_v1_on_hopper_runs_the_wgmma_its_docstring_names():
    """sm90's prior is 128x128x128 (every wider tile needs a stack frame in v2): m64n128k32."""
    report = isa.inspect("gemm_fp8", "v1", "sm90")
    assert set(report.matrix_instructions) == {"wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3"}
    assert configs.prior("cuda", "sm_90", 8192, 8192, 8192)["BLOCK_N"] == 128 and not report.scratch_bytes


@pytest.mark.parametrize("rung", ["v1", "v2"])
def test_the_model_predicts_each_tuned_rungs_candidates(rung):
    """The tuners' ranker (:class:`workbench.model.tuning.ModelRanker`) has a prediction for
    every candidate of both tuned rungs, so a key of either times a shortlist, not the space."""
    from workbench.model import tuning as tuning_model

    shape = (8192, 8192, 8192)
    cands = [tuning.as_dict(c) for c in configs.prune(configs.space("hip", "gfx942"), *shape)][:2]
    problem = tuning.Problem("gemm_fp8", rung, shape, torch.float8_e4m3fnuz)
    seconds = tuning_model.ModelRanker(gpu="MI300X").predictions(problem, cands)
    assert seconds is not None and len(seconds) == 2 and all(s > 0 for s in seconds)
