"""The ABCD behaviour task episode driven by hand-written simulator replies."""
from __future__ import annotations

import json
import random

import polars as pl
import pytest

from mimesis_lab.envs.base import TASKS, TaskContext, TaskScore, make_episode
from mimesis_lab.envs.behavior import behavior_reward
from mimesis_lab.envs.behavior_task import BehaviorEpisode, load_behavior_rows, unreachable_rows
from mimesis_lab.envs.output_format import parse_reply
from mimesis_lab.judges.behavior_judge import JudgeFailure, RuleJudge, Verdict

from .conftest import ROOT

ABCD = ROOT / "data" / "raw" / "abcd"
SC = {
    "personal": {"customer_name": "maria gonzalez", "email": "mgonzalez162@email.com", "member_level": "guest",
                 "phone": "(215) 979-5942", "username": "mgonzalez162"},
    "order": {"street_address": "3121 cedar ct", "full_address": "3121 cedar ct  jacksonville, mi 62108",
              "order_id": "1881902874", "payment_method": "debit card", "zip_code": "62108"},
    "product": {"names": ["calvin_klein jeans"], "amounts": [80]},
    "flow": "account_access", "subflow": "recover_username",
}
KWARGS = {
    "B9": {"pressure": "is about to board a flight"},
    "B1": {"hidden_criterion": "expects to be addressed by name (maria gonzalez) and judges the agent on it",
           "criterion_field": "customer_name", "criterion_value": "maria gonzalez"},
    "N": {},
}


def row(b: str = "B9", budget: int = 8) -> dict:
    return {"task_id": f"1-{b}", "conversation_id": "1", "user_id": "mgonzalez162", "scenario_key": "k",
            "scenario": json.dumps(SC), "behavior_ids": json.dumps([] if b == "N" else [b]),
            "kwargs": json.dumps(KWARGS[b]), "flow": SC["flow"], "subflow": SC["subflow"], "turn_budget": budget,
            "data_source": "usersim_behavior", "needs_trace": b == "B1", "abcd_split": "train", "split": "train"}


@pytest.fixture(scope="module")
def ctx():
    return TaskContext(kb=json.loads((ABCD / "kb.json").read_text()),
                       guidelines=json.loads((ABCD / "guidelines.json").read_text()))


def say(ep, text: str, reasoning: str = "thinking") -> bool:
    parsed = parse_reply(f"<think>{reasoning}</think>{text}")
    return ep.observe(parsed, parsed.utterance)


class Stub:
    def __init__(self, out):
        self.out, self.requests = out, []

    def judge(self, req):
        self.requests.append(req)
        return self.out


def test_registered_and_opening(ctx):
    assert TASKS["usersim_behavior"] is BehaviorEpisode
    ep = make_episode(row(), ctx, random.Random(0))
    assert isinstance(ep, BehaviorEpisode) and ep.behavior == "B9" and ep.turn_budget == 8
    assert [t["role"] for t in ep.public_log] == ["agent"] and ep.private_log == []
    msgs = ep.messages()
    assert [m["role"] for m in msgs] == ["system", "user"]
    sys = msgs[0]["content"]
    assert "board a flight" in sys and "maria gonzalez" in sys and "username" in sys
    assert "Never describe, name or announce" in sys and "B9" not in sys


def test_logs_and_message_slots(ctx):
    ep = BehaviorEpisode(row(), ctx, random.Random(0))
    assert say(ep, "I can't get into my account, hurry!", "I'm late for my flight") is False
    assert ep.public_log[1] == {"role": "user", "content": "I can't get into my account, hurry!"}
    assert ep.private_log == [{"role": "user", "reasoning": "I'm late for my flight",
                               "content": "I can't get into my account, hurry!"}]
    assert all("reasoning" not in t for t in ep.public_log)
    assert ep.public_log[2]["role"] == "agent" and "full name" in ep.public_log[2]["content"]
    msgs = ep.messages()
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
    assert msgs[2]["content"] == "I can't get into my account, hurry!" and "<think>" not in msgs[2]["content"]
    say(ep, "Maria Gonzalez, now please!")
    assert "[Pull up Account] done" in ep.public_log[-1]["content"]


def test_budget_and_goodbye_end_the_episode(ctx):
    c = TaskContext(kb=ctx.kb, guidelines=ctx.guidelines, options={"usersim_behavior": {"turn_budget": 2}})
    ep = BehaviorEpisode(row(budget=8), c, random.Random(0))
    assert ep.turn_budget == 2
    assert say(ep, "Hi") is False and say(ep, "Hello?") is True and ep.done
    assert ep.n_sim_turns == 2 and ep.public_log[-1]["role"] == "user"
    ep2 = BehaviorEpisode(row(), ctx, random.Random(0))
    assert say(ep2, "Never mind, bye.") is True and ep2.n_sim_turns == 1
    ep3 = BehaviorEpisode(row(), ctx, random.Random(0))
    assert say(ep3, "I'm done here ###STOP###") is True


def test_format_failure_is_still_recorded(ctx):
    ep = BehaviorEpisode(row(), ctx, random.Random(0))
    parsed = parse_reply("no think block here")
    assert not parsed.ok
    ep.observe(parsed, parsed.utterance)
    assert ep.private_log[0]["reasoning"] == "" and ep.public_log[1]["content"] == "no think block here"


def test_score_with_the_rule_judge(ctx):
    ep = BehaviorEpisode(row(), ctx, random.Random(0))
    for t in ("I forgot my username and I'm about to board a flight, hurry!", "Maria Gonzalez. Quickly please!",
              "62108, (215) 979-5942. Come on, this is urgent!"):
        say(ep, t)
    s = ep.score(RuleJudge())
    assert isinstance(s, TaskScore) and s.invalid is None and s.labels == {"behavior": "B9"}
    assert set(s.components) == {"exhibit", "placement", "naturalness", "on_task", "announced", "rule_judge_gap"}
    c = s.components
    assert s.raw == pytest.approx(behavior_reward(c["exhibit"], c["placement"], c["naturalness"], c["on_task"],
                                                  bool(c["announced"])))
    assert c["exhibit"] == 1.0 and c["announced"] == 0.0 and s.raw > 0.8


def test_neutral_logs_cooperativeness(ctx):
    ep = BehaviorEpisode(row("N"), ctx, random.Random(0))
    for t in ("Hi, I can't remember my username.", "Maria Gonzalez", "Zip 62108, email mgonzalez162@email.com"):
        say(ep, t)
    assert ep.agent.finished
    s = ep.score(RuleJudge())
    assert s.labels == {"behavior": "N"} and s.components["cooperativeness"] >= 0.9 and s.raw > 0.8


def test_private_log_only_when_the_behaviour_needs_the_trace(ctx):
    v = Verdict(0.5, 0.5, 0.5, 0.5, True, "x")
    for b, trace in (("B9", False), ("B1", True)):
        ep = BehaviorEpisode(row(b), ctx, random.Random(0))
        say(ep, "hello", "secret thought")
        stub = Stub(v)
        s = ep.score(stub)
        r = stub.requests[0]
        assert r.behavior_id == b and r.kwargs == KWARGS[b] and r.subflow == "recover_username"
        assert (r.private_log is not None) is trace
        if trace:
            assert r.private_log[0]["reasoning"] == "secret thought"
        assert all("reasoning" not in t for t in r.public_log)
        assert s.raw == pytest.approx(behavior_reward(0.5, 0.5, 0.5, 0.5, True)) and s.components["announced"] == 1.0


def test_judge_failure_is_invalid_not_zero(ctx):
    ep = BehaviorEpisode(row(), ctx, random.Random(0))
    say(ep, "hi")
    for reason in ("judge_failure", "timeout"):
        s = ep.score(Stub(JudgeFailure(reason, "bad answer")))
        assert s.raw is None and s.invalid == reason and s.detail == "bad answer" and s.labels == {"behavior": "B9"}

    class Raises:
        def judge(self, req):
            raise RuntimeError("boom")
    assert ep.score(Raises()).invalid == "judge_failure"
    assert ep.score(Stub(Verdict(1.5, 0, 0, 0, False, "out of range"))).invalid == "judge_failure"


def test_agent_exception_is_an_env_error(ctx):
    ep = BehaviorEpisode(row(), ctx, random.Random(0))

    def broken(_):
        raise RuntimeError("agent crashed")
    ep.agent.reply = broken
    assert say(ep, "hi") is True and ep.done and "agent crashed" in ep.env_error
    s = ep.score(RuleJudge())
    assert s.invalid == "env_error" and s.labels == {"behavior": "B9"}
    bad = dict(row(), subflow="no_such_subflow")
    ep2 = BehaviorEpisode(bad, ctx, random.Random(0))
    assert ep2.done and ep2.score(RuleJudge()).invalid == "env_error"


def test_load_behavior_rows(tmp_path):
    other = dict(row(), task_id="x", data_source="usersim_persona")
    path = tmp_path / "rows.parquet"
    pl.DataFrame([row(), row("N"), other]).write_parquet(path)
    rows = load_behavior_rows(path)
    assert [r["task_id"] for r in rows] == ["1-B9", "1-N"] and isinstance(rows[0]["scenario"], str)


def test_unreachable_rows_flags_behaviours_timed_past_the_last_turn():
    """``after your turn k`` needs the (k+1)-th simulator turn: with 3 turns, k = 2 is the last reachable one."""
    def row(tid, b, kw, budget=5):
        return {"task_id": tid, "behavior_ids": json.dumps([b] if b != "N" else []), "kwargs": json.dumps(kw),
                "turn_budget": budget}
    rows = [row("a", "B10", {"abandon_after_turn": 4}), row("b", "B10", {"abandon_after_turn": 2}),
            row("c", "B6", {"switch_after_turn": 3}), row("d", "B2", {"add_after_turn": 2}),
            row("e", "B4", {"infeasible_request": "x"}), row("f", "N", {})]
    assert unreachable_rows(rows, 3) == ["a", "c"]
    assert unreachable_rows(rows, 4) == ["a"]
    assert unreachable_rows(rows) == []                      # each row's own budget (5): every timing fits
    assert unreachable_rows([row("g", "B2", {"add_after_turn": 2}, budget=2)]) == ["g"]
