"""A ranker orders a tuned key's candidates: only its shortlist is timed, and a key that
cannot be timed takes its best instead of the prior (``kernels.tuning.set_ranker``).

The fake op's candidates carry their own "milliseconds", which the tuner's fake clock
returns (conftest's ``clock``). These are synthetic timings: no GPU has timed
these candidates. The last test ranks GEMM v6's real gfx942 candidates with the real
performance model (``workbench.model.tuning``); its "measured" clock is the model's own
prediction with a seeded error on top, so it shows the mechanism (the shortlist keeps
the fastest while the model's error stays within the spread it times), not that the
model orders a real GPU's candidates right: that needs GPU timings, which do not exist here.
"""
from __future__ import annotations

import random

import pytest
import torch

import kernels
from kernels import tuning
from kernels.gemm import configs as gemm_configs
from workbench.model import tuning as tuning_model

OP, KEY = "test/op", (64, 128, torch.bfloat16)
SPACE = [{"BLOCK_M": 32, "ms": 3.0}, {"BLOCK_M": 16, "ms": 1.0}, {"BLOCK_M": 64, "ms": 2.0},
         {"BLOCK_M": 128, "ms": 4.0}]
PROBLEM = tuning.Problem("gemm", "v6", (64, 128, 32), torch.bfloat16)


@pytest.fixture
def ranker():
    """Install a ranker answering from a list the test sets (``asked`` records its calls)."""
    asked, answer = [], {"order": None}

    def rank(problem, candidates):
        asked.append((problem, [c["BLOCK_M"] for c in candidates]))
        return answer["order"]
    before = tuning.set_ranker(rank)
    yield answer, asked
    tuning.set_ranker(before)


OTHER_KEY = (32, 128, torch.bfloat16)   # a key nothing chose yet, neither here nor on disk


def _choose(problem=PROBLEM, key=KEY):
    return tuning.choice(OP, key, lambda: SPACE, lambda cfg: cfg["ms"], problem and (lambda: problem))


def test_without_a_ranker_every_candidate_is_timed_and_an_untimed_key_takes_the_first(clock):
    assert tuning.set_ranker(None) is None
    with tuning.recording() as seen:
        assert _choose() == SPACE[1] and clock == [3.0, 1.0, 2.0, 4.0]
    assert list(seen.values()) == [("timed", SPACE[1])]
    with tuning.mode("frozen"), tuning.recording() as seen:
        assert _choose(key=OTHER_KEY) == SPACE[0]
    assert list(seen.values()) == [("untuned", SPACE[0])]


def test_only_the_shortlist_is_timed_and_its_fastest_kept(clock, ranker):
    answer, asked = ranker
    answer["order"] = [2, 1]                     # the ranker's best two, best first
    with tuning.recording() as seen:
        assert _choose() == SPACE[1]
    assert clock == [2.0, 1.0] and asked == [(PROBLEM, [32, 16, 64, 128])]
    assert list(seen.values()) == [("timed", SPACE[1])]
    assert _choose() == SPACE[1] and len(asked) == 1 and len(clock) == 2   # kept: neither asked nor timed again


def test_a_shortlist_that_misses_the_fastest_loses_it(clock, ranker):
    """What the shortlist costs when the ranker is wrong: the fastest is never timed."""
    ranker[0]["order"] = [0, 2]
    assert _choose() == SPACE[2] and clock == [3.0, 2.0]


@pytest.mark.parametrize("untimed", ["frozen", "capture"])
def test_an_untimed_key_takes_the_rankers_best_once(clock, ranker, monkeypatch, untimed):
    answer, asked = ranker
    answer["order"] = [3, 0]
    if untimed == "capture":
        monkeypatch.setattr(tuning, "_capturing", lambda: True)
    with tuning.mode("frozen" if untimed == "frozen" else "time"), tuning.recording() as seen:
        assert _choose() == SPACE[3] and _choose() == SPACE[3]
    assert clock == [] and len(asked) == 1       # asked once, then kept for the process
    assert list(seen.values()) == [("predicted", SPACE[3])]
    assert tuning._memo == {}                    # not a timed choice: the tuning pass still times the key
    monkeypatch.setattr(tuning, "_capturing", lambda: False)
    assert _choose() == SPACE[0] and clock == [4.0, 3.0]   # then the pass times the shortlist


def test_a_shortlist_of_one_is_taken_untimed_and_not_saved(clock, ranker):
    from kernels import tuning_cache

    ranker[0]["order"] = [2]
    with tuning.recording() as seen:
        assert _choose() == SPACE[2]
    assert clock == [] and list(seen.values()) == [("predicted", SPACE[2])]
    assert tuning_cache.store().get(OP, tuning_cache.key_text(KEY)) is None


def test_a_ranker_that_cannot_tell_leaves_the_prior(clock, ranker):
    assert _choose() == SPACE[1] and clock == [3.0, 1.0, 2.0, 4.0]   # order None: all timed
    with tuning.mode("frozen"), tuning.recording() as seen:
        assert _choose(key=OTHER_KEY) == SPACE[0]
    assert list(seen.values()) == [("untuned", SPACE[0])]


def test_a_launch_without_a_problem_is_not_ranked(clock, ranker):
    ranker[0]["order"] = [2]
    assert _choose(problem=None) == SPACE[1] and ranker[1] == []


@pytest.mark.parametrize("order", [[], [0, 0], [4], [-1]])
def test_a_malformed_shortlist_is_an_error(ranker, order):
    ranker[0]["order"] = order
    with pytest.raises(ValueError, match="distinct candidate indices below 4"):
        _choose()


def test_the_model_ranker_keeps_candidates_within_its_spread(monkeypatch):
    seconds = {16: 1.0, 32: 1.2, 64: 1.3, 128: 1.1, 256: 0.9}
    ranker = tuning_model.ModelRanker(gpu="MI300X", spread=1.25, most=3)
    monkeypatch.setattr(ranker, "predictions", lambda problem, cands: [seconds[c["BLOCK_M"]] for c in cands])
    cands = [{"BLOCK_M": m} for m in (16, 32, 64, 128, 256)]
    assert ranker(PROBLEM, cands) == [4, 0, 3]   # 0.9, 1.0, 1.1: within 1.25x of 0.9
    narrow = tuning_model.ModelRanker(gpu="MI300X", spread=1.15, most=4)
    monkeypatch.setattr(narrow, "predictions", ranker.predictions)
    assert narrow(PROBLEM, cands) == [4, 0]
    few = tuning_model.ModelRanker(gpu="MI300X", spread=2.0, most=2)
    monkeypatch.setattr(few, "predictions", ranker.predictions)
    assert few(PROBLEM, cands) == [4, 0]
    with pytest.raises(ValueError, match="spread must be >= 1"):
        tuning_model.ModelRanker(spread=0.9)


def test_the_shortlist_takes_each_tile_shapes_best_before_any_shapes_second(monkeypatch):
    """Four variants of one tile predicted within a percent would fill the shortlist; each
    other tile shape within the spread is timed first, then the first tile's next variants."""
    cands = [{"BLOCK_M": 256, "BLOCK_N": 128, "waves_per_eu": w, "kpack": p} for w in (0, 2) for p in (1, 2)]
    cands += [{"BLOCK_M": 128, "BLOCK_N": 128, "waves_per_eu": 2, "kpack": 2},
              {"BLOCK_M": 128, "BLOCK_N": 256, "waves_per_eu": 2, "kpack": 2},
              {"BLOCK_M": 64, "BLOCK_N": 64, "waves_per_eu": 2, "kpack": 2}]
    seconds = [1.000, 1.001, 1.002, 1.003, 1.010, 1.020, 1.5]
    ranker = tuning_model.ModelRanker(gpu="MI300X", spread=1.25, most=4)
    monkeypatch.setattr(ranker, "predictions", lambda problem, c: seconds)
    assert ranker(PROBLEM, cands) == [0, 4, 5, 1]   # 64x64 is outside the spread
    assert ranker(PROBLEM, cands[:4]) == [0, 1, 2, 3]   # one tile: best first, as before


def test_the_model_ranker_does_not_rank_on_the_interpreter_or_what_the_model_lacks():
    """None, the prior, without compiling anything: no GPU here and none named; a GPU the
    model does not cover (MI250X, gfx90a); a rung with no candidates to pin (GEMM v4)."""
    two = [{"BLOCK_M": 16}, {"BLOCK_M": 32}]
    assert kernels.backend.current().is_interpreter
    assert tuning_model.ModelRanker()(PROBLEM, two) is None
    assert tuning_model.ModelRanker(gpu="MI250X")(PROBLEM, two) is None
    untuned = tuning.Problem("gemm", "v4", (64, 128, 32), torch.bfloat16)
    assert tuning_model.ModelRanker(gpu="MI300X")(untuned, two) is None


def test_gpu_here_knows_a_device_name_roofline_lacks_by_target_and_units(fake_gpu, monkeypatch):
    backend = fake_gpu("hip", "gfx942", "AMD Instinct MI300X VF")
    monkeypatch.setattr(kernels.backend, "current", lambda: type(backend)("hip", "gfx942", backend.device_name, 304))
    assert tuning_model.gpu_here() == "MI300X"
    monkeypatch.setattr(kernels.backend, "current", lambda: type(backend)("hip", "gfx942", "mystery", 100))
    assert tuning_model.gpu_here() is None


@pytest.mark.slow
def test_on_gemm_v6s_gfx942_candidates_the_timed_set_shrinks_and_keeps_the_fastest(clock):
    """The real model ranks v6's pruned gfx942 candidates for a decode GEMM (6 of them: the
    smallest space, so the compiles stay few); the synthetic "measured" times are the
    model's predictions times a seeded error of up to +-10 % each."""
    shape = (16, 14336, 4096)
    cands = [tuning.as_dict(c) for c in gemm_configs.prune(gemm_configs.space("hip", "gfx942"), *shape)]
    problem = tuning.Problem("gemm", "v6", shape, torch.bfloat16)
    ranker = tuning_model.ModelRanker(gpu="MI300X")
    predicted = ranker.predictions(problem, cands)
    assert predicted is not None and len(cands) == 6
    rng = random.Random(0)
    measured = [p * 1e3 * rng.uniform(0.9, 1.1) for p in predicted]
    ms = {tuple(sorted(cfg.items())): t for cfg, t in zip(cands, measured)}
    with tuning_model.ranking(ranker), tuning.recording() as seen:
        chosen = tuning.choice("gemm/v6", (16, 16384, 4096, torch.bfloat16, "NN"), lambda: cands,
                               lambda cfg: ms[tuple(sorted(cfg.items()))], lambda: problem)
    assert 1 < len(clock) < len(cands)                    # timed fewer, and more than one
    assert ms[tuple(sorted(chosen.items()))] == min(measured)   # the fastest of all was among them
    assert list(seen.values()) == [("timed", chosen)]


def test_the_model_ranker_predicts_the_launch_a_problem_names(monkeypatch):
    """A rung that tunes several launches names one in ``Problem.kernel``; the ranker asks
    the model about that launch (:func:`workbench.model.predict_launch`), not the pass."""
    asked = []

    def predict_config(op, rung, shape, dtype, gpu, config, kernel=None):
        asked.append((op, rung, shape, kernel))
        return type("P", (), {"time_s": config["BLOCK_M"] * 1e-6})()
    monkeypatch.setattr(tuning_model, "predict_config", predict_config)
    problem = tuning.Problem("grouped_gemm", "v4", (4096, 7, 9, 3, 0), torch.bfloat16, "dw")
    assert tuning_model.ModelRanker(gpu="MI300X")(problem, [{"BLOCK_M": 64}, {"BLOCK_M": 16}]) == [1]
    assert asked == [("grouped_gemm", "v4", (4096, 7, 9, 3, 0), "dw")] * 2
