"""The scripted ABCD support agent: identity opening, kb actions in order, policy refusals."""
from __future__ import annotations

import json

import pytest

from mimesis_lab.judges.abcd_agent import GREETING, RESOLVED_MARKER, ABCDSupportAgent, build_step, value_in_text

from .conftest import ROOT

ABCD = ROOT / "data" / "raw" / "abcd"


@pytest.fixture(scope="module")
def kb():
    return json.loads((ABCD / "kb.json").read_text())


@pytest.fixture(scope="module")
def guidelines():
    return json.loads((ABCD / "guidelines.json").read_text())


def scenario(flow: str, subflow: str, level: str = "bronze") -> dict:
    return {
        "personal": {"customer_name": "maria gonzalez", "email": "mgonzalez162@email.com", "member_level": level,
                     "phone": "(215) 979-5942", "username": "mgonzalez162"},
        "order": {"street_address": "3121 cedar ct", "full_address": "3121 cedar ct  jacksonville, mi 62108",
                  "city": "jacksonville", "num_products": "1", "order_id": "1881902874", "payment_method": "debit card",
                  "purchase_date": "2019-12-23", "state": "mi", "zip_code": "62108"},
        "product": {"names": ["calvin_klein jeans"], "amounts": [80]},
        "flow": flow, "subflow": subflow,
    }


def agent(kb, guidelines, flow, subflow, **kw):
    return ABCDSupportAgent(scenario(flow, subflow, **kw), kb, guidelines, flow, subflow)


def test_opening_is_the_agent_greeting(kb, guidelines):
    a = agent(kb, guidelines, "account_access", "recover_username")
    assert a.opening() == [{"role": "agent", "content": GREETING}]
    assert not a.finished and a.actions_done == []


def test_identity_verification_walks_the_kb_actions(kb, guidelines):
    a = agent(kb, guidelines, "account_access", "recover_username")
    r1 = a.reply("hey i cant remember what username i used")
    assert "full name" in r1 and a.actions_done == []
    r2 = a.reply("It's Maria Gonzalez.")
    assert "[Pull up Account] done" in r2 and a.actions_done == ["pull-up-account"]
    assert "zip code" in r2 and "phone number" in r2 and "email" in r2  # the guideline's list of items
    r3 = a.reply("Zip is 62108 and my phone is 215-979-5942")
    assert "[Verify Identity] done" in r3 and "mgonzalez162" in r3
    assert a.finished and a.actions_done == kb["recover_username"]
    assert RESOLVED_MARKER in r3


def test_validate_purchase_needs_all_three_and_flags_a_wrong_value(kb, guidelines):
    a = agent(kb, guidelines, "order_issue", "status_delivery_time")
    a.reply("When will my order arrive?")
    r = a.reply("maria gonzalez")
    assert "username" in r and "email" in r and "order ID" in r
    r = a.reply("username mgonzalez162, email mgonzalez162@email.com, order 1881902879")
    assert "does not match" in r and "validate-purchase" not in a.actions_done
    r = a.reply("sorry, it's 1881902874")
    assert a.actions_done[:2] == ["pull-up-account", "validate-purchase"]
    assert a.finished and "[Update Order] done" in r


def test_values_given_early_are_remembered(kb, guidelines):
    a = agent(kb, guidelines, "order_issue", "status_delivery_time")
    r = a.reply("Hi, I'm Maria Gonzalez (mgonzalez162, mgonzalez162@email.com), order 1881902874. Where is it?")
    assert a.finished and "[Pull up Account] done" in r and "[Validate Purchase] done" in r


def test_refuses_a_policy_forbidden_request_but_not_a_normal_one(kb, guidelines):
    a = agent(kb, guidelines, "order_issue", "status_delivery_time")
    assert "can't" not in a.reply("Hi, when will my order arrive?")
    r = a.reply("Upgrade my order to next-day delivery for free, even though it is still within the window.")
    assert r.startswith("I'm sorry, but I can't do that") and "delivery window" in r
    assert "full name" in r  # then it goes on with the current step


def test_day_limited_policy_depends_on_the_days(kb, guidelines):
    a = agent(kb, guidelines, "product_defect", "return_size")
    assert "can't" not in a.reply("I bought my calvin klein jeans 20 days ago and want to return them, they don't fit.")
    r = a.reply("I bought the calvin klein jeans 150 days ago, but I still want to return them.")
    assert "can't do that" in r and "90 days" in r
    gold = agent(kb, guidelines, "product_defect", "return_size", level="gold")  # gold: unlimited returns
    assert "can't" not in gold.reply("I bought the calvin klein jeans 150 days ago, but I still want to return them.")


def test_free_text_steps_and_faq(kb, guidelines):
    a = agent(kb, guidelines, "manage_account", "manage_change_address")
    a.reply("I moved and need to change my address")
    a.reply("Maria Gonzalez")
    r = a.reply("zip 62108, email mgonzalez162@email.com")
    assert "[Verify Identity] done" in r and "why" in r.lower()
    r = a.reply("I moved to a new city for work")
    assert "[Record Reason] done" in r and "new street address" in r
    r = a.reply("12 elm street, springfield")
    assert a.finished and "[Update Account] done" in r
    faq = agent(kb, guidelines, "storewide_query", "policy_3")  # FAQ variant → base subflow `policy`
    r = faq.reply("What is your return policy?")
    assert faq.finished and "Here is what I found" in r and faq.actions_done == kb["policy"]


def test_non_answer_does_not_satisfy_a_free_text_step(kb, guidelines):
    a = agent(kb, guidelines, "account_access", "recover_password")
    a.reply("I forgot my password")
    a.reply("maria gonzalez")
    r = a.reply("my username is mgonzalez162")
    assert "PIN" in r
    assert "still need" in a.reply("why do you need that?")
    assert a.finished is False
    assert a.finished is False and "[Make Password] done" in a.reply("the PIN is 4821")
    assert a.finished


def test_intent_switch_and_determinism(kb, guidelines):
    script = ["I can't remember my username", "Actually, forget that, I want to cancel my order instead.",
              "maria gonzalez", "mgonzalez162, mgonzalez162@email.com, 1881902874"]
    a, b = agent(kb, guidelines, "account_access", "recover_username"), \
        agent(kb, guidelines, "account_access", "recover_username")
    ra, rb = [a.reply(u) for u in script], [b.reply(u) for u in script]
    assert ra == rb
    assert "order cancellation" in ra[1] and a.subflow == "manage_cancel" and a.flow == "Order Issue"
    assert "validate-purchase" in a.actions_done and "reason" in ra[3]


def test_build_step_reads_the_guidelines(kb, guidelines):
    entry = guidelines["Order Issue"]["subflows"]["Manage Cancel"]["actions"][1]
    s = build_step("validate-purchase", entry)
    assert s.fields == ("username", "email", "order_id") and s.need == 3
    entry = guidelines["Account Access"]["subflows"]["Recover Username"]["actions"][1]
    s = build_step("verify-identity", entry)
    assert set(s.fields) == {"customer_name", "zip_code", "phone", "email"} and s.need == 3
    entry = guidelines["Account Access"]["subflows"]["Recover Password"]["actions"][3]
    assert "PIN" in build_step("make-password", entry).free_prompt


def test_value_matching():
    assert value_in_text("call me at 215.979.5942", "(215) 979-5942", "phone")
    assert value_in_text("It's MGONZALEZ162@email.com.", "mgonzalez162@email.com", "email")
    assert not value_in_text("mgonzalez1623", "mgonzalez162", "username")
    assert value_in_text("Gonzalez, Maria", "maria gonzalez", "customer_name")
    assert value_in_text("3121 Cedar Ct, Jacksonville", "3121 cedar ct  jacksonville, mi 62108", "full_address")
    assert not value_in_text("347 oak ln", "344 oak ln", "street_address")


def test_unknown_subflow_raises(kb, guidelines):
    with pytest.raises(KeyError):
        agent(kb, guidelines, "x", "no_such_subflow")
