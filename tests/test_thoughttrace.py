import json

import polars as pl

from mimesis_lab.config import ThoughtTraceParams
from mimesis_lab.thoughttrace import (
    build_system_prompt, format_conversation, is_alternating, think_block,
)
from stages.thoughttrace import run_thoughttrace
from tests.conftest import FIXTURES, ROOT

MALFORMED = FIXTURES / "malformed" / "thoughttrace_malformed.jsonl"

RECORD = {
    "id": "user7_task2_conversation1",
    "model_name": "gpt-4o",
    "task_summary": "Plan a weekend in Lisbon",
    "task_expectation": "A short itinerary",
    "survey_answers": [{"age": "25-34", "gender": "Female", "education": None, "occupation": "Nurse",
                        "frequency": "Daily", "purposes": ["Travel", "Writing"]}],
    "messages": [
        {"type": "user", "content": "weekend in lisbon?",
         "reasons": [{"content": "I wanted a quick plan", "label": "information_seeking"},
                     {"content": " see if it knows trams ", "label": "testing"}]},
        {"type": "assistant", "content": "Day 1: Alfama...",
         "reactions": [{"content": "too long", "label": "dissatisfied"}]},
        {"type": "user", "content": "shorter pls", "reasons": []},
        {"type": "assistant", "content": "Alfama, Belém."},
    ],
}


def test_format_conversation_hand_computed():
    msgs = format_conversation(RECORD)
    assert msgs[0]["role"] == "system"
    assert msgs[0]["content"].endswith(
        "Task: Plan a weekend in Lisbon\nExpectations: A short itinerary\n"
        "User profile: age: 25-34; gender: Female; occupation: Nurse; frequency: Daily; purposes: Travel, Writing")
    assert msgs[1:] == [
        {"role": "assistant", "content": "<think>I wanted a quick plan\nsee if it knows trams</think>weekend in lisbon?"},
        {"role": "user", "content": "Day 1: Alfama..."},
        {"role": "assistant", "content": "<think></think>shorter pls"},
        {"role": "user", "content": "Alfama, Belém."},
    ]


def test_include_reactions_puts_previous_reaction_in_think():
    msgs = format_conversation(RECORD, include_reactions=True)
    assert msgs[1]["content"].startswith("<think>I wanted")                 # no previous reply
    assert msgs[3]["content"] == "<think>Reaction to the last reply: too long</think>shorter pls"


def test_helpers():
    assert think_block(["a", "b"], ["r"]) == "Reaction to the last reply: r\na\nb"
    assert is_alternating(["user", "assistant", "user"]) == (True, None)
    assert is_alternating(["user", "user"])[1] == "messages 0 and 1 are both 'user'"
    assert is_alternating(["assistant"]) == (False, "no user message (an AI opening alone has no target)")
    assert is_alternating(["assistant", "user", "assistant"]) == (True, None)       # the AI may open
    assert build_system_prompt(None, None, None).count("\n") == 0


def _run(tmp_path, records, **kw):
    p = tmp_path / "tt.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return run_thoughttrace(ThoughtTraceParams(input=str(p), **kw))


def test_stage_matches_reference_function(in_tmp):
    for inc in (False, True):
        r = _run(in_tmp, [RECORD], include_reactions=inc)
        row = r.frame("data/processed/thoughttrace.parquet").row(0, named=True)
        assert row["messages"] == format_conversation(RECORD, inc)
        assert row["user_id"] == "user7" and row["task_id"] == "task2"
        assert row["n_target_turns"] == 2 and row["n_turns_without_reasons"] == 1
        assert row["turns"][0] == {"role": "user", "content": "weekend in lisbon?",
                                   "reasons": ["I wanted a quick plan", "see if it knows trams"], "reactions": []}
        assert row["turns"][1]["reactions"] == ["too long"]
        assert row["include_reactions"] is inc


def test_an_ai_opening_is_the_first_targets_context(in_tmp):
    """A support agent's greeting before the user's first message (as simulator RL's behaviour task replays
    it) is kept: it becomes a user-role message, and its reaction reaches the first think block."""
    rec = json.loads(json.dumps(RECORD))
    rec["id"] = "user7_task3_conversation1"
    rec["messages"].insert(0, {"type": "assistant", "content": "Hello! How may I help you today?",
                               "reactions": [{"content": "friendly", "label": "satisfied"}]})
    for inc in (False, True):
        r = _run(in_tmp, [rec], include_reactions=inc)
        assert r.rows_out == 1
        row = r.frame("data/processed/thoughttrace.parquet").row(0, named=True)
        assert row["messages"] == format_conversation(rec, inc)
        assert row["messages"][1] == {"role": "user", "content": "Hello! How may I help you today?"}
        assert row["messages"][2]["content"].startswith(
            "<think>Reaction to the last reply: friendly\nI wanted" if inc else "<think>I wanted")
        assert row["n_target_turns"] == 2


def test_malformed_thoughttrace_rows(in_tmp):
    r = run_thoughttrace(ThoughtTraceParams(input=str(MALFORMED)))
    q = r.quarantine.to_frame()
    reasons = dict(zip(q["row"].to_list(), q["reason"].to_list()))
    assert r.rows_in == 10 and r.rows_out == 1 and r.rows_in == r.rows_out + q.height
    assert reasons[2] == "non-alternating: messages 0 and 1 are both 'user'"
    assert reasons[3] == "no user message (an AI opening alone has no target)"
    assert "length >= 1 - at `$.messages`" in reasons[4]
    assert "Invalid enum value 'system' - at `$.messages[1].type`" in reasons[5]
    assert "at `$.id`" in reasons[6]
    assert reasons[7].startswith("malformed JSON")
    assert reasons[8].startswith("duplicate: id user1_task1_conversation1")
    assert "missing required field `task_summary`" in reasons[9]
    assert "at `$.survey_answers`" in reasons[10]


def test_oversize_message(in_tmp):
    rec = json.loads(json.dumps(RECORD))
    rec["messages"][1]["content"] = "x" * 101
    r = _run(in_tmp, [rec], max_message_chars=100)
    assert r.rows_out == 0
    assert r.quarantine.reason[0] == "oversize: `messages[1].content` has 101 chars > max_message_chars=100"


def test_bundled_fixture_formats_like_reference():
    path = ROOT / "data" / "raw" / "thoughttrace" / "thoughttrace.jsonl"
    recs = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    r = run_thoughttrace(ThoughtTraceParams(input=str(path)))
    out = r.frame("data/processed/thoughttrace.parquet")
    assert r.rows_in == len(recs) >= 40
    by_id = {rec["id"]: rec for rec in recs}
    for row in out.iter_rows(named=True):
        assert row["messages"] == format_conversation(by_id[row["conversation_id"]])
    ok = {rec["id"] for rec in recs if is_alternating([m["type"] for m in rec["messages"]])[0]}
    assert set(out["conversation_id"].to_list()) == ok
    assert out.filter(pl.col("n_target_turns") < 1).height == 0


def test_chunked_run_equals_single_chunk(in_tmp):
    recs = []
    for i in range(30):
        rec = json.loads(json.dumps(RECORD))
        rec["id"] = f"user{i % 5}_task{i}_conversation1"
        recs.append(rec)
    recs[17] = json.loads(json.dumps(recs[2]))               # duplicate id across chunks
    recs[25]["messages"] = recs[25]["messages"][:1] * 2      # non-alternating
    runs = []
    for chunk_mb in (64.0, 0.002):
        r = _run(in_tmp, recs, chunk_mb=chunk_mb, include_reactions=True)
        runs.append((r.frame("data/processed/thoughttrace.parquet"), r.quarantine.to_frame(), r.extra))
        r.close()
    assert runs[0][0].equals(runs[1][0]) and runs[0][1].equals(runs[1][1]) and runs[0][2] == runs[1][2]
    assert runs[0][0].height == 28
    assert sorted(runs[0][1]["row"].to_list()) == [18, 26]


def _tt(i, user="hi", reason="because", reply="sure", reaction="fine"):
    return {"id": f"user{i}_task1_conversation1", "task_summary": "s",
            "messages": [{"type": "user", "content": user, "reasons": [{"content": "ok"}, {"content": reason}]},
                         {"type": "assistant", "content": reply, "reactions": [{"content": reaction}]}]}


def test_markup_and_empty_user_messages_are_quarantined(in_tmp):
    """Chat-template tokens or think tags in a message, or in a reason (written inside the target's
    <think> block), and empty user messages are quarantined naming the field; the rest pass."""
    recs = [_tt(1), _tt(2, user=" \n "), _tt(3, user="</think>now I answer<think>"), _tt(4, reply="<|im_end|>"),
            _tt(5, reason="a </think> b"), _tt(6, reaction="<think>"), _tt(7, user="x<|endoftext|>")]
    (in_tmp / "t.jsonl").write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    for include_reactions, out in ((False, 2), (True, 1)):
        r = run_thoughttrace(ThoughtTraceParams(input="t.jsonl", include_reactions=include_reactions))
        reasons = dict(zip(r.quarantine.row, r.quarantine.reason))
        assert r.rows_in == 7 and r.rows_out == out and r.rows_in == r.rows_out + len(r.quarantine)
        assert reasons[2] == "empty human turn: `messages[0].content` (user turn) is empty or whitespace only"
        assert reasons[3] == ("markup: `messages[0].content` (user turn) contains the chat-template token or "
                              "think tag '</think>'")
        assert reasons[4].startswith("markup: `messages[1].content` (assistant turn)") and "'<|im_end|>'" in reasons[4]
        assert reasons[5] == "markup: `messages[0].reasons` contains the chat-template token or think tag '</think>'"
        assert (6 in reasons) is include_reactions
        assert "'<|endoftext|>'" in reasons[7]
        r.close()


def test_markup_clean_strips_tokens_and_counts_rows(in_tmp):
    """``markup: clean``: the tokens are stripped from messages and notes, the conversations kept and
    counted (markup_cleaned); a user message that held only markup is then empty and quarantined."""
    recs = [_tt(1), _tt(2, user="<think></think>"), _tt(3, user="</think>now I answer<think>"),
            _tt(4, reply="ok<|im_end|>"), _tt(5, reason="a </think> b"), _tt(6, reaction="<think>fine"),
            _tt(7, user="x<|endoftext|>")]
    (in_tmp / "t.jsonl").write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    r = run_thoughttrace(ThoughtTraceParams(input="t.jsonl", include_reactions=True, markup="clean"))
    assert (r.rows_in, r.rows_out) == (7, 6) and r.quarantine.row == [2]
    assert r.quarantine.reason[0].startswith("empty human turn: `messages[0].content`")
    assert r.extra["markup"] == "clean" and r.extra["markup_cleaned"] == 5
    out = {x["conversation_id"]: x for x in r.frame("data/processed/thoughttrace.parquet").to_dicts()}
    for cid, row in out.items():   # only our own think block is left in each target
        for m in row["messages"][1:]:     # after our system prompt
            assert m["content"].count("<think>") == (1 if m["role"] == "assistant" else 0), (cid, m)
            assert "<|" not in m["content"]
    assert "now I answer" in json.dumps(out["user3_task1_conversation1"]["messages"])
    r.close()


def test_invalid_utf8_inside_a_string_is_quarantined_not_a_crash(in_tmp):
    """Invalid UTF-8 inside a string of an otherwise valid file: that line is quarantined, the other rows
    are written and read back (before: a polars ComputeError when the output was read)."""
    from stages.common import write_result

    lines = [json.dumps(_tt(i)).encode() for i in range(1, 4)]
    lines[1] = lines[1].replace(b'"because"', b'"parce que \xe7a"')
    (in_tmp / "t.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    r = run_thoughttrace(ThoughtTraceParams(input="t.jsonl"))
    assert (r.rows_in, r.rows_out) == (3, 2) and r.quarantine.row == [2]
    assert r.quarantine.reason[0].startswith("invalid UTF-8") and "parce que \\xe7a" in r.quarantine.raw[0]
    m = write_result("thoughttrace", r)
    assert m["quarantine_by_reason"] == {"invalid UTF-8": 1}
    assert pl.read_parquet("data/processed/thoughttrace.parquet").height == 2
