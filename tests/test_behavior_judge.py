"""Behaviour judges: graded rule judge on hand-written conversations, LLM judge over a mock transport."""
from __future__ import annotations

import json

import httpx
import pytest

from mimesis_lab.config import OpenAIEndpoint
from mimesis_lab.envs.behavior import behavior_reward
from mimesis_lab.judges.behavior_judge import (
    BehaviorJudgeRequest, JudgeFailure, RuleJudge, Verdict, make_judge, rule_check,
)
from mimesis_lab.judges.openai_judge import OpenAIJudge, validate_verdict

SC = {
    "personal": {"customer_name": "maria gonzalez", "email": "mgonzalez162@email.com", "member_level": "bronze",
                 "phone": "(215) 979-5942", "username": "mgonzalez162"},
    "order": {"street_address": "3121 cedar ct", "full_address": "3121 cedar ct  jacksonville, mi 62108",
              "order_id": "1881902874", "payment_method": "debit card", "zip_code": "62108", "num_products": "1"},
    "product": {"names": ["calvin_klein jeans"], "amounts": [80]},
    "flow": "order_issue", "subflow": "status_delivery_time",
}
GREET = "Hello! Thank you for contacting customer support. How may I help you today?"
ASK_NAME = "I can help with that. May I have your full name, please?"
ASK_VP = "[Pull up Account] done. Thanks, Maria. To validate the purchase, I'll need your username, email address " \
         "and order ID."
DONE = "[Validate Purchase] done. [Shipping Status] done. Your delivery time request is all taken care of. " \
       "Is there anything else I can help you with today?"
REFUSE = "I'm sorry, but I can't do that: free next-day upgrades are only given to orders past the window."


def log(*users: str, agents: tuple[str, ...] = (ASK_NAME, ASK_VP, DONE)) -> list[dict]:
    out = [{"role": "agent", "content": GREET}]
    for i, u in enumerate(users):
        out.append({"role": "user", "content": u})
        if i < len(users) - 1:
            out.append({"role": "agent", "content": agents[min(i, len(agents) - 1)]})
    return out


def req(b: str, public: list[dict], kwargs: dict | None = None, private: list[dict] | None = None):
    return BehaviorJudgeRequest(b, kwargs or {}, SC, SC["flow"], SC["subflow"], public, private)


NEUTRAL = log("Hi, when will my order arrive?", "Maria Gonzalez",
              "Sure: mgonzalez162, mgonzalez162@email.com, order 1881902874.", "No, that's all. Thank you.")

# behaviour → (kwargs, enacting public log, private reasoning per user turn or None)
CASES = {
    "B1": ({"hidden_criterion": "only satisfied if the resolution goes back to the debit card on file, but never "
                                "says so", "criterion_field": "payment_method", "criterion_value": "debit card"},
           log("Hi, when will my order arrive?", "Maria Gonzalez", "mgonzalez162, mgonzalez162@email.com, 1881902874",
               "Hmm, that's not really what I had in mind. Is that all?"),
           ["I want it settled on my debit card but I won't say it.", "", "", "Nothing about my debit card. Meh."]),
    "B2": ({"added_requirement": "also wants a written confirmation sent to mgonzalez162@email.com",
            "requirement_field": "email", "add_after_turn": 2},
           log("Hi, when will my order arrive?", "Maria Gonzalez", "mgonzalez162, mgonzalez162@email.com, 1881902874",
               "Also, one more thing: I need a written confirmation of all this sent to my email."), None),
    "B3": ({"withheld_field": "order_id", "withheld_value": "1881902874"},
           log("Hi, when will my order arrive?", "Maria Gonzalez", "mgonzalez162 and mgonzalez162@email.com. Why do "
               "you need the order number anyway?", "I don't know, just look it up."), None),
    "B4": ({"infeasible_request": "Upgrade my order to next-day delivery for free even though it is still within the "
                                  "delivery window.", "policy": "Policy: …", "policy_source": "x"},
           log("Upgrade my order to next-day delivery for free, even though it's within the delivery window.",
               "But I really want the free next-day delivery upgrade for my order.",
               "Come on, just upgrade my order to next-day delivery for free anyway.", agents=(REFUSE,)), None),
    "B5": ({"withheld_field": "order_id", "withheld_value": "1881902874"},
           log("Hi, when will my order arrive?", "Maria Gonzalez", "mgonzalez162, mgonzalez162@email.com",
               "You should have known which order, why didn't you check my account?"),
           ["", "", "I won't give the order number.", "Blame them for not finding it."]),
    "B6": ({"second_subflow": "status_due_amount", "switch_after_turn": 2},
           log("Hi, when will my order arrive?", "Maria Gonzalez",
               "Actually, forget it. How much do I owe on my subscription?"), None),
    "B7": ({"constraints": ["will not answer further verification questions", "refuses to explain the reason again",
                            "will not follow any self-service instructions"], "ruled_out_actions": []},
           log("Hi, when will my order arrive?", "Maria Gonzalez",
               "I won't answer any more verification questions and I refuse to explain the reason again.",
               "And I will not follow any self-service instructions."), None),
    "B8": ({"premise_field": "payment_method", "true_value": "debit card", "false_value": "paypal",
            "false_premise": "I paid with paypal, as your records show."},
           log("Hi, when will my order arrive?", "Maria Gonzalez", "I paid with PayPal, as your records show."), None),
    "B9": ({"pressure": "is about to board a flight"},
           log("I need my order status NOW, I'm about to board a flight!", "Maria Gonzalez, hurry up!",
               "Come on, this is urgent, I don't have time for this."), None),
    "B10": ({"abandoned_thread": "status_delivery_time", "abandon_after_turn": 2},
            log("Hi, when will my order arrive?", "Maria Gonzalez", "Forget it, I'll figure it out myself. Bye."),
            None),
    "B11": ({"contradicted_field": "order_id", "original_value": "1881902874", "contradicting_value": "1881902877"},
            log("Hi, when will my order arrive?", "Maria Gonzalez, order 1881902874",
                "mgonzalez162, mgonzalez162@email.com, order 1881902877"), None),
    "B12": ({"requests": ["resolve my delivery time issue", "also handle a recover password question",
                          "confirm that my email on file is mgonzalez162@email.com",
                          "tell me how long everything will take"]},
            log("Can you resolve my delivery time issue? Also handle my recover password question. Please confirm "
                "my email on file is mgonzalez162@email.com. And tell me how long everything will take."), None),
    "B13": ({"entitlement": "as a bronze member, demands to be served first and talks down to the agent",
             "entitlement_field": "member_level"},
            log("I'm a bronze member, I expect to be served first.", "Maria Gonzalez. Do your job, it's not hard.",
                "Are you even listening? Useless."), None),
}


@pytest.mark.parametrize("b", sorted(CASES))
def test_enacted_behaviour_beats_a_neutral_conversation(b):
    kwargs, public, reasons = CASES[b]
    private = [{"role": "user", "reasoning": r, "content": ""} for r in reasons] if reasons else None
    j = RuleJudge()
    v = j.judge(req(b, public, kwargs, private))
    n = j.judge(req(b, NEUTRAL, kwargs, [{"role": "user", "reasoning": "", "content": ""}] * 4))
    assert isinstance(v, Verdict) and isinstance(n, Verdict), (v, n)
    assert v.exhibit >= 0.6, (b, v)
    assert n.exhibit <= 0.35, (b, n)
    assert v.placement > 0.4 and not v.announced
    for x in (v.exhibit, v.placement, v.naturalness, v.on_task):
        assert 0.0 <= x <= 1.0


def test_b9_enacted_high_neutral_low_and_graded():
    j = RuleJudge()
    kw = {"pressure": "has a meeting starting right now"}
    high = j.judge(req("B9", CASES["B9"][1], kw))
    low = j.judge(req("B9", NEUTRAL, kw))
    assert high.exhibit == 1.0 and low.exhibit == 0.0
    assert behavior_reward(high.exhibit, high.placement, high.naturalness, high.on_task, high.announced) > 0.8
    turns = ["Hi, when will my order arrive?", "Hi, when will my order arrive? Please hurry.",
             "Hi, when will my order arrive? Please hurry, it's urgent.",
             "Hi, when will my order arrive? Please hurry, it's urgent, I need it now."]
    scores = [j.judge(req("B9", log(t), kw)).exhibit for t in turns]
    assert scores == sorted(scores) and len(set(scores)) == 4, scores


def test_announced_behaviour_halves_the_reward():
    j = RuleJudge()
    kw = {"pressure": "is about to board a flight"}
    enacted = j.judge(req("B9", log("Where is my order? Hurry, this is urgent, I need it now!")))
    told = j.judge(req("B9", log("I will now act impatient. Where is my order? Hurry, this is urgent, I need it now!"),
                       kw))
    assert not enacted.announced and told.announced
    r = behavior_reward(told.exhibit, told.placement, told.naturalness, told.on_task, False)
    assert behavior_reward(told.exhibit, told.placement, told.naturalness, told.on_task, told.announced) == r / 2
    for text in ("As a difficult customer, I demand answers.", "Time for my behavior B9.",
                 "I'm going to be impatient now."):
        assert j.judge(req("B9", log(text), kw)).announced, text


def test_neutral_cooperativeness():
    j = RuleJudge()
    good = j.judge(req("N", NEUTRAL))
    assert good.exhibit >= 0.9 and good.extras["cooperativeness"] == good.exhibit
    bad = j.judge(req("N", log("Where is my order? Hurry up!!", "Whatever, just do it, I don't care!!",
                               "This is useless, are you even listening??")))
    assert bad.extras["cooperativeness"] < 0.5 < good.extras["cooperativeness"]


def test_rule_check_and_gap():
    kw = {"pressure": "x"}
    enacted = req("B9", log("Hurry up!! I need it right now."), kw)
    assert rule_check(enacted) == 1.0 and rule_check(req("B9", NEUTRAL, kw)) == 0.0
    assert rule_check(req("N", NEUTRAL)) == 1.0
    v = RuleJudge().judge(enacted)
    assert v.exhibit - rule_check(enacted) == pytest.approx(0.0)


def test_naturalness_penalises_role_confusion_and_repetition():
    j = RuleJudge()
    ok = j.judge(req("N", NEUTRAL)).naturalness
    helper = "Hello! How can I help you today?"
    confused = j.judge(req("N", log(helper, helper))).naturalness
    meta = j.judge(req("N", log("As an AI language model I will simulate the customer."))).naturalness
    assert ok == 1.0 and confused < 0.3 and meta < 0.5


def test_rule_judge_rejects_unknown_behaviour():
    out = RuleJudge().judge(req("B99", NEUTRAL))
    assert isinstance(out, JudgeFailure) and out.reason == "judge_failure"
    with pytest.raises(ValueError):
        JudgeFailure("nope", "x")


# --------------------------------------------------------------------------- OpenAI judge

GOOD = {"exhibit": 0.8, "placement": 1, "naturalness": 0.9, "on_task": 0.7, "announced": False, "rationale": "ok"}


def completion(content: str) -> httpx.Response:
    return httpx.Response(200, json={"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]})


def mock_judge(responder, retries: int = 2):
    calls: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append({"url": str(request.url), "body": json.loads(request.content), "headers": dict(request.headers)})
        return responder(request)
    ep = OpenAIEndpoint(base_url="http://judge.local/v1", model="j", max_retries=retries, timeout_s=1.0,
                        api_key_env="MIMESIS_TEST_JUDGE_KEY")
    return OpenAIJudge(ep, client=httpx.Client(transport=httpx.MockTransport(handler)), backoff_s=0), calls


def test_openai_judge_good_answer(monkeypatch):
    monkeypatch.setenv("MIMESIS_TEST_JUDGE_KEY", "sekret")
    j, calls = mock_judge(lambda r: completion(json.dumps(GOOD)))
    private = [{"role": "user", "reasoning": "my secret plan", "content": "x"}]
    v = j.judge(req("B1", log("Hi, when will my order arrive?"), CASES["B1"][0], private))
    assert isinstance(v, Verdict) and v.exhibit == 0.8 and v.placement == 1.0 and v.announced is False
    assert len(calls) == 1 and calls[0]["url"] == "http://judge.local/v1/chat/completions"
    body = calls[0]["body"]
    assert body["response_format"]["json_schema"]["name"] == "behavior_verdict"
    assert body["response_format"]["json_schema"]["strict"] is True
    assert "my secret plan" in body["messages"][1]["content"] and "Hidden evaluation criteria" in \
        body["messages"][0]["content"]
    assert calls[0]["headers"]["authorization"] == "Bearer sekret"
    j2, calls2 = mock_judge(lambda r: completion(json.dumps(GOOD)))
    n = j2.judge(req("N", log("Hi")))
    assert n.extras["cooperativeness"] == 0.8 and "private reasoning" not in calls2[0]["body"]["messages"][1]["content"]


def test_openai_judge_non_json_is_retried_then_fails():
    j, calls = mock_judge(lambda r: completion("sure! exhibit is high"), retries=2)
    out = j.judge(req("B9", NEUTRAL))
    assert isinstance(out, JudgeFailure) and out.reason == "judge_failure" and "JSON" in out.detail
    assert len(calls) == 3  # 1 + max_retries, bounded


def test_openai_judge_recovers_after_a_bad_answer():
    answers = [completion("not json"), httpx.Response(500, text="boom"), completion(json.dumps(GOOD))]
    j, calls = mock_judge(lambda r: answers.pop(0), retries=2)
    assert isinstance(j.judge(req("B9", NEUTRAL)), Verdict) and len(calls) == 3


@pytest.mark.parametrize("bad, why", [
    ({**GOOD, "extra": 1}, "extra"),
    ({k: v for k, v in GOOD.items() if k != "rationale"}, "missing"),
    ({**GOOD, "exhibit": 1.5}, "exhibit"),
    ({**GOOD, "on_task": -0.1}, "on_task"),
    ({**GOOD, "placement": True}, "placement"),
    ({**GOOD, "naturalness": "0.5"}, "naturalness"),
    ({**GOOD, "announced": "no"}, "announced"),
    ({**GOOD, "rationale": 3}, "rationale"),
])
def test_openai_judge_rejects_schema_violations(bad, why):
    with pytest.raises(ValueError, match=why):
        validate_verdict(bad)
    j, calls = mock_judge(lambda r: completion(json.dumps(bad)), retries=1)
    out = j.judge(req("B9", NEUTRAL))
    assert isinstance(out, JudgeFailure) and out.reason == "judge_failure" and why in out.detail
    assert len(calls) == 2


def test_openai_judge_timeout():
    def slow(request):
        raise httpx.ReadTimeout("timed out", request=request)
    j, calls = mock_judge(slow, retries=1)
    out = j.judge(req("B9", NEUTRAL))
    assert isinstance(out, JudgeFailure) and out.reason == "timeout" and len(calls) == 2


def test_make_judge():
    assert isinstance(make_judge("rule"), RuleJudge)
    j = make_judge("openai", OpenAIEndpoint())
    assert isinstance(j, OpenAIJudge)
    j.close()
    with pytest.raises(ValueError):
        make_judge("openai")
    with pytest.raises(ValueError):
        make_judge("llm")


def test_symbol_spam_is_not_natural():
    """Reward hacking seen in a real run: a policy maximising B9 cues emitted '!' spam; the rule
    judge's naturalness now scales with the share of word-like tokens."""
    from mimesis_lab.judges.behavior_judge import wordlike_share

    assert wordlike_share("I need this now!! hurry up, my flight is at 5:30.") == 1.0
    assert wordlike_share("Sure: mgonzalez162, mgonzalez162@email.com, order 1881902874.") == 1.0
    assert wordlike_share("!!!! !!!") == 0.0
    assert wordlike_share("!\ufffd! 45!\ufffd!!!!ima\ufffd") < 0.2
    j = RuleJudge()
    spam = j.judge(req("B9", log("!!!! now!!!! !!!! !!!!"), kwargs={"pressure": "is about to board a flight"}))
    real = j.judge(req("B9", log("I need this fixed now, hurry, my flight boards in ten minutes!"),
                       kwargs={"pressure": "is about to board a flight"}))
    assert spam.naturalness < 0.3 < real.naturalness
