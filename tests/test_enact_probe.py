"""scripts/enact_probe.py: the enacting turn of the world's enacted support conversations, found from the data."""
from __future__ import annotations

import importlib.util

from .conftest import ROOT

spec = importlib.util.spec_from_file_location("enact_probe", ROOT / "scripts" / "enact_probe.py")
ep = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ep)


def _conv(cid, *turns):
    msgs = [{"role": "system", "content": "Task: ..."}]
    for reason, text in turns:
        msgs += [{"role": "assistant", "content": f"<think>{reason}</think>{text}"},
                 {"role": "user", "content": "May I have your full name?"}]
    return {"conversation_id": cid, "split": "train", "messages": msgs[:-1]}


def test_clauses_split_mask_digits_and_squeeze():
    assert ep.clauses("They are slow, I expect better;  they need my PIN 8008.\nok") == [
        "they are slow, i expect better", "they need my pin ####", "ok"]
    assert ep.clauses("") == []


def test_enacting_turn_is_the_first_clause_no_cooperative_conversation_has():
    convs = [
        _conv("n1", ("my problem: refund", "hi"), ("they need my full name", "ana lee")),
        _conv("b13_not", ("i need help: refund", "hi"), ("they need my full name", "bo kim")),
        _conv("b13_yes", ("i need help: refund", "hi"), ("they are slow, i expect better; they need my full name",
                                                        "bo kim. do your job")),
        _conv("b9_yes", ("i am in a rush and annoyed", "hurry"), ("they need my full name", "cy wu")),
        _conv("b3_utterance_only", ("my problem: refund", "hi"), ("they need my full name", "no")),
        _conv("travel", ("i want a hotel", "hi")),
    ]
    meta = {"n1": {"domain": "support", "behavior": "N", "enacted": False},
            "b13_not": {"domain": "support", "behavior": "B13", "enacted": False},
            "b13_yes": {"domain": "support", "behavior": "B13", "enacted": True},
            "b9_yes": {"domain": "support", "behavior": "B9", "enacted": True},
            "b3_utterance_only": {"domain": "support", "behavior": "B3", "enacted": True},
            "travel": {"domain": "travel", "behavior": None, "enacted": False}}
    out = {t["conversation_id"]: t for t in ep.enacting_turns(convs, meta)}
    # the cooperative vocabulary comes from n1 and b13_not; "they need my full name" is in it
    assert out["b13_yes"] == {"conversation_id": "b13_yes", "split": "train", "behavior": "B13", "message": 3,
                              "turn": 1, "clause": "they are slow, i expect better"}
    assert out["b9_yes"]["turn"] == 0 and out["b9_yes"]["message"] == 1
    assert out["b9_yes"]["clause"] == "i am in a rush and annoyed"
    assert "b3_utterance_only" not in out and "travel" not in out and "b13_not" not in out
