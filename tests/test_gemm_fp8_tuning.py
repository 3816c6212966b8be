"""FP8 GEMM tuning (v1, v2): the ahead-of-time pruned table, per binary a launch runs, the
launch's choice among what its binary keeps, the prior for untimed keys, and the XCD remap of
program ids.

The shipped table (``kernels/gemm_fp8/tuned_space.json``) is checked for coverage and for its
verdicts from the numbers it stores; a sample of each binary's entries (on sm90 every kept one)
is recompiled to show the numbers are true. The tuner runs on a pretended GPU (``fake_gpu``) with
a fake clock and a launch that only notes its config, so nothing big is interpreted.
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
BINARIES = configs.BINARIES
# each binary: the rung that runs it and the scales its launch takes (spec granularity)
LAUNCHES = {"v1": ("v1", "channel"), "v2_blockwise": ("v2", "block128x128"), "v2_rowwise": ("v2", "channel"),
            "v2_tensorwise": ("v2", "tensor"), "v2_blockwise_128x1": ("v2", "block128x1")}
DEVICES = {"gfx942": ("hip", "gfx942"), "gfx950": ("hip", "gfx950"), "sm90": ("cuda", "sm_90")}
WIDE = [(128, 256), (256, 128)]


def _key(cfg: dict) -> tuple:
    return tuple(sorted(cfg.items()))


def _section(target: str, binary: str) -> dict:
    return tuning.shipped(configs.TABLE)[target][binary]


def _entries(target: str, binary: str) -> list[dict]:
    table = _section(target, binary)
    return table["kept"] + table["dropped"]


def _kept(target: str, binary: str) -> list[dict]:
    return [e["config"] for e in _section(target, binary)["kept"]]


def _entry(target: str, binary: str, cfg: dict) -> dict:
    return next(e for e in _entries(target, binary) if e["config"] == cfg)


# -- the table ---------------------------------------------------------------------------

def test_the_table_has_one_section_per_target_split_per_binary():
    """FP8 has no float32 section: each target is compiled at its own e4m3 format, as each binary."""
    assert sorted(tuning.shipped(configs.TABLE)) == sorted(TARGETS)
    assert all(sorted(part) == sorted(BINARIES) for part in tuning.shipped(configs.TABLE).values())


@pytest.mark.parametrize("binary", BINARIES)
@pytest.mark.parametrize("target", TARGETS)
def test_shipped_table_covers_exactly_the_candidates(target, binary):
    """A changed candidate list without ``python -m workbench.isa.tune_space --op gemm_fp8 --write`` fails here."""
    recorded = [_key(entry["config"]) for entry in _entries(target, binary)]
    wanted = [_key(tuning.as_dict(c)) for c in configs.candidates(target)]
    assert sorted(recorded) == sorted(wanted)


@pytest.mark.parametrize("binary", BINARIES)
@pytest.mark.parametrize("target", TARGETS)
def test_each_binary_keeps_the_configs_its_own_compile_fits(target, binary):
    """Each part holds its own binary's compile alone, judged alone: kept where it fits, dropped
    where it does not, whatever the other binaries' compiles of the config do."""
    table = _section(target, binary)
    assert all(list(tune_space.compiles(e)) == [binary] for e in table["kept"] + table["dropped"])
    assert_verdicts(target, table)
    assert not any(tune_space.narrow_lds_ops(e) for e in table["kept"] + table["dropped"])   # as clean_lds says
    assert not any(e.get("spilling") for e in table["kept"]), "every FP8 part keeps a config that fits"
    assert _kept(target, binary) == [c for c in map(tuning.as_dict, configs.candidates(target))
                                     if c in _kept(target, binary)]   # candidate order: the prior first
    tiles = {(c["BLOCK_M"], c["BLOCK_N"]) for c in _kept(target, binary)}
    if target == "sm90" and binary.startswith("v2_blockwise"):   # the fp32 partial product needs a stack frame wider
        assert tiles == {(128, 128)} and all(tune_space.verdict(target, e[binary]) for e in table["dropped"])
    else:
        assert set(WIDE) <= tiles and {c["BLOCK_K"] for c in _kept(target, binary)} == {64, 128}, tiles


def test_sm90_offers_the_wide_tiles_to_the_binaries_that_compile_clean_there():
    """128x256x128 and 256x128x128 with 8 warps: v1 and the binaries with scales constant along K (``SCALES_ALONG_K`` False, what
    ``kernels.matmul_fp8`` runs, per row and per tensor) compile them without a stack frame and
    are offered them; the blockwise binary needs one there and is not."""
    for bm, bn in WIDE:
        cfg = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=128, GROUP_M=8, num_warps=8, num_stages=3)
        for binary in ("v1", "v2_rowwise", "v2_tensorwise"):
            assert _entry("sm90", binary, cfg)[binary]["scratch_bytes"] == 0
            assert cfg in [tuning.as_dict(c) for c in configs.space("cuda", "sm_90", binary)]
        assert _entry("sm90", "v2_blockwise", cfg)["v2_blockwise"]["scratch_bytes"] > 0
        assert cfg not in [tuning.as_dict(c) for c in configs.space("cuda", "sm_90", "v2_blockwise")]


def test_per_tensor_scales_are_a_binary_of_their_own():
    """The per-tensor recipes' scales (stride 0, not folded to a constant as the rowwise recipe's
    1 is) compile to another epilogue with other verdicts: on gfx950 a config the rowwise binary
    keeps spills VGPRs in theirs; on gfx942 one the rowwise binary drops (SGPR spills) is clean."""
    def apart(target, keeps, drops):
        return [e for e in _section(target, drops)["dropped"] if e["config"] in _kept(target, keeps)]
    assert apart("gfx950", "v2_rowwise", "v2_tensorwise")
    assert all(e["v2_tensorwise"]["spills"] > 0 for e in apart("gfx950", "v2_rowwise", "v2_tensorwise"))
    assert apart("gfx942", "v2_tensorwise", "v2_rowwise")
    assert all(e["v2_rowwise"]["sgpr_spills"] > 0 for e in apart("gfx942", "v2_tensorwise", "v2_rowwise"))


def _first(target: str, binary: str, verdict: bool) -> dict | None:
    """The first candidate of ``target`` whose compile of ``binary`` fails (``verdict``) or fits."""
    return next((e for e in _entries(target, binary) if bool(tune_space.verdict(target, e[binary])) == verdict),
                None)


def _measured(target: str, binary: str, entry: dict) -> dict:
    """``entry``'s config compiled as ``binary`` at the target's e4m3 format (dtype None), the
    way the generator compiles it."""
    (rung, extra), = [(tune_space.OPS["gemm_fp8"].compile_rung(name), extra) for name, extra
                      in tune_space.OPS["gemm_fp8"].compiles(entry["config"]).items() if name == binary]
    return tune_space.measure("gemm_fp8", target, {**entry["config"], **extra}, None, rung)


# Per binary, the prior of each AMD target and its first dropped config (if any): sm90's kept
# configs are all recompiled below.
SAMPLE = [(target, binary, which) for target in ("gfx942", "gfx950") for binary in BINARIES
          for which in ("prior", "dropped")]


@pytest.mark.parametrize("target,binary,which", SAMPLE)
def test_table_entries_are_what_the_compiler_gives(target, binary, which):
    entry = (_section(target, binary)["kept"][0] if which == "prior" else _first(target, binary, verdict=True))
    if entry is None:
        pytest.skip(f"{binary} drops no config on {target}")
    assert _measured(target, binary, entry) == entry[binary]


@pytest.mark.parametrize("binary", BINARIES)
def test_every_sm90_kept_config_recompiles_to_its_figures(binary):
    """sm90's parts are small (its candidates: 16): every kept config of each binary, and the
    first dropped one, compiled again gives the figures the table stores."""
    entries = _section("sm90", binary)["kept"] + [_first("sm90", binary, verdict=True)]
    assert [_measured("sm90", binary, e) for e in entries] == [e[binary] for e in entries]


@pytest.mark.parametrize("binary", BINARIES)
@pytest.mark.parametrize("target", TARGETS)
def test_space_is_the_binarys_kept_part_of_the_table(target, binary):
    assert [tuning.as_dict(c) for c in configs.space(*DEVICES[target], binary)] == _kept(target, binary)


def test_an_unknown_binary_is_refused():
    with pytest.raises(ValueError, match="v2_rowwise"):
        configs.space("cuda", "sm_90", "v2")
    with pytest.raises(ValueError, match="v1 and v2"):
        configs.binary("v0")


AMD_PRIOR = dict(BLOCK_M=256, BLOCK_N=128, BLOCK_K=128, GROUP_M=8, matrix_instr_nonkdim=16, waves_per_eu=0,
                 num_warps=8, num_stages=2)


@pytest.mark.parametrize("binary", BINARIES)
@pytest.mark.parametrize("arch", ("gfx942", "gfx950"))
def test_the_amd_prior_is_the_config_the_rungs_ran_untuned(arch, binary):
    """Candidate order puts 256x128x128, 8 warps, 16x16 MFMAs first, and every binary keeps it: the
    ISA claims of v1 and v2 (tests/test_isa_claims.py, tests/test_gemm_fp8_blockwise.py) hold for it.
    But on gfx942 the weight gradient's blockwise binary (B's scales per 128 x 1) spills there: its
    prior is the next candidate, 4 warps."""
    prior = configs.prior("hip", arch, 8192, 8192, 8192, binary)
    if (arch, binary) == ("gfx942", "v2_blockwise_128x1"):
        assert tune_space.verdict(arch, _entry(arch, binary, AMD_PRIOR)[binary]).startswith("spills")
        assert prior == dict(AMD_PRIOR, num_warps=4)
    else:
        assert prior == AMD_PRIOR
    assert prior == _kept(arch, binary)[0]


@pytest.mark.parametrize("binary, tile", [("v1", (128, 256, 128)), ("v2_rowwise", (128, 256, 128)),
                                          ("v2_tensorwise", (128, 256, 128)), ("v2_blockwise", (128, 128, 128)),
                                          ("v2_blockwise_128x1", (128, 128, 64))])
def test_the_sm90_prior_is_each_binarys_first_kept_candidate(binary, tile):
    """Hopper's candidates put 128x256x128, 8 warps first: the prior of the binaries that keep it;
    the blockwise binary's first kept is 128x128x128, 8 warps, the weight gradient's (B's scales
    per 128 x 1) 128x128x64, its only one: at 128x128x128 it needs a stack frame too."""
    prior = configs.prior("cuda", "sm_90", 8192, 8192, 8192, binary)
    assert prior == dict(BLOCK_M=tile[0], BLOCK_N=tile[1], BLOCK_K=tile[2], GROUP_M=8, num_warps=8, num_stages=3)
    assert prior == _kept("sm90", binary)[0]
    if binary == "v2_blockwise_128x1":
        wider = _entry("sm90", binary, dict(prior, BLOCK_K=128))
        assert _measured("sm90", binary, wider)["scratch_bytes"] == wider[binary]["scratch_bytes"] > 0


def test_the_interpreter_keeps_its_small_config():
    assert all([tuning.as_dict(c) for c in configs.space("interpreter", "cpu", binary)] ==
               [tuning.as_dict(c) for c in configs.interpreter_configs()] for binary in BINARIES)


# -- the launch's choice, on a pretended GPU --------------------------------------------------

def _inputs(binary: str, shape: tuple, dtype: torch.dtype) -> tuple:
    return SPEC.make_inputs(shape, dtype, seed=1, granularity=LAUNCHES[binary][1])


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
        backend, arch = DEVICES[target]
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
TUNED = [(t, b) for t in TARGETS for b in BINARIES if (t, b) != ("sm90", "v2_blockwise_128x1")]


@pytest.mark.parametrize("target, binary", TUNED)
def test_the_launch_times_only_its_binarys_kept_configs(pretend, target, binary):
    timed = pretend(target)
    shape = (512, 512, 256)
    fp8 = fp8_dtype(DEVICES[target][1])
    chosen = _settings(binary, *_inputs(binary, shape, fp8))
    remap = {"NUM_XCDS": xcd.num_xcds()}
    tiles = [{k: v for k, v in c.items() if k != "NUM_XCDS"} for c in timed]
    assert tiles == [tuning.as_dict(c) for c in gemm_configs.prune(configs.space(*DEVICES[target], binary), *shape)]
    assert len(tiles) > 1 and all(t in _kept(target, binary) for t in tiles)
    assert not any(tune_space.verdict(target, _entry(target, binary, t)[binary]) for t in tiles)
    assert all(c["NUM_XCDS"] == remap["NUM_XCDS"] for c in timed)
    assert chosen == timed[-1]                       # the fake clock's fastest
    assert _settings(binary, *_inputs(binary, (500, 400, 200), fp8)) == chosen   # same buckets
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
    assert wide and all(_entry("sm90", binary, {k: v for k, v in c.items() if k != "NUM_XCDS"})
                        [binary]["scratch_bytes"] == 0 for c in wide)
    timed.clear()
    _settings("v2_blockwise", *_inputs("v2_blockwise", shape, torch.float8_e4m3fn))
    assert timed and all(_entry("sm90", "v2_blockwise", {k: v for k, v in c.items() if k != "NUM_XCDS"})
                         ["v2_blockwise"]["scratch_bytes"] == 0 for c in timed)


def test_on_sm90_the_weight_gradients_blockwise_launch_runs_its_one_kept_config_untimed(pretend):
    timed = pretend("sm90")
    chosen = _settings("v2_blockwise_128x1", *_inputs("v2_blockwise_128x1", (512, 512, 256), torch.float8_e4m3fn))
    assert not timed and chosen == {**_kept("sm90", "v2_blockwise_128x1")[0], "NUM_XCDS": xcd.num_xcds()}


@pytest.mark.parametrize("target, binary", TUNED)
def test_an_untimed_key_takes_its_binarys_prior(pretend, monkeypatch, target, binary):
    pretend(target)
    monkeypatch.setattr(tuning, "time_ms", lambda fn: pytest.fail("timed in frozen mode"))
    shape = (8192, 256, 512)
    with tuning.recording() as seen, tuning.mode("frozen"):
        chosen = _settings(binary, *_inputs(binary, shape, fp8_dtype(DEVICES[target][1])))
    assert chosen == {**configs.prior(*DEVICES[target], *shape, binary), "NUM_XCDS": xcd.num_xcds()}
    assert [how for how, _ in seen.values()] == ["untuned"]


def test_the_key_tells_layouts_formats_and_scale_kinds_apart(pretend):
    """A new layout (B row-major instead of K-contiguous), or v2's per-row or per-tensor scales
    instead of its block scales (other binaries: timed among their own kept configs), is a new
    key: timed again."""
    timed = pretend("gfx942")
    a, b, sa, sb = _inputs("v2_blockwise", (512, 512, 256), torch.float8_e4m3fnuz)
    _settings("v2_blockwise", a, b, sa, sb)
    first = len(timed)
    _settings("v2_blockwise", a, b.contiguous() if b.stride(1) != 1 else b.t().contiguous().t(), sa, sb)
    assert len(timed) == 2 * first
    def space(binary):
        return len(gemm_configs.prune(configs.space("hip", "gfx942", binary), 512, 512, 256))
    _settings("v2_blockwise", a, b, torch.ones(()), torch.ones(()))
    assert len(timed) == 2 * first + space("v2_tensorwise")
    _settings("v2_blockwise", *_inputs("v2_rowwise", (512, 512, 256), torch.float8_e4m3fnuz))
    assert len(timed) == 2 * first + space("v2_tensorwise") + space("v2_rowwise")


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


@pytest.mark.parametrize("binary", ("v2_rowwise", "v2_tensorwise"))
def test_the_ranker_predicts_the_binary_the_launch_runs(pretend, monkeypatch, binary):
    """A v2 launch with scales constant along K names its binary in the Problem it hands the
    ranker (``kernel``), and the model compiles that binary's launch for each candidate, not
    the blockwise one v2's forward is predicted as."""
    from workbench.model import predict_launch
    from workbench.model import tuning as tuning_model

    pretend("gfx942")
    asked = []
    before = tuning.set_ranker(lambda problem, cands: asked.append(problem))
    try:
        _settings(binary, *_inputs(binary, (512, 512, 256), torch.float8_e4m3fnuz))
    finally:
        tuning.set_ranker(before)
    assert asked == [tuning.Problem("gemm_fp8", "v2", (512, 512, 256), torch.float8_e4m3fnuz, binary)]
    compiled, inspect = [], isa.inspect
    monkeypatch.setattr(isa, "inspect", lambda *args, **kw: compiled.append(kw["overrides"]) or inspect(*args, **kw))
    shape = (8192, 8192, 8192)
    cands = [tuning.as_dict(c) for c in configs.prune(configs.space("hip", "gfx942", binary), *shape)][:2]
    problem = tuning.Problem("gemm_fp8", "v2", shape, torch.float8_e4m3fnuz, binary)
    tuning_model.predicted_seconds.cache_clear()
    assert tuning_model.ModelRanker(gpu="MI300X").predictions(problem, cands) is not None
    assert compiled == [{**c, "binary": binary} for c in cands]
    prior = predict_launch("gemm_fp8", "v2", binary, shape, "fp8")
    assert prior.inputs["config"][0] == {**configs.prior("hip", "gfx942", *shape, binary), "NUM_XCDS": 8}
    assert compiled[-1]["binary"] == binary
