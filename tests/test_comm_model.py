"""The alpha-beta model: its formulas, its fit, its 8-GPU predictions from the specs, and
the gloo measurement that feeds it."""

import numpy as np
import pytest

import roofline
from kernels.comm.cost_model import ALGORITHMS, Cost, bytes_for_efficiency, cost, crossover_bytes, fit
from kernels.comm.measure import BACKEND, fit_rows, measure
from workbench.comm.model import predict, prediction_table, send_gbps

pytestmark = pytest.mark.timeout(60)
ALPHA, BETA = 7e-6, 1 / 40e9


@pytest.mark.parametrize("p", [2, 3, 4, 8])
def test_ring_all_reduce_formula(p):
    n = 3_000_000
    t = cost("all_reduce", "ring", p, n).seconds(ALPHA, BETA)
    assert t == pytest.approx(2 * (p - 1) / p * n * BETA + 2 * (p - 1) * ALPHA)


@pytest.mark.parametrize("p", [2, 4, 8])
def test_other_formulas(p):
    n = 1 << 20
    assert cost("reduce_scatter", "ring", p, n) == Cost(p - 1, (p - 1) / p * n)
    assert cost("all_gather", "ring", p, n) == Cost(p - 1, (p - 1) / p * n)
    assert cost("all_reduce", "tree", p, n) == Cost(2 * np.log2(p), 2 * n)
    assert cost("all_reduce", "direct", p, n) == Cost(1, (p - 1) * n)
    assert cost("all_reduce", "two_shot", p, n) == Cost(2, 2 * (p - 1) / p * n)
    assert cost("all_to_all", "pairwise", p, n) == Cost(p - 1, (p - 1) / p * n)
    assert cost("all_to_all", "direct", p, n) == Cost(1, (p - 1) / p * n)


def test_tree_wins_small_ring_wins_large():
    def t(alg, n):
        return cost("all_reduce", alg, 8, n).seconds(ALPHA, BETA)
    assert t("tree", 1024) < t("ring", 1024)
    assert t("ring", 1 << 30) < t("tree", 1 << 30)


@pytest.mark.parametrize("p", [3, 4, 8])
def test_one_shot_wins_small_two_shot_large(p):
    """One-shot sends (p-1)n in 1 step, two-shot 2(p-1)/p·n in 2: they meet at p/((p-1)(p-2))·α/β."""
    n = crossover_bytes("all_reduce", "direct", "two_shot", p, ALPHA, BETA)
    assert n == pytest.approx(p / ((p - 1) * (p - 2)) * ALPHA / BETA)

    def t(alg, nbytes):
        return cost("all_reduce", alg, p, nbytes).seconds(ALPHA, BETA)
    assert t("direct", n) == pytest.approx(t("two_shot", n))
    assert t("direct", n / 2) < t("two_shot", n / 2) and t("two_shot", 2 * n) < t("direct", 2 * n)


def test_crossover_of_ring_and_tree_and_of_lines_that_never_meet():
    assert crossover_bytes("all_reduce", "ring", "tree", 8, ALPHA, BETA) == pytest.approx(32 * ALPHA / BETA)
    assert crossover_bytes("all_reduce", "tree", "ring", 8, ALPHA, BETA) == pytest.approx(32 * ALPHA / BETA)
    # same volume, fewer steps: two-shot is never slower than the ring, so no crossover
    assert crossover_bytes("all_reduce", "ring", "two_shot", 8, ALPHA, BETA) is None
    # with alpha 0 the lines meet at n = 0 only
    assert crossover_bytes("all_reduce", "direct", "two_shot", 8, 0.0, BETA) is None
    with pytest.raises(ValueError, match="beta > 0"):
        crossover_bytes("all_reduce", "ring", "tree", 8, ALPHA, 0.0)


@pytest.mark.parametrize("algorithm", ["ring", "direct"])
def test_bucket_for_an_efficiency_spends_that_share_on_bytes(algorithm):
    n = bytes_for_efficiency("all_gather", algorithm, 8, ALPHA, BETA, 0.9)
    c = cost("all_gather", algorithm, 8, n)
    assert c.volume * BETA / c.seconds(ALPHA, BETA) == pytest.approx(0.9)
    # the ring's 7 steps need 7x the bucket of the direct all-gather's one step
    if algorithm == "ring":
        assert n == pytest.approx(7 * bytes_for_efficiency("all_gather", "direct", 8, ALPHA, BETA, 0.9))
    with pytest.raises(ValueError, match="efficiency"):
        bytes_for_efficiency("all_gather", algorithm, 8, ALPHA, BETA, 1.0)
    with pytest.raises(ValueError, match="moves no bytes"):
        bytes_for_efficiency("all_gather", algorithm, 1, ALPHA, BETA, 0.9)


def test_single_rank_is_free_and_unknowns_raise():
    assert cost("all_reduce", "ring", 1, 1 << 20) == Cost(0, 0)
    with pytest.raises(ValueError, match="no 'tree' model"):
        cost("all_gather", "tree", 4, 10)
    with pytest.raises(ValueError, match="unknown collective"):
        cost("broadcast", "ring", 4, 10)


def test_fit_recovers_known_alpha_beta():
    rng = np.random.default_rng(0)
    costs = [cost(c, a, p, n) for c, algs in ALGORITHMS.items() for a in algs
             for p in (2, 3, 4) for n in (1 << 10, 1 << 14, 1 << 18, 1 << 22, 1 << 26)]
    times = [c.seconds(ALPHA, BETA) * (1 + 0.01 * rng.standard_normal()) for c in costs]
    got = fit(costs, times)
    assert got.alpha == pytest.approx(ALPHA, rel=0.03)
    assert got.beta == pytest.approx(BETA, rel=0.03)
    assert got.bandwidth_gbps == pytest.approx(40, rel=0.03)
    assert got.rel_rms < 0.02


def test_predictions_use_the_spec_fabric():
    mi300x, h200 = roofline.spec("MI300X"), roofline.spec("H200")
    assert send_gbps(mi300x) == mi300x.interconnect["total_gbps"] / 2 == 448
    assert send_gbps(h200) == h200.interconnect["total_gbps"] / 2 == 450
    assert send_gbps(mi300x, links_used=1) == mi300x.interconnect["link_gbps"] / 2
    n = 1 << 30
    row = predict("MI300X", "all_reduce", "ring", n)
    assert row["label"] == "model" and row["ranks"] == 8
    assert row["seconds"] == pytest.approx(2 * 7 / 8 * n / 448e9)
    assert "not modelled" in row["latency"]
    with_alpha = predict("H200", "all_reduce", "ring", n, alpha=5e-6)
    assert with_alpha["seconds"] == pytest.approx(2 * 7 / 8 * n / 450e9 + 14 * 5e-6)
    with pytest.raises(ValueError, match="links_used"):
        send_gbps(mi300x, links_used=8)


def test_prediction_table_covers_every_algorithm():
    rows = prediction_table([1 << 20])
    assert {r["gpu"] for r in rows} == {"MI300X", "H200 SXM"}
    assert len(rows) == 2 * sum(len(a) for a in ALGORITHMS.values())
    assert all(r["label"] == "model" for r in rows)


@pytest.mark.timeout(200)
def test_gloo_measurement_rows_are_labelled_cpu():
    pairs = [("all_reduce", "ring"), ("all_to_all", "direct"), ("all_gather", "library")]
    rows = measure(pairs, 2, [4096, 1 << 16], repeats=2, timeout=150)
    assert [(r["collective"], r["algorithm"], r["bytes"]) for r in rows] == [
        (c, a, n) for c, a in pairs for n in (4096, 1 << 16)]
    assert all(r["backend"] == BACKEND == "gloo/CPU" and r["seconds"] > 0 for r in rows)
    fitted = fit_rows(rows)
    assert np.isfinite(fitted.alpha) and np.isfinite(fitted.beta)
