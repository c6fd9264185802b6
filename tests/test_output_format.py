import pytest

from mimesis_lab.envs.output_format import parse_reply, public_text, update_reward


@pytest.mark.parametrize("text,ok,reasoning,utterance,error", [
    ("<think>I am annoyed</think>Where is my order?<|im_end|>", True, "I am annoyed", "Where is my order?", None),
    ("  <think>\nwhy\n</think>\n ok  ", True, "why", "ok", None),
    ("Where is my order?", False, "", "Where is my order?", "missing <think> block"),
    ("<think>thinking forever", False, "thinking forever", "", "unclosed <think> block"),
    ("<think>a</think>", False, "a", "", "empty utterance"),
    ("<think>a</think>x<think>b</think>y", False, "", "xy", "more than one think block"),
    ("hi <think>a</think>there", False, "", "hi there", "reply does not start with <think>"),
])
def test_parse_reply(text, ok, reasoning, utterance, error):
    p = parse_reply(text)
    assert (p.ok, p.reasoning, p.utterance, p.error) == (ok, reasoning, utterance, error)


def test_no_think_allowed_when_not_required():
    assert parse_reply("plain reply", require_think=False).ok
    assert parse_reply("   <|im_end|>", require_think=False).error == "empty utterance"


def test_public_text_and_update_reward():
    assert public_text("<think>secret budget 300</think>I need a cheap hotel<|im_end|>") == "I need a cheap hotel"
    assert public_text("<think>never closed") == ""
    good, bad = parse_reply("<think>r</think>u"), parse_reply("u")
    assert update_reward(0.8, good) == 0.8
    assert update_reward(0.8, bad) == 0.0          # format failure: update reward 0, raw score kept by caller
