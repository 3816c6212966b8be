"""Flash cards: the deck API, answers computed from the workbench, the widget hides them.

The interview deck's correct options are checked against sources other than the card's
own code where there is one: the ISA report, the spec, ``torch.finfo``, the cost model.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from kernels.comm.cost_model import ALGORITHMS

pytest.importorskip("ipywidgets", reason="the notebook extra is not installed (e.g. on a bare GPU image)")
pytest.importorskip("altair", reason="the notebook extra is not installed (e.g. on a bare GPU image)")

import roofline
from workbench.comm import model as comm_model
from workbench import isa
from workbench.learn.flashcards import Card, Deck
from workbench.learn.interview import deck
from workbench.learn.interview.evidence import lanes, matrix_instructions, tuning_rows
from workbench.widgets import FlashCards

pytestmark = pytest.mark.timeout(300)


def _toy(claims=lambda: {"right": True, "wrong": False}) -> Deck:
    return Deck("toy", (Card("sum", "What is `1 + 1`?", lambda: "Two: `2`.",
                             lambda: ["<table><tr><td>2</td></tr></table>"], claims, "arithmetic"),
                        Card("open", "Say why.", lambda: "Because.", lambda: [], None, "reasons")))


@pytest.fixture(scope="module")
def interview():
    return deck()


def test_card_choose_reveal_and_bad_input():
    toy = _toy()
    card = toy.card(0)
    assert sorted(card.options) == ["right", "wrong"] and card.correct_option == "right"
    assert card.choose("right").correct and not card.choose("wrong").correct
    assert str(card.choose("wrong")) == "incorrect: the answer is 'right'"
    revealed = card.reveal()
    assert revealed.answer == "Two: `2`." and "<code>2</code>" in revealed.html()
    assert card.reveal() is revealed                      # computed once
    with pytest.raises(ValueError, match="option must be one of"):
        card.choose("maybe")
    with pytest.raises(ValueError, match="open question"):
        toy.card(1).choose("x")
    assert toy.card(1).options == []
    with pytest.raises(IndexError, match="index must be an int in 0..1"):
        toy.card(2)


def test_a_card_whose_evidence_bears_out_two_options_says_so():
    card = _toy(lambda: {"a": True, "b": True}).card(0)
    with pytest.raises(RuntimeError, match="exactly one option"):
        card.options


def test_static_render_folds_every_answer(interview):
    page = interview.static_html()
    assert page.count("<details>") == len(interview) and "<details open" not in page
    for card in interview:
        answer = card.reveal().html()
        before, _, folded = page.partition(answer)
        assert folded and before.rfind("<details>") > before.rfind("</details>")
        assert card.question_html().split("</b>")[1][:40] in before    # the question is outside
    assert not re.search(r"VBox\(|Chart\(", page)


def test_widget_hides_the_answer_until_pressed():
    cards = FlashCards(_toy())
    assert not cards.answer_shown and "What is <code>1 + 1</code>?" in cards.question.value
    assert cards.check("wrong").correct is False and "incorrect" in cards.verdict.value
    assert not cards.answer_shown                          # checking a choice reveals nothing
    cards.answer_button.click()
    assert cards.answer_shown
    assert "Two: <code>2</code>." in cards.answer.outputs[0]["data"]["text/html"]
    cards.picker.value = 1                                 # the next card starts hidden again
    assert not cards.answer_shown and cards.choices.layout.display == "none"
    cards.show(0)
    assert not cards.answer_shown and cards.choices.value is None
    with pytest.raises(ValueError, match="choose an option"):
        cards.check()
    with pytest.raises(IndexError, match="index must be"):
        cards.show(5)
    bundle = cards._repr_mimebundle_()
    assert bundle["text/html"] == cards.deck.static_html() and "widget" in bundle["text/plain"]


def test_widget_shows_why_a_click_failed():
    cards = FlashCards(_toy())
    cards.check_button.click()                             # nothing chosen: said, not raised
    assert "failed" in cards.verdict.value and "choose an option" in cards.verdict.value
    assert not cards.answer_shown


def _correct(interview, topic: str) -> str:
    return next(card for card in interview if card.topic.startswith(topic)).correct_option


def test_cuda_to_hip_answers_come_from_compiles_that_agree_with_the_specs(interview):
    amd, nv = lanes("gfx942"), lanes("sm90")
    assert amd["lanes per wave"] == roofline.spec("MI300X").wave_size == 64
    assert nv["lanes per wave"] == roofline.spec("H200").wave_size == 32
    assert "ds_bpermute_b32" in amd["cross-lane instructions"]
    assert re.match(r"v_cmp_\w+_e64 x\d+", amd["lane-mask instructions"]), amd   # into SGPR pairs: 64 bits
    assert nv["first of them"].startswith("shfl.sync.bfly.b32") and nv["first of them"].endswith("31, -1;")
    assert _correct(interview, "CUDA to HIP: warp") == "64 lanes"
    assert _correct(interview, "CUDA to HIP: LDS") == f"{roofline.spec('MI300X').lds_kib_per_cu:g} KiB"
    lds_card = next(card for card in interview if card.topic.startswith("CUDA to HIP: LDS"))
    assert "32 banks of 4 bytes" in lds_card.reveal().answer


def test_matrix_instruction_answer_is_what_v4_compiles_to(interview):
    v4 = isa.inspect("gemm", "v4", "gfx942")
    assert _correct(interview, "CUDA to HIP: MFMA") == ", ".join(v4.matrix_instructions)
    assert _correct(interview, "CUDA to HIP: MFMA").startswith("v_mfma_")
    rdna = next(row for row in matrix_instructions() if row["target"] == "gfx1100")
    assert rdna["lanes per wave"] == 32 and rdna["matrix instructions"].startswith("v_wmma_")


def test_roofline_fp8_and_v4_answers(interview):
    assert _correct(interview, "Roofline") == f"{round(roofline.spec('MI300X').ridge('bf16'))} FLOP/byte"
    assert _correct(interview, "FP8") == f"e4m3fnuz, max {torch.finfo(torch.float8_e4m3fnuz).max:g}"
    assert "240" in _correct(interview, "FP8")
    assert _correct(interview, "Tuning story: GEMM v3 to v4").startswith("Loads a step ahead")


def test_distributed_and_tuning_answers(interview):
    times = {alg: comm_model.predict("MI300X", "all_reduce", alg, 1 << 30, alpha=10e-6)["seconds"]
             for alg in ALGORITHMS["all_reduce"]}
    assert _correct(interview, "Distributed") == min(times, key=times.get) == "two_shot"
    assert sorted(times.values())[1] - min(times.values()) == pytest.approx(12 * 10e-6)   # ring: 14 steps
    comm = next(card for card in interview if card.topic.startswith("Distributed")).reveal()
    assert comm.answer.count("model") >= 3 and "model" in comm.evidence[0]
    for op in ("gemm",):
        gfx942 = next(row for row in tuning_rows(op) if row["target"] == "gfx942")
        assert gfx942["dropped"] > 0 and gfx942["was slow when timed"] == 0
        assert _correct(interview, f"Tuning story: {op}") == max(
            (k for k in gfx942 if k not in ("target", "kept", "dropped")), key=gfx942.get)


def test_committed_notebook_keeps_every_answer_folded():
    """Notebook 90 as saved: each card's answer sits in a closed <details>, none is open."""
    path = Path(__file__).resolve().parent.parent / "notebooks" / "90_interview_prep.ipynb"
    pages = ["".join(output["data"]["text/html"]) for cell in json.loads(path.read_text())["cells"]
             for output in cell.get("outputs", []) if "text/html" in output.get("data", {})]
    folded = [page for page in pages if "<summary>Show answer</summary>" in page]
    assert sum(page.count("<summary>Show answer</summary>") for page in folded) >= 30
    for page in folded:
        assert page.count("<details>") == page.count("<summary>Show answer</summary>")
        assert "<details open" not in page


MAX_OPTION = 80   # characters: one line of a full-width radio button in JupyterLab


def test_deck_covers_the_issue_families_each_card_computes_one_right_option(interview):
    families = interview.families()
    assert len(interview) >= 30 and len(families) == 11
    assert all(len(cards) >= 2 for cards in families.values())
    for card in interview:
        assert card.options, card.topic                      # every card is multiple choice
        assert sum(card.choose(o).correct for o in card.options) == 1
        assert max(map(len, card.options)) <= MAX_OPTION, card.topic
        assert card.reveal().answer


def test_readme_counts_the_cards_and_families(interview):
    readme = " ".join((Path(__file__).resolve().parent.parent / "README.md").read_text().split())
    assert f"({len(interview)} flash cards in {len(interview.families())} families" in readme


def test_options_are_shuffled_so_the_right_position_varies(interview):
    positions = [card.options.index(card.correct_option) for card in interview]
    assert max(positions.count(p) for p in set(positions)) <= len(positions) // 2
    assert len(set(positions)) >= 3
    assert [c.options for c in deck()] == [c.options for c in interview]      # the same every run


def test_mock_interview_is_seeded_and_spans_families(interview):
    mock = interview.mock(11, seed=1)
    assert len(mock) == 11 and len({card.family for card in mock}) == 11
    assert [c.topic for c in interview.mock(11, seed=1)] == [c.topic for c in mock]
    assert [c.topic for c in interview.mock(11, seed=2)] != [c.topic for c in mock]
    assert {c.topic for c in interview.mock(len(interview), seed=3)} == {c.topic for c in interview}
    for bad in (0, len(interview) + 1, 2.0):
        with pytest.raises(ValueError, match="n must be an int in 1.."):
            interview.mock(bad)
    with pytest.raises(KeyError, match="family must be one of"):
        interview.family("knitting")
    assert len(interview.family("Occupancy arithmetic")) == 4


def test_widget_lists_the_options_once_in_full_width_radios():
    cards = FlashCards(_toy())
    assert "<li>" not in cards.question.value and "<ol" not in cards.question.value
    assert list(cards.choices.options) == cards.card.options
    assert cards.choices.layout.width == "100%"
    assert "<ol type='a'><li>" in cards.deck.static_html()      # the static copy still lists them


def test_progress_counts_seen_and_first_answers_per_family():
    cards = FlashCards(_toy())
    cards.check("wrong")
    cards.check("right")                                   # a second try does not count
    cards.show(1)
    rows = {row["family"]: row for row in cards.progress.rows()}
    assert rows["arithmetic"] == {"family": "arithmetic", "cards": 1, "seen": 1, "answered": 1,
                                  "right at first try": 0}
    assert rows["reasons"]["seen"] == 1 and rows["all"]["seen"] == 2
    assert "right at first try" in cards.progress_view.value
    with pytest.raises(ValueError, match="is not in the deck"):
        cards.progress.saw(_toy().card(0))


def test_committed_notebook_saves_every_widget_model_it_displays():
    """A reopened notebook draws widgets from the saved state: a view whose model (or a
    child's) is missing there shows "Error displaying widget: model not found"."""
    path = Path(__file__).resolve().parent.parent / "notebooks" / "90_interview_prep.ipynb"
    notebook = json.loads(path.read_text())
    state = notebook["metadata"]["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    views = [output["data"]["application/vnd.jupyter.widget-view+json"]["model_id"]
             for cell in notebook["cells"] for output in cell.get("outputs", [])
             if "application/vnd.jupyter.widget-view+json" in output.get("data", {})]
    assert views and all(view in state for view in views)
    assert set(re.findall(r"IPY_MODEL_([0-9a-f]+)", json.dumps(state))) <= set(state)
