"""A failed check names where its bad elements lie and, from the error's pattern, the likely
bug: each pattern on a deliberately broken GEMM (a function, or a real Triton kernel with
one mistake), and none on a result that is merely noisy."""
from __future__ import annotations

import pytest
import torch

from kernels.outputs import new_output
from kernels.registry import Rung
from workbench import exercises
from workbench.check import check_rung
from workbench.harness.error_pattern import finding, likely_cause
from workbench.learn.exercises import learner, source

SHAPE = (37, 29, 53)   # M, N, K: C is 37 x 29, nothing square or a multiple of a block


def _broken(fn) -> Rung:
    return Rung(op="gemm", rung=99, name=fn.__name__, fn=fn, backends=frozenset({"interpreter", "hip", "cuda"}),
                dtypes=(torch.float32,), interpreter=True, kind="library", module=__name__)


def _finding(fn, shape=SHAPE) -> str:
    report = check_rung(_broken(fn), shape, torch.float32)
    assert not report.passed and report.finding in report.message
    return report.finding


def without_the_last_k_slice(a, b):          # what `k < K - 1` as the K mask computes
    return a[:, :-1] @ b[:-1]


def with_the_first_k_slice_twice(a, b):
    return a @ b + a[:, :1] @ b[:1]


def without_b_scale(a, b):                    # s_b per output column, forgotten
    return a @ b / torch.linspace(0.5, 2.0, b.shape[1])


def without_a_scale(a, b):
    return a @ b / torch.linspace(0.5, 2.0, a.shape[0])[:, None]


def without_a_global_scale(a, b):             # as a forgotten softmax scale 1/sqrt(64) would
    return a @ b * 8.0


def stored_column_major(a, b):
    return (a @ b).T.contiguous().view(a.shape[0], b.shape[1])


def last_tile_rows_not_written(a, b):
    c = new_output((a.shape[0], b.shape[1]), a.dtype, a.device)
    c[:32] = (a @ b)[:32]                      # a grid of one 32-row tile: rows 32.. keep the poison
    return c


def noisy(a, b):                              # 100x the fp32 rounding, and nothing else wrong
    c = a @ b
    return c + 2e-5 * c.abs().max() * torch.randn(c.shape, generator=torch.Generator().manual_seed(0))


def accumulated_in_fp16(a, b):
    return (a.half() @ b.half()).float()


def test_a_missing_last_k_slice_is_named_with_its_index():
    cause = _finding(without_the_last_k_slice)
    assert cause.startswith("where: all 37 rows x all 29 columns; likely cause: ")
    assert "the error is -1 x a[:, 52] * b[52, :]: the last of K = 53 slices of the reduction is " \
           "missing: an off-by-one K mask" in cause


def test_a_k_slice_counted_twice_is_named_too():
    assert "+1 x a[:, 0] * b[0, :]: the first of K = 53 slices of the reduction is counted twice" \
        in _finding(with_the_first_k_slice_twice)


def test_per_column_per_row_and_global_factors():
    assert ("each column is off by its own factor (out/ref from 0.5 to 2 across columns): a "
            "per-column scale missing") in _finding(without_b_scale)
    assert ("each row is off by its own factor (out/ref from 0.5 to 2 across rows): a per-row scale "
            "missing") in _finding(without_a_scale)
    assert "every element is 8 x the reference (1/0.125): a global factor missing or extra" in \
        _finding(without_a_global_scale)


@pytest.mark.parametrize("shape", [SHAPE, (3, 2, 5)])
def test_an_all_zero_output_is_named_not_a_crash(shape):
    """Zero is a global factor too; the diagnosis divided by it (the long fuzz profile met it:
    an attention gradient under a scale that is 0 in float32). The small shape takes the
    one-factor path, the large one the per-row and per-column fit."""
    assert "every element is 0: nothing accumulated or stored" in _finding(
        lambda a, b: torch.zeros(a.shape[0], b.shape[1]), shape)


@pytest.mark.parametrize("shape", [SHAPE, (16, 16, 8)])
def test_a_transposed_store(shape):
    assert "the output is the reference in column-major order (transposed)" in _finding(stored_column_major, shape)


def test_untouched_poison_names_its_block():
    assert _finding(last_tile_rows_not_written) == (
        "where: rows 32-36 x all 29 columns, every element there; likely cause: 145 elements are NaN "
        "where the reference is finite: the output's NaN poison, never written (a tile the grid does "
        "not cover, or a store mask that drops it), or a NaN the kernel computed")


@pytest.mark.parametrize("fn", [noisy, accumulated_in_fp16])
def test_noise_gets_a_place_but_no_cause(fn):
    assert _finding(fn) == "where: all 37 rows x all 29 columns"


def test_a_pass_has_no_finding():
    report = check_rung(_broken(lambda a, b: a @ b), SHAPE, torch.float32)
    assert report.passed and report.finding == ""
    ref = torch.randn(8, 8, dtype=torch.float64)
    assert finding(ref.float(), ref, torch.zeros(8, 8, dtype=torch.bool)) == ""


def _learners_rung(module: str, block: str, *edits, tmp_path):
    path = tmp_path / "attempt.py"
    path.write_text(source.render(module, source.variant(module, block, *edits)))
    return learner.import_file(path, None)[1][0]


def test_a_triton_kernel_with_an_off_by_one_k_mask(tmp_path):
    rung = _learners_rung("kernels.gemm.v2_triton_tile", "masks",
                          ("ks[None, :] + k0 < K", "ks[None, :] + k0 < K - 1"), tmp_path=tmp_path)
    report = check_rung(rung, SHAPE, torch.float32)
    assert "a[:, 52] * b[52, :]: the last of K = 53 slices of the reduction is missing" in report.message


@pytest.mark.parametrize("mistake, seed, cause", [
    ("B's scale forgotten", 0, "every element is"),               # even seeds: per-tensor scales
    ("B's scale forgotten", 1, "each column is off by its own factor"),   # odd: per-channel
    ("scales divided out instead of multiplied", 1,
     "each element is off by a row factor times a column factor"),
])
def test_fp8_scale_mistakes_in_the_kernel(mistake, seed, cause, tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_PROGRESS", str(tmp_path / "progress.json"))
    exercise = exercises.get("gemm_fp8/v0")
    path = tmp_path / "gemm_fp8_v0.py"
    path.write_text(source.render(exercise.module, exercise.wrong[mistake]))
    rung = learner.import_file(path, exercise.op)[1][0]
    report = check_rung(rung, exercise.shapes[0], exercise.dtypes[0], seed=seed)
    assert f"likely cause: {cause}" in report.message
    if seed == 0:   # the exercise's own verdict (its first seed) carries the same finding
        assert report.finding in exercises.check(exercise.key, path=path).message


def test_the_heat_map_shows_the_finding_the_command_line_prints():
    pytest.importorskip("altair", reason="the notebook extra is not installed (e.g. on a bare GPU image)")
    from workbench.views.heatmap import error_heatmap

    report = check_rung(_broken(without_b_scale), SHAPE, torch.float32)
    subtitle = error_heatmap(report).to_dict()["title"]["subtitle"]
    assert report.finding.split("; ") == subtitle[-2:]


def test_a_rank_one_error_without_gemm_inputs_is_still_named_and_one_bad_element_is_not():
    gen = torch.Generator().manual_seed(1)
    a = torch.randn(37, 53, generator=gen, dtype=torch.float64)
    b = torch.randn(53, 29, generator=gen, dtype=torch.float64)
    ref = a @ b
    assert likely_cause(a[:, :-1] @ b[:-1], ref).startswith("the error is one outer product (rank 1)")
    assert "a[:, 52] * b[52, :]: the last of K = 53 slices of the reduction is weighted 0.5 instead of 1" in \
        likely_cause(ref - 0.5 * torch.outer(a[:, -1], b[-1]), ref, (a, b))
    one_off = ref.clone()
    one_off[3, 4] += 10.0
    assert likely_cause(one_off, ref, (a, b)) == ""
