"""A rung's notebook page: idea, code, correctness, ISA, and where numbers come from."""
from __future__ import annotations


import kernels
from workbench import results
from workbench.views.rung import view_rung


def test_first_rung_shows_its_source_and_the_simt_isa_note():
    view = view_rung("gemm", 0, (9, 7, 5))
    assert "def _gemm_naive_kernel" in str(view.code) and not view.code.diff
    assert view.isa_summary is None and "SIMT Numba kernel" in view.isa_note
    assert view.passed and {r.dtype for r in view.checks} == {"float32", "float16"}


def test_the_page_shows_the_docstring_once_and_each_heading_on_its_own_line():
    """The first rung's code is its source without the docstring above it; with no ISA
    table, the ISA note must not run into the Performance heading."""
    page = view_rung("gemm", 0, (9, 7, 5))._repr_html_()
    assert page.count("Idea:") == 1 and page.count("Why faster:") == 1
    assert "<p><b>Performance</b></p>" in page and "</i><b>" not in page


def test_simt_rung_page_says_why_it_has_no_isa_instead_of_an_empty_table():
    page = view_rung("gemm", 0, (9, 7, 5))._repr_html_()
    isa_part = page[page.index("<b>ISA</b>"):page.index("<p><b>Performance</b>")]
    assert "no ISA for v0" in isa_part and "the inspector compiles Triton only" in isa_part
    assert "(no rows)" not in isa_part and "<table" not in isa_part


def test_triton_rung_shows_its_diff_and_mfma_summary():
    view = view_rung("gemm", 2, (9, 7, 5))
    assert view.code.diff and str(view.code).startswith("--- kernels.gemm.v1_simt_lds_tiled.py")
    assert "v_mfma" in view.isa_summary["matrix instructions"]
    assert "gfx942" in view.isa_note and view.passed
    assert len(view.checks) == 2 * len(kernels.get("gemm", 2).dtypes)  # row- and column-major


def test_without_results_it_says_none_were_measured_or_recorded(monkeypatch, tmp_path):
    monkeypatch.setattr(results, "_recorded_dir", lambda: tmp_path)
    view = view_rung("gemm", 2, (4, 4, 4))
    assert view.recorded == [] and "No GPU result for this rung yet" in str(view)
    assert "`workbench bench gemm` on a GPU" in str(view)


def test_the_no_results_note_names_the_rungs_own_op(monkeypatch, tmp_path):
    monkeypatch.setattr(results, "_recorded_dir", lambda: tmp_path)
    text = str(view_rung("grouped_gemm", 0, (5, 8, 4, 2, 1)))
    assert "`workbench bench grouped_gemm` on a GPU" in text and "bench gemm`" not in text


def test_recorded_results_are_labelled_with_gpu_and_date(monkeypatch, tmp_path, make_row):
    results.save([make_row(rung="v2"), make_row(rung="v3")], tmp_path / "mi300x.json")
    monkeypatch.setattr(results, "_recorded_dir", lambda: tmp_path)
    view = view_rung("gemm", 2, (4, 4, 4), gpu="MI300X")
    assert [r.rung for r in view.recorded] == ["v2"]
    html = view._repr_html_()
    assert "Recorded on a GPU (not measured here)" in html and "AMD Instinct MI300X" in html
    assert "2026-11-30" in html
