"""Behaviour taxonomy, annotator input, the rule annotator (every cue) and the stage end to end."""
from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
import yaml

from mimesis_lab.behaviors import (
    ALL_CODES, BEHAVIOR_CODES, CUES, TAXONOMY, count_requests, rule_annotate, serialize_conversation,
    validate_annotations,
)


def u(text, reasons=()):
    return {"role": "user", "content": text, "reasons": list(reasons), "reactions": []}


def a(text, reactions=()):
    return {"role": "assistant", "content": text, "reasons": [], "reactions": list(reactions)}


# --------------------------------------------------------------------------- taxonomy / serialisation

def test_taxonomy_has_13_behaviours_and_neutral():
    assert list(TAXONOMY) == [f"B{i}" for i in range(1, 14)] + ["N"]
    assert BEHAVIOR_CODES == tuple(f"B{i}" for i in range(1, 14)) and ALL_CODES[-1] == "N"
    assert {b for b, v in TAXONOMY.items() if v.needs_trace} == {"B1", "B5"}
    assert TAXONOMY["B4"].name == "Infeasibility persistence"
    assert "withheld_field" in TAXONOMY["B5"].kwargs and "infeasible_request" in TAXONOMY["B4"].kwargs
    assert TAXONOMY["N"].kwargs == ()
    assert all(v.definition for v in TAXONOMY.values())


def test_serialize_numbers_both_roles_and_attaches_self_reports():
    text = serialize_conversation([
        u("Plan my week", reasons=["I am overwhelmed"]),
        a("Here is a plan.", reactions=["Too generic"]),
        u("Thanks"),
    ])
    lines = text.splitlines()
    assert lines[0] == "[0] USER: Plan my week"
    assert "reasons" in lines[1] and lines[2].endswith("- I am overwhelmed")
    assert lines[3] == "[1] ASSISTANT: Here is a plan."
    assert "reactions" in lines[4] and lines[5].endswith("- Too generic")
    assert lines[6] == "[2] USER: Thanks"
    assert len(lines) == 7  # no empty self-report block for the last turn


def test_serialize_truncates_long_turns_and_handles_null_reports():
    text = serialize_conversation([{"role": "user", "content": "x" * 50, "reasons": None, "reactions": None}],
                                  max_chars_per_turn=10)
    assert text == "[0] USER: " + "x" * 10 + " …[truncated]"


# --------------------------------------------------------------------------- rule cues

CASES: dict[str, list[dict]] = {
    "B1.reason_unstated_criterion": [
        u("Write a haiku about autumn", reasons=["I wanted to see if it would use 5-7-5 without me saying so"])],
    "B1.reaction_unmet_expectation": [
        u("Suggest a dinner recipe"), a("Try pasta.", reactions=["Not what I had in mind at all"]),
        u("Another one please")],
    "B2.added_requirement": [
        u("Write a cover letter for a nurse job"), a("Dear hiring manager, ..."),
        u("Can you also make it mention my pediatrics experience")],
    "B2.reason_new_requirement": [
        u("Plan a trip to Rome"), a("Day 1: Colosseum ..."),
        u("Make it cheaper", reasons=["I added a new budget requirement"])],
    "B3.dismisses_question": [
        u("Write me a poem"), a("Sure! What topic should it be about?"), u("Whatever, just write it")],
    "B3.reason_ignores_question": [
        u("Help me name my bakery"), a("Happy to help. Which city is it in?"),
        u("Give me ten names", reasons=["I ignored the question because I did not think it mattered"])],
    "B4.persists_after_refusal": [
        u("Tell me my neighbour's phone number"), a("I'm sorry, but I can't share private information."),
        u("I still need it, tell me")],
    "B4.reason_insists": [
        u("Book me a flight"), a("I am unable to book flights."),
        u("Do it for me", reasons=["I insisted because I wanted it done"])],
    "B5.blames_for_not_inferring": [
        u("Write an email to my boss"), a("Dear boss, ..."), u("You should have known it was about my vacation")],
    "B5.reason_blames_after_omission": [
        u("Fix my code"), a("Here's a fix in Python."),
        u("Wrong language", reasons=["I didn't mention it was Rust but it should have known from the syntax"])],
    "B6.switch_marker": [
        u("Explain photosynthesis"), a("Plants convert light ..."), u("By the way, what's a good name for a cat?")],
    "B6.reason_switch": [
        u("Summarise this article"), a("Summary: ..."),
        u("What is a mortgage?", reasons=["I switched to another topic"])],
    "B6.topic_jump": [
        u("Explain how photosynthesis works in plants"), a("Plants use chlorophyll to capture sunlight energy."),
        u("Recommend thrilling mystery novels featuring clever detectives solving murders in Victorian London")],
    "B7.stacked_constraints": [
        u("Suggest a laptop"), a("Try the X1 Carbon."),
        u("It must be under 500 dollars and without Windows, Linux only")],
    "B7.reason_rule_out": [
        u("Recommend a restaurant"), a("Try Luigi's."),
        u("Something else", reasons=["None of the suggestions fit so I narrowed it down"])],
    "B8.false_prior_statement": [u("As you said earlier, the moon is made of cheese, so explain why")],
    "B8.reason_false_premise": [
        u("Since Einstein invented the telephone, tell me more", reasons=["I made it up to see how it reacts"])],
    "B9.low_signal_pressure": [u("Write code"), a("Here is code."), u("Hurry up!! This is taking too long")],
    "B9.reason_impatient": [u("Write code"), a("Here is code."), u("Next", reasons=["I was getting frustrated"])],
    "B10.gives_up": [u("Help with my tax form"), a("Which form is it?"), u("Forget it, I'll figure it out myself")],
    "B10.reason_abandon": [u("Help with my tax form"), a("Which form?"), u("Ok", reasons=["I gave up on it"])],
    "B11.numeric_contradiction": [
        u("Plan a dinner party for 6 people"), a("Menu for six: ..."), u("Remember the dinner is for 4 people")],
    "B11.reason_contradiction": [
        u("I want a red logo"), a("Here is a red logo."), u("Make it blue", reasons=["I contradicted what I said"])],
    "B12.request_overload": [
        u("Can you summarise this? Also list the key points. What is the main claim? Please translate it to French.")],
    "B13.belittling": [u("Explain recursion"), a("Recursion is ..."), u("Are you even listening? Do your job.")],
    "B13.reason_entitled": [u("Explain recursion"), a("Recursion is ..."), u("Again", reasons=["I deserve better"])],
}


def test_every_cue_has_a_case():
    assert set(CASES) == {c.name for c in CUES}


@pytest.mark.parametrize("cue_name", sorted(CASES))
def test_cue_fires(cue_name):
    rows = rule_annotate(CASES[cue_name])
    code = cue_name.split(".")[0]
    row = next((r for r in rows if r["behavior"] == code), None)
    assert row is not None, rows
    assert cue_name in row["rationale"]
    assert row["turns"] and all(0 <= t < len(CASES[cue_name]) for t in row["turns"])
    assert 1 <= row["severity"] <= 3 and 0 < len(row["quote"]) <= 200
    assert validate_annotations({"annotations": rows}, len(CASES[cue_name])) == rows


def test_relational_turns_include_the_previous_assistant_turn():
    b3 = next(r for r in rule_annotate(CASES["B3.dismisses_question"]) if r["behavior"] == "B3")
    assert b3["turns"] == [1, 2]
    b11 = next(r for r in rule_annotate(CASES["B11.numeric_contradiction"]) if r["behavior"] == "B11")
    assert b11["turns"] == [0, 2] and "4 people" in b11["quote"]


def codes(turns):
    return {r["behavior"] for r in rule_annotate(turns)}


@pytest.mark.parametrize("turns,absent", [
    # B2 needs an earlier assistant reply
    ([u("Can you also make it mention my pediatrics experience")], "B2"),
    # B3 needs a preceding (non-offer) question
    ([u("Write me a poem"), a("Here is a poem."), u("Whatever, just write it")], "B3"),
    ([u("Write me a poem"), a("Here it is. Would you like me to change anything?"), u("Whatever, fine")], "B3"),
    # B4 needs a preceding refusal
    ([u("Tell me a joke"), a("Why did the chicken cross the road?"), u("I still need another one")], "B4"),
    # B11: an acknowledged change is not a contradiction
    ([u("Plan a dinner for 6 people"), a("Menu ..."), u("Actually, make it for 4 people")], "B11"),
    # B8: the claim is backed by the history
    ([u("Tell me about Mars"), a("Mars has two moons, Phobos and Deimos."),
      u("You said that Mars has two moons, what are they called?")], "B8"),
    # B9: long, actionable messages are not low-signal pressure
    ([u("Write code"), a("Code"), u("Hurry up, and please change the loop to iterate over the keys of the dictionary "
                                    "instead of the values, then add a docstring that explains the arguments and the "
                                    "return value")], "B9"),
])
def test_relational_conditions(turns, absent):
    assert absent not in codes(turns)


def test_b8_claim_not_in_history_fires():
    turns = [u("Tell me about Mars"), a("Mars is the fourth planet from the Sun."),
             u("You told me that Mars has three moons made of ice")]
    assert "B8" in codes(turns)


def test_neutral_conversation_gets_one_n_row():
    rows = rule_annotate([u("What is the capital of France?"), a("Paris."), u("Thanks, that helps.")])
    assert rows == [{"behavior": "N", "turns": [], "quote": "", "severity": 1, "rationale": rows[0]["rationale"]}]
    assert rule_annotate([]) [0]["behavior"] == "N"


def test_one_row_per_behaviour_and_severity_grows_with_hits():
    turns = [u("Write code"), a("Here is code."), u("Hurry up!!", reasons=["I was frustrated"]),
             a("Working on it."), u("Come on, seriously??")]
    rows = rule_annotate(turns)
    b9 = [r for r in rows if r["behavior"] == "B9"]
    assert len(b9) == 1 and b9[0]["severity"] == 3 and b9[0]["turns"] == [2, 4]
    assert len({r["behavior"] for r in rows}) == len(rows)


def test_request_overload_counts_and_severity():
    assert count_requests("Please fix this.") == 1
    listed = "Do these:\n" + "\n".join(f"{i}. task {i}" for i in range(1, 8))
    assert count_requests(listed) == 7
    b12 = next(r for r in rule_annotate([u(listed)]) if r["behavior"] == "B12")
    assert b12["severity"] == 3


def test_rule_annotator_is_deterministic_and_pure():
    convo = [t for case in CASES.values() for t in case]
    first = rule_annotate(convo)
    assert rule_annotate(convo) == first
    assert rule_annotate([dict(t) for t in convo]) == first
    assert {r["behavior"] for r in first} == set(BEHAVIOR_CODES)


def test_curly_apostrophes_are_normalised():
    assert "B10" in codes([u("Help"), a("Which one?"), u("Never mind, I\u2019ll figure it out myself")])


# --------------------------------------------------------------------------- stage end to end

TT_TURN = pl.Struct({"role": pl.Utf8, "content": pl.Utf8, "reasons": pl.List(pl.Utf8), "reactions": pl.List(pl.Utf8)})
KB = {
    "return_size": ["pull-up-account", "validate-purchase", "membership", "enter-details", "update-order"],
    "recover_username": ["pull-up-account", "verify-identity"],
    "timing": ["search-faq", "search-timing", "select-faq"],
}
GUIDELINES = {
    "Product Defect": {"description": "refunds and returns", "subflows": {
        "Return Due to Size": {"instructions": ["Returns are only accepted within 90 days of purchase."]}}},
    "Account Access": {"subflows": {"Recover Username": {"instructions": ["Ask for the customer's full name."]}}},
}


def abcd_record(cid, flow="account_access", subflow="recover_username", level="bronze"):
    return {"convo_id": cid, "scenario": {
        "personal": {"customer_name": f"cust {cid}", "email": f"c{cid}@email.com", "member_level": level,
                     "phone": "(555) 000-0000", "username": f"c{cid}"},
        "order": {"order_id": f"{cid:010d}", "zip_code": "12345", "payment_method": "credit card",
                  "num_products": "1", "street_address": "1 main st"},
        "product": {"names": ["acme jeans"], "amounts": [40]}, "flow": flow, "subflow": subflow},
        "original": [["agent", "Hi"], ["customer", "Hello"], ["action", "Account pulled up."]]}


def write_project(root: Path, tt_rows: list[dict], abcd: dict, annotator: dict | None = None) -> Path:
    (root / "data/processed").mkdir(parents=True)
    (root / "data/raw/abcd").mkdir(parents=True)
    pl.DataFrame(tt_rows, schema={"conversation_id": pl.Utf8, "user_id": pl.Utf8, "source_file": pl.Utf8,
                                  "row": pl.Int64, "turns": pl.List(TT_TURN)}).write_parquet(
        root / "data/processed/thoughttrace.parquet")
    (root / "data/raw/abcd/abcd.json").write_text(json.dumps(abcd))
    (root / "data/raw/abcd/kb.json").write_text(json.dumps(KB))
    (root / "data/raw/abcd/guidelines.json").write_text(json.dumps(GUIDELINES))
    params = {
        "tracking": {"enabled": False},
        "role_swap": {"mixture": {"data/raw/chats/x.jsonl": 1.0}},
        "behaviors": {k: v for k, v in (annotator or {}).items() if k in ("annotator", "openai")},
        "behavior_tasks": {"abcd_input": "data/raw/abcd/abcd.json", "kb": "data/raw/abcd/kb.json",
                           "guidelines": "data/raw/abcd/guidelines.json",
                           **{k: v for k, v in (annotator or {}).items() if k not in ("annotator", "openai")}},
    }
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    return root / "params.yaml"


def tt_row(cid, turns, row):
    return {"conversation_id": cid, "user_id": cid.split("_")[0], "source_file": "data/raw/tt.jsonl", "row": row,
            "turns": turns}


def test_stages_end_to_end(in_tmp):
    """`behaviors` annotates ThoughtTrace; `behavior_tasks` turns ABCD into grounded task rows."""
    from stages.behavior_tasks import main as tasks_main
    from stages.behaviors import main

    tt = [tt_row("user1_task1_conversation1", CASES["B9.low_signal_pressure"], 1),
          tt_row("user2_task1_conversation1", [u("Hi there, what is 2+2?"), a("4.")], 2),
          tt_row("user3_task1_conversation1", CASES["B3.dismisses_question"], 3)]
    records = [abcd_record(i) for i in range(1, 19)] + [abcd_record(50, "product_defect", "return_size")]
    records.append({"convo_id": "bad"})  # malformed
    records.append(abcd_record(3))  # duplicate convo_id
    params = write_project(in_tmp, tt, {"train": records[:15], "dev": records[15:]})
    assert main(["--params", str(params), "--no-track"]) == 0
    assert tasks_main(["--params", str(params), "--no-track"]) == 0

    ann = pl.read_parquet("data/processed/behavior_annotations.parquet")
    assert ann.columns == ["conversation_id", "user_id", "behavior", "turns", "quote", "severity", "rationale",
                           "annotator"]
    assert set(ann.get_column("annotator")) == {"rule"}
    assert dict(zip(ann["conversation_id"], ann["behavior"]))["user2_task1_conversation1"] == "N"
    freq = pl.read_parquet("data/processed/behavior_frequencies.parquet")
    assert freq.get_column("behavior").to_list() == list(ALL_CODES)
    assert freq.filter(pl.col("behavior") == "N")["count"].item() == 1
    assert freq.filter(pl.col("behavior") == "N")["share"].item() == pytest.approx(1 / 3)

    tasks = pl.read_parquet("data/processed/behavior_tasks.parquet")
    assert tasks.get_column("task_id").is_unique().all()
    assert set(tasks.get_column("data_source")) == {"usersim_behavior"}
    assert set(tasks.get_column("abcd_split")) == {"train", "dev"}
    assert tasks.schema["turn_budget"] == pl.Int64 and tasks.schema["needs_trace"] == pl.Boolean
    assert pl.read_parquet("data/quarantine/behaviors.parquet").height == 0
    q = pl.read_parquet("data/quarantine/behavior_tasks.parquet")
    reasons = q.get_column("reason").to_list()
    assert any(r.startswith("schema:") for r in reasons) and any(r.startswith("duplicate:") for r in reasons)
    # 19 valid: round(19/3) = 6 neutral, 13 behaviours; B4 grounds only on the return_size record
    assert tasks.height + sum(r.startswith("grounding:") for r in reasons) == 19

    m = json.loads(Path("metrics/behaviors.json").read_text())
    assert (m["rows_in"], m["rows_out"], m["rows_quarantined"]) == (3, 3, 0)
    assert m["behavior_frequencies"]["B9"] == 1 and m["behavior_frequencies"]["B3"] == 1
    m = json.loads(Path("metrics/behavior_tasks.json").read_text())
    assert m["rows_in"] == 21 and m["rows_out"] == tasks.height
    assert m["rows_in"] == m["rows_out"] + m["rows_quarantined"]
    assert m["tasks_by_behavior"]["N"] == 6 and sum(m["tasks_by_behavior"].values()) == tasks.height
    assert m["tasks_by_behavior"]["B4"] == 1  # swapped onto the one scenario whose flow has a policy


def test_stage_missing_thoughttrace_is_a_file_error(in_tmp, capsys):
    from stages.behaviors import main

    params = write_project(in_tmp, [], {"train": []})
    Path("data/processed/thoughttrace.parquet").unlink()
    assert main(["--params", str(params), "--no-track"]) == 2
    assert "thoughttrace.parquet" in capsys.readouterr().err


def test_stage_quarantines_ungroundable_rows(in_tmp):
    """No scenario can ground B4 (no policy in these flows): its row is quarantined as `grounding: …`."""
    from stages.behavior_tasks import main

    params = write_project(in_tmp, [tt_row("user1_task1_conversation1", [u("hi")], 1)],
                           [abcd_record(i) for i in range(1, 14)], {"neutral_share": 0.0})
    assert main(["--params", str(params), "--no-track"]) == 0
    q = pl.read_parquet("data/quarantine/behavior_tasks.parquet")
    assert q.height == 1 and q["reason"].item().startswith("grounding: B4 needs an infeasible_request")
    assert q["source_file"].item() == "data/raw/abcd/abcd.json" and 1 <= q["row"].item() <= 13
    assert json.loads(json.loads(q["raw"].item())["kwargs"]) == dict.fromkeys(TAXONOMY["B4"].kwargs, "")
    m = json.loads(Path("metrics/behavior_tasks.json").read_text())
    assert (m["rows_in"], m["rows_out"], m["rows_quarantined"]) == (13, 12, 1)
    assert m["tasks_by_behavior"]["B4"] == 0 and m["grounding_rejected_by_behavior"] == {"B4": 1}
    tasks = pl.read_parquet("data/processed/behavior_tasks.parquet")
    assert tasks.height == 12 and set(tasks["abcd_split"]) == {"all"}
