"""tau-USI per-conversation user statistics (D1–D4) on hand-written conversations, values computed by hand."""
from __future__ import annotations

import pytest

from mimesis_lab.evals.user_stats import (
    DIMENSION_FEATURES, FEATURES, conversation_stats, first_disclosure, mean_stats, reaction_turns, task_facts,
    usi_dimensions, user_turns,
)

SYSTEM = ("You are a real human user.\nTask: Shorten a paper abstract\nExpectations: Under 150 words\n"
          "User profile: age: 35-44; occupation: Researcher")

CONV = [
    {"role": "user", "content": "Hi, please shorten my abstract to 150 words!"},            # 8 words
    {"role": "assistant", "content": "Here it is."},
    {"role": "user", "content": "What do you mean by hype? You missed the word limit."},   # 11 words
    {"role": "assistant", "content": "Sorry, fixed."},
    {"role": "user", "content": "Obviously wrong again"},                                   # 3 words
]


def test_task_facts_are_content_stems_of_task_and_expectations():
    # "a" and "under" are stop words; "words" loses its plural s
    assert task_facts(SYSTEM) == ["shorten", "paper", "abstract", "150", "word"]


def test_turn_selection():
    assert user_turns(CONV) == [CONV[0]["content"], CONV[2]["content"], CONV[4]["content"]]
    assert reaction_turns(CONV) == [CONV[2]["content"], CONV[4]["content"]]
    assert reaction_turns([{"role": "user", "content": "x"}]) == []


def test_hand_computed_features():
    s = conversation_stats(CONV, task_facts(SYSTEM))
    assert set(s) == set(FEATURES)
    # D1 over the 3 user turns
    assert s["words_per_turn"] == pytest.approx(22 / 3)
    assert s["politeness_rate"] == pytest.approx(1 / 3)          # "please" (the assistant's "Sorry" is not counted)
    assert s["exclamation_rate"] == pytest.approx(1 / 3)
    assert s["question_rate"] == pytest.approx(1 / 3)
    # D2: shorten, abstract, 150, word stated in turn 0; paper never -> 4/5, position (0+1)/3
    assert s["disclosure_share"] == pytest.approx(0.8)
    assert s["disclosure_position"] == pytest.approx(1 / 3)
    # D3 / D4 over the 2 user turns that follow an assistant turn
    assert s["clarification_rate"] == pytest.approx(0.5)         # "what do you mean"
    assert s["followup_question_rate"] == pytest.approx(0.5)
    assert s["correction_rate"] == pytest.approx(1.0)            # "you missed", "wrong"
    assert s["complaint_rate"] == pytest.approx(0.5)             # "obviously"


def test_late_disclosure_and_undefined_values():
    conv = [{"role": "user", "content": "hello there"}, {"role": "assistant", "content": "hi"},
            {"role": "user", "content": "the paper abstract please"}]
    first = first_disclosure(user_turns(conv), ["paper", "abstract", "shorten"])
    assert first == {"paper": 1, "abstract": 1, "shorten": None}
    s = conversation_stats(conv, ["paper", "abstract", "shorten"])
    assert s["disclosure_share"] == pytest.approx(2 / 3)
    assert s["disclosure_position"] == pytest.approx(1.0)         # (1+1)/2 for both stated facts
    none = conversation_stats(conv[:1], ["shorten"])              # one user turn, no reaction, nothing stated
    assert none["clarification_rate"] is None and none["correction_rate"] is None
    assert none["disclosure_share"] == 0.0 and none["disclosure_position"] is None
    assert conversation_stats(conv)["disclosure_share"] is None   # no facts -> undefined, not 0


def test_mean_stats_skips_undefined_values():
    a = {f: None for f in FEATURES} | {"words_per_turn": 4.0}
    b = {f: None for f in FEATURES} | {"words_per_turn": 2.0, "correction_rate": 0.5}
    m = mean_stats([a, b])
    assert m["words_per_turn"] == 3.0 and m["correction_rate"] == 0.5 and m["complaint_rate"] is None


def test_usi_dimensions_identical_is_100_and_dice_per_feature():
    s = conversation_stats(CONV, task_facts(SYSTEM))
    dims, dropped = usi_dimensions([s], [s])
    assert dims == {d: pytest.approx(100.0) for d in DIMENSION_FEATURES}
    assert all(not v for v in dropped.values())
    # D4 by hand: correction 1.0 vs 0.5 -> 100*2*0.5/1.5; complaint 0.5 vs 0.5 -> 100
    sim = dict(s, correction_rate=0.5)
    dims, _ = usi_dimensions([sim], [s])
    assert dims["d4"] == pytest.approx((100 * 2 * 0.5 / 1.5 + 100) / 2)
    assert dims["d1"] == pytest.approx(100.0)


def test_usi_dimension_without_a_defined_feature_is_none():
    s = conversation_stats(CONV[:1], [])
    dims, dropped = usi_dimensions([s], [s])
    assert dims["d3"] is None and dims["d4"] is None and dims["d2"] is None
    assert dropped["d3"] == ["clarification_rate", "followup_question_rate"]
    assert dims["d1"] == pytest.approx(100.0)
