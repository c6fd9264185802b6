"""ThoughtTrace user-simulation tasks: hand-computed rewards, episode protocol, row builders."""
from __future__ import annotations

import random

import pytest

from mimesis_lab.envs import usersim_tasks as ut
from mimesis_lab.envs.base import TASKS, TaskContext, make_episode
from mimesis_lab.envs.output_format import parse_reply
from mimesis_lab.thoughttrace import build_system_prompt

SURVEY = {"age": "25-34", "gender": "Female", "occupation": "Nurse", "frequency": "Weekly"}
SYSTEM = build_system_prompt("Write a cover letter for a nursing job",
                             "A short letter that highlights my ICU experience", SURVEY)
A0 = "Here is a draft: Dear Hiring Manager, I am writing to apply for the ICU nurse position."
A1 = "Here is a shorter version: Dear Hiring Manager, I am applying for the ICU role."
A2 = "You're welcome! Good luck with the application."


def _conv(cid: str = "c1") -> dict:
    return {
        "conversation_id": cid, "user_id": "u1", "system_prompt": SYSTEM,
        "turns": [
            {"role": "user", "content": "help me write a cover letter for a nursing job",
             "reasons": ["I am applying for an ICU job"], "reactions": []},
            {"role": "assistant", "content": A0, "reasons": [], "reactions": ["too long"]},
            {"role": "user", "content": "make it shorter please", "reasons": ["It was too long"], "reactions": []},
            {"role": "assistant", "content": A1, "reasons": [], "reactions": []},
            {"role": "user", "content": "thanks, that's good", "reasons": [], "reactions": []},
            {"role": "assistant", "content": A2, "reasons": [], "reactions": []},
        ],
    }


def _say(ep, reasoning: str, utterance: str) -> bool:
    parsed = parse_reply(f"<think>{reasoning}</think>{utterance}")
    assert parsed.ok
    return ep.observe(parsed, parsed.utterance)


def _episode(row: dict, **options):
    ctx = TaskContext(options={row["data_source"]: options} if options else {})
    return make_episode(row, ctx, random.Random(0))


# ----------------------------------------------------------------------------- registry
def test_registry_has_the_three_tasks():
    for ds, cls in ((ut.NEXT_TURN, ut.NextTurnEpisode), (ut.PERSONA, ut.PersonaEpisode), (ut.TOM, ut.TomEpisode)):
        assert TASKS[ds] is cls


# ----------------------------------------------------------------------------- next-turn realism
def test_realism_hand_computed():
    # pred 5 words, ref 6 words, 4 shared (make the budget red): F1 = 2*4/11; len = 5/6;
    # question mismatch, politeness mismatch ("please"), not assistant-like: style = 1/3
    r, c = ut.realism_score("make the budget red please", "can you make the budget red?")
    assert c == pytest.approx({"f1": 8 / 11, "length_ratio": 5 / 6, "style": 1 / 3, "assistant_like": 0.0})
    assert r == pytest.approx(0.5 * 8 / 11 + 0.25 * 5 / 6 + 0.25 / 3)
    assert r == pytest.approx(173 / 264)


def test_realism_identical_is_one():
    r, c = ut.realism_score("thanks, can you fix it?", "Thanks, can you fix it?")
    assert r == pytest.approx(1.0) and c["style"] == 1.0


def test_realism_assistant_like_is_penalised():
    # 9 vs 4 words, shared {be, budget}: F1 = 4/13, len = 4/9, style = (1 + 1 + 0)/3, then halved
    r, c = ut.realism_score("Certainly! I'd be happy to help with the budget.", "budget should be red")
    assert c["assistant_like"] == 1.0 and c["f1"] == pytest.approx(4 / 13)
    assert c["length_ratio"] == pytest.approx(4 / 9) and c["style"] == pytest.approx(2 / 3)
    assert r == pytest.approx(101 / 468)


@pytest.mark.parametrize("text,expected", [
    ("As an AI, I cannot have preferences.", True), ("Certainly! Let me fix that.", True),
    ("I'd be happy to help you.", True), ("Here is a revised version of the letter:", True),
    ("Hope that's clear. I hope this helps!", True), ("here is my draft, can you check it", False),
    ("thanks, that helps", False), ("sure, go ahead", False),
])
def test_assistant_like(text, expected):
    assert ut.is_assistant_like(text) is expected


def test_token_f1_edge_cases():
    assert ut.token_f1([], []) == (1.0, 1.0, 1.0)
    assert ut.token_f1(["a"], []) == (0.0, 0.0, 0.0)
    assert ut.token_f1(["a", "a", "b"], ["a", "c"]) == pytest.approx((2 / 5, 1 / 3, 1 / 2))
    assert ut.length_ratio(0, 0) == 1.0 and ut.length_ratio(3, 6) == 0.5
    assert ut.words("I'd LIKE it’s 2 Sections!") == ["i'd", "like", "it's", "2", "sections"]


# ----------------------------------------------------------------------------- persona consistency
NURSE = {"occupation": "Nurse", "age": "25-34"}


@pytest.mark.parametrize("text,bad", [
    ("as a software engineer I need a script for my rota", True),
    ("I'm a teacher and I need help", True),
    ("As a nurse I work night shifts", False),
    ("I work as an ICU nurse", False),
    ("I am a bit confused by this", False),
    ("for people such as a doctor or pharmacist", False),
    ("I'm 52 years old and new to this", True),
    ("I'm 30, does that matter?", False),
    ("as a 45-year-old I find this hard", True),
    ("I'm 2 weeks behind", False),
])
def test_profile_contradictions(text, bad):
    assert bool(ut.profile_contradictions(text, NURSE)) is bad


def test_profile_synonyms_and_ranges():
    assert not ut.profile_contradictions("as a developer I use python", {"occupation": "Software engineer"})
    assert not ut.profile_contradictions("I was a teacher for 30 years", {"occupation": "Retired teacher"})
    assert ut.profile_contradictions("I'm 70 years old", {"age": "18-24"})
    assert not ut.profile_contradictions("I'm 70 years old", {"age": "65+"})
    assert not ut.profile_contradictions("as a chef I work late", {})  # no occupation stated: nothing to contradict


def test_parse_system_prompt():
    info = ut.parse_system_prompt(SYSTEM)
    assert info["task"] == "Write a cover letter for a nursing job"
    assert info["expectations"].startswith("A short letter")
    assert info["profile"] == {"age": "25-34", "gender": "Female", "occupation": "Nurse", "frequency": "Weekly"}


def _pts(utt: str, prev: str = "", profile=NURSE, **kw):
    return ut.persona_turn_score(utt, task="Write a cover letter for a nursing job",
                                 expectations="A short letter that highlights my ICU experience",
                                 prev_reply=prev, profile=profile, **kw)


def test_persona_turn_score_hand_computed():
    # content words {write, cover, letter}, all in the task: on_task = min(1, 3/2) = 1
    s, c = _pts("Can you write a cover letter for me?")
    assert c == {"on_task": 1.0, "in_role": 1.0, "profile_ok": 1.0, "length_ok": 1.0} and s == 1.0
    # {love, pizza}: no overlap -> on_task 0 -> 3/4
    s, c = _pts("I love pizza")
    assert c["on_task"] == 0.0 and s == 0.75
    # {tell, letter (letters), pizza}: one overlap / min(2, 3) = 0.5
    s, c = _pts("Tell me about letters and pizza")
    assert c["on_task"] == 0.5 and s == pytest.approx(0.875)
    # the AI reply counts as on-task context
    assert _pts("what does dear hiring mean", prev=A0)[1]["on_task"] == 1.0
    # contradiction: profile says Nurse
    s, c = _pts("as a software engineer I want a cover letter")
    assert c["profile_ok"] == 0.0 and s == 0.75


def test_persona_length_bounds():
    assert _pts(" ".join(["letter"] * 120))[1]["length_ok"] == 1.0
    assert _pts(" ".join(["letter"] * 121))[1]["length_ok"] == 0.0
    assert _pts("letter")[1]["length_ok"] == 1.0
    assert _pts("...")[1]["length_ok"] == 0.0
    assert _pts(" ".join(["letter"] * 121), max_words=200)[1]["length_ok"] == 1.0


def test_persona_in_role_copy_and_assistant_phrasing():
    prev = "one two three four five six seven eight nine ten eleven twelve"
    assert _pts("cover letter: one two three four five six seven eight nine ten", prev)[1]["in_role"] == 0.0
    assert _pts("cover letter: one two three four five six seven eight nine", prev)[1]["in_role"] == 1.0
    assert _pts("cover letter: one two three four five", prev, copy_ngram=5)[1]["in_role"] == 0.0
    assert _pts("I'd be happy to write the cover letter")[1]["in_role"] == 0.0


# ----------------------------------------------------------------------------- theory of mind
REASONS = ["I wanted the budget marked red", "the report goes to the steering committee"]


def test_tom_score_hand_computed():
    # reasons' content words: budget marked red report goes steering committee (7)
    # answer's: budget red committee (3), all shared -> P = 1, R = 3/7, F1 = 6/10
    r, c = ut.tom_score("Because the budget should be red for the committee.", REASONS)
    assert c == pytest.approx({"f1": 0.6, "precision": 1.0, "recall": 3 / 7}) and r == pytest.approx(0.6)
    # {needed, budget, fixed, quickly}: 1 shared -> P = 1/4, R = 1/7, F1 = 2/11
    r, c = ut.tom_score("I needed the budget fixed quickly", REASONS)
    assert c == pytest.approx({"f1": 2 / 11, "precision": 0.25, "recall": 1 / 7})
    assert ut.tom_score("I did it because of that", REASONS)[0] == 0.0  # only stop words


# ----------------------------------------------------------------------------- builders
def test_builders_on_hand_made_conversation():
    nt = ut.build_next_turn_rows([_conv()])
    assert [r["task_id"] for r in nt] == ["c1#t1", "c1#t2"]
    assert all(r["data_source"] == ut.NEXT_TURN and r["user_id"] == "u1" and r["conversation_id"] == "c1" for r in nt)
    assert [m["role"] for m in nt[1]["context"]] == ["assistant", "user", "assistant", "user"]
    assert nt[1]["context"][0]["content"] == "help me write a cover letter for a nursing job"
    assert nt[1]["reference"] == "thanks, that's good" and nt[0]["reference"] == "make it shorter please"
    assert len(ut.build_next_turn_rows([_conv()], max_per_conversation=1)) == 1

    (pr,) = ut.build_persona_rows([_conv()])
    assert pr["task_id"] == "c1#persona" and pr["ai_replies"] == [A0, A1, A2]
    assert pr["profile"]["occupation"] == "Nurse" and len(pr["human_turns"]) == 3

    tr = ut.build_tom_rows([_conv()])
    assert [r["task_id"] for r in tr] == ["c1#tom0", "c1#tom1"]  # the third human turn has no reasons
    assert tr[1]["reasons"] == ["It was too long"] and tr[1]["context"][-1]["content"] == "make it shorter please"
    ids = [r["task_id"] for r in nt + [pr] + tr]
    assert len(ids) == len(set(ids))


def test_builders_skip_malformed_with_reasons():
    no_turns = {"conversation_id": "bad1", "user_id": "u", "system_prompt": SYSTEM}
    one_turn = _conv("short")
    one_turn["turns"] = one_turn["turns"][:2]
    starts_ai = _conv("ai_first")
    starts_ai["turns"] = starts_ai["turns"][1:]
    empty_turn = _conv("empty")
    empty_turn["turns"][2]["content"] = "  "
    convs = [_conv(), no_turns, one_turn, starts_ai, empty_turn, _conv(), {"user_id": "x"}]
    rows, skipped = ut.build_rows_with_skips("next_turn", convs)
    assert {r["conversation_id"] for r in rows} == {"c1", "ai_first"}
    reasons = dict(skipped)
    assert reasons["bad1"] == "missing turns and messages"
    assert reasons["short"] == "no human turn after the first"
    # the AI may open (a support agent's greeting): its message is the first context turn, in the user role
    opened = next(r for r in rows if r["conversation_id"] == "ai_first")
    assert opened["context"][0] == {"role": "user", "content": A0} and "ai_first" not in reasons
    ai_only = _conv("ai_only")
    ai_only["turns"] = ai_only["turns"][1:2]
    assert dict(ut.build_rows_with_skips("persona", [ai_only])[1])["ai_only"] == \
        "no user message (an AI opening alone has no target)"
    assert reasons["empty"] == "empty user turn"
    assert ("c1", "duplicate conversation_id") in skipped
    assert ("<row 6>", "missing conversation_id") in skipped
    # persona needs only one human turn
    rows, skipped = ut.build_rows_with_skips(ut.PERSONA, [one_turn, no_turns])
    assert [r["task_id"] for r in rows] == ["short#persona"] and skipped == [("bad1", "missing turns and messages")]
    no_reasons = _conv("nr")
    for t in no_reasons["turns"]:
        t["reasons"] = []
    assert ut.build_rows_with_skips("tom", [no_reasons]) == ([], [("nr", "no human turn with self-reported reasons")])
    with pytest.raises(ValueError):
        ut.build_rows_with_skips("nope", [])


def test_builders_fall_back_to_role_swapped_messages():
    conv = _conv("m1")
    turns = conv.pop("turns")
    conv["messages"] = [{"role": "system", "content": SYSTEM}] + [
        {"role": "assistant", "content": f"<think>{' '.join(t['reasons'])}</think>{t['content']}"}
        if t["role"] == "user" else {"role": "user", "content": t["content"]} for t in turns]
    conv["messages"][3]["content"] = "<think>Reaction to the last reply: meh\nIt was too long\nwork</think>shorter"
    rows = ut.build_tom_rows([conv])
    assert [r["task_id"] for r in rows] == ["m1#tom0", "m1#tom1"] and rows[0]["reasons"] == ["I am applying for an ICU job"]
    assert rows[1]["reasons"] == ["It was too long", "work"]  # reaction lines are not reasons
    assert ut.build_next_turn_rows([conv])[1]["reference"] == "thanks, that's good"


def test_load_thoughttrace_rows_roundtrip(tmp_path):
    pl = pytest.importorskip("polars")
    path = tmp_path / "split.parquet"
    pl.DataFrame([_conv("p1"), _conv("p2")]).write_parquet(path)
    convs = ut.load_thoughttrace_rows(path)
    assert [c["conversation_id"] for c in convs] == ["p1", "p2"]
    rows, skipped = ut.build_rows_with_skips("persona", convs)
    assert len(rows) == 2 and not skipped and rows[0]["ai_replies"] == [A0, A1, A2]


# ----------------------------------------------------------------------------- episode protocol
def test_next_turn_episode_protocol():
    row = ut.build_next_turn_rows([_conv()])[1]
    ep = _episode(row)
    msgs = ep.messages()
    assert msgs[0] == {"role": "system", "content": SYSTEM}
    assert [m["role"] for m in msgs[1:]] == ["assistant", "user", "assistant", "user"] and msgs[-1]["content"] == A1
    assert "<think>" not in "".join(m["content"] for m in msgs[1:])
    assert _say(ep, "it is good now", "thanks, that's good") is True and ep.done
    assert ep.public_log == [{"role": "user", "content": "thanks, that's good"}]
    assert ep.private_log == [{"role": "user", "reasoning": "it is good now", "content": "thanks, that's good"}]
    s = ep.score(judge=None)
    assert s.invalid is None and s.raw == pytest.approx(1.0) and set(s.components) == {
        "f1", "length_ratio", "style", "assistant_like"}
    with pytest.raises(RuntimeError):
        _say(ep, "x", "again")


def test_persona_episode_replays_recorded_replies():
    row = ut.build_persona_rows([_conv()])[0]
    ep = _episode(row, turn_budget=2)
    assert ep.turn_budget == 2 and ep.messages() == [{"role": "system", "content": SYSTEM}]
    assert _say(ep, "start", "can you write a cover letter for my ICU nurse job") is False
    msgs = ep.messages()
    assert [m["role"] for m in msgs] == ["system", "assistant", "user"] and msgs[2]["content"] == A0
    assert _say(ep, "too long", "make the cover letter shorter please") is True and ep.done
    assert ep.public_log == [{"role": "user", "content": "can you write a cover letter for my ICU nurse job"},
                             {"role": "assistant", "content": A0},
                             {"role": "user", "content": "make the cover letter shorter please"}]
    assert [t["reasoning"] for t in ep.private_log] == ["start", "too long"] and ep.n_sim_turns == 2
    assert all("reasoning" not in m for m in ep.public_log)
    s = ep.score(None)
    assert s.raw == pytest.approx(1.0) and s.components == {
        "on_task": 1.0, "in_role": 1.0, "profile_ok": 1.0, "length_ok": 1.0}


def test_persona_episode_opens_with_the_recorded_ai_opening():
    """A conversation the AI opens (a support agent's greeting): the greeting is the simulator's first context,
    as in its SFT data, and the replies after its turns are the ones recorded after the user's turns."""
    conv = _conv("opened")
    conv["turns"].insert(0, {"role": "assistant", "content": "Hello! How may I help you today?", "reasons": [],
                             "reactions": []})
    row = ut.build_persona_rows([conv])[0]
    assert row["opening"] == ["Hello! How may I help you today?"] and row["ai_replies"] == [A0, A1, A2]
    assert ut.build_persona_rows([_conv()])[0]["opening"] == []
    ep = _episode(row, turn_budget=2)
    assert ep.messages() == [{"role": "system", "content": SYSTEM},
                             {"role": "user", "content": "Hello! How may I help you today?"}]
    assert _say(ep, "start", "can you write a cover letter for my ICU nurse job") is False
    assert [m["content"] for m in ep.messages()[1:]] == [
        "Hello! How may I help you today?", "can you write a cover letter for my ICU nurse job", A0]
    assert ep.public_log[0] == {"role": "assistant", "content": "Hello! How may I help you today?"}


def test_persona_turn_budget_default_and_cap():
    row = ut.build_persona_rows([_conv()])[0]
    ep = _episode(row)  # default 3 == number of human turns
    utts = ["write my cover letter", "as a software engineer I want it shorter", "I love pizza"]
    done = [_say(ep, "r", u) for u in utts]
    assert done == [False, False, True] and ep.turn_budget == 3
    assert [m["content"] for m in ep.messages() if m["role"] == "user"] == [A0, A1]
    s = ep.score(None)
    # turn 1: {write, cover, letter} on task -> 1; turn 2: {software, engineer, shorter} share nothing with
    # task/expectations/A0 and contradict "Nurse" -> 0.5; turn 3: {love, pizza} off task -> 0.75
    assert s.raw == pytest.approx(0.75)
    assert s.components == pytest.approx({"on_task": 1 / 3, "in_role": 1.0, "profile_ok": 2 / 3, "length_ok": 1.0})
    assert _episode(row, turn_budget=10).turn_budget == 3


def test_tom_episode_protocol():
    row = ut.build_tom_rows([_conv()])[1]
    ep = _episode(row)
    msgs = ep.messages()
    assert [m["role"] for m in msgs] == ["system", "user"] and msgs[-1]["content"] == ut.TOM_QUESTION
    sys_text = msgs[0]["content"]
    assert "Task: Write a cover letter" in sys_text and "occupation: Nurse" in sys_text
    assert "User: make it shorter please" in sys_text and f"Assistant: {A0}" in sys_text
    assert A1 not in sys_text and "It was too long" not in sys_text  # no later turns, no answer leak
    assert _say(ep, "it was long", "It was too long for me") is True
    s = ep.score(None)
    # answer content {long}; reasons {long}: F1 = 1
    assert s.raw == pytest.approx(1.0) and s.components == pytest.approx({"f1": 1.0, "precision": 1.0, "recall": 1.0})


def test_scores_never_raise():
    row = ut.build_next_turn_rows([_conv()])[0]
    ep = _episode(row)
    assert ep.score(None).invalid == "empty_reply"
    _say(ep, "r", "shorter please")
    del ep.row["reference"]
    s = ep.score(None)
    assert s.raw is None and s.invalid == "env_error" and "KeyError" in s.detail
    tom = _episode(ut.build_tom_rows([_conv()])[0])
    _say(tom, "r", "because")
    tom.row["reasons"] = None
    assert tom.score(None).invalid == "env_error"
