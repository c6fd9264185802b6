"""The ABCD realistic-behaviour task (SPEC §2.4): the simulator plays a customer with one behaviour.

One row (``data_source = "usersim_behavior"``; JSON-string columns ``scenario``, ``behavior_ids``,
``kwargs``; ``flow``, ``subflow``, ``turn_budget``) is one episode: the first behaviour id and
its kwargs are used, an empty list is the neutral control ``N``. The scripted
:class:`~mimesis_lab.judges.abcd_agent.ABCDSupportAgent` opens (its greeting is replayed into the
public log), then the simulator and the agent alternate for at most ``turn_budget`` simulator
turns (``sim_rl.tasks.usersim_behavior.turn_budget`` overrides the row), or until the user says
goodbye / ``###STOP###``. The public log keeps utterances only; the private log keeps reasoning +
utterance and is shown to the judge only for behaviours with ``needs_trace``.

Score: ``behavior_reward(e, p, n, c, announced)`` of the judge's verdict, components ``exhibit``,
``placement``, ``naturalness``, ``on_task``, ``announced`` (0/1), ``rule_judge_gap`` (exhibit −
independent rule check, logged only) and, for N, ``cooperativeness``; label ``behavior``. A judge
failure or an exception in the agent makes the rollout *invalid* (``judge_failure`` / ``timeout`` /
``env_error``), never a 0.
"""
from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

from mimesis_lab.abcd_policy import base_subflow, scenario_value
from mimesis_lab.behaviors import TAXONOMY
from mimesis_lab.envs.base import SimEpisode, TaskContext, TaskScore, register_task
from mimesis_lab.envs.behavior import behavior_reward
from mimesis_lab.envs.output_format import ParsedReply
from mimesis_lab.judges.abcd_agent import ABCDSupportAgent, topic_name
from mimesis_lab.judges.behavior_judge import BehaviorJudgeRequest, JudgeFailure, rule_check
from mimesis_lab.thoughttrace import simulator_system_prompt

__all__ = ["BehaviorEpisode", "load_behavior_rows", "system_prompt", "behavior_instruction", "GOALS", "DATA_SOURCE",
           "TIMING_KEYS", "row_behavior", "episode_turn_budget", "unreachable_rows"]

DATA_SOURCE = "usersim_behavior"

#: the customer's goal per kb subflow, in plain language
GOALS = {
    "recover_username": "you cannot remember the username of your account and want to find it out",
    "recover_password": "you forgot your password and need to get back into your account",
    "reset_2fa": "you are locked out by two-factor authentication and need it reset",
    "manage_change_address": "you moved and want to change the address on your account",
    "manage_change_phone": "you want to change the phone number on your account",
    "status_credit_missing": "a credit you were promised does not show up on your account",
    "status_delivery_time": "you want to know when your order will arrive",
    "manage_cancel": "you want to cancel your order",
    "status_mystery_fee": "there is an unexpected fee on your order and you want to know what it is",
    "refund_initiate": "your item is defective and you want a refund",
    "return_size": "your item does not fit and you want to return it",
    "return_color": "the color of your item does not match the listing and you want to return it",
    "bad_price_competitor": "you found your item cheaper at a competitor and want the difference back",
    "promo_code_invalid": "your promo code did not work and you want it fixed",
    "status": "you want to know where your order is",
    "missing": "an item was missing from your delivered order",
    "cost": "you have a question about the shipping cost of your order",
    "pricing": "you have a general question about prices",
    "membership": "you have a question about what your membership level includes",
    "policy": "you have a question about the store's policies (for example returns)",
    "status_due_amount": "you want to know how much you owe on your premium subscription",
    "manage_pay_bill": "you want to pay your premium subscription bill",
}


def goal(subflow: str) -> str:
    key = base_subflow(subflow)
    return GOALS.get(key, f"you need help with: {key.replace('_', ' ')}")


def _facts(sc: dict[str, Any]) -> list[str]:
    labels = (("customer_name", "Your name"), ("username", "Username"), ("email", "Email"), ("phone", "Phone"),
              ("member_level", "Membership level"), ("order_id", "Order ID"), ("full_address", "Address"),
              ("zip_code", "Zip code"), ("payment_method", "Payment method"), ("purchase_date", "Purchase date"))
    out = [f"- {label}: {re.sub(r'  +', ', ', v)}" for f, label in labels if (v := scenario_value(sc, f))]
    prod = sc.get("product") or {}
    names, amounts = prod.get("names") or [], prod.get("amounts") or []
    if names:
        items = [f"{n} (${a})" if i < len(amounts) else str(n) for i, (n, a) in
                 enumerate(zip(names, list(amounts) + [None] * len(names)))]
        out.append(f"- Product(s): {', '.join(items)}")
    return out


_VERBS = {"is": "are", "has": "have", "needs": "need", "wants": "want", "demands": "demand", "expects": "expect",
          "refuses": "refuse", "does": "do", "insists": "insist", "talks": "talk", "judges": "judge", "says": "say"}


def _you(text: str) -> str:
    """A kwargs phrase written about the customer ("is about to board a flight") addressed to them."""
    s = re.sub(r"\b(" + "|".join(_VERBS) + r")\b", lambda m: _VERBS[m.group(1)], str(text).strip())
    s = re.sub(r"^only satisfied\b", "are only satisfied", s)
    if re.match(r"as an? [^,]+, ", s):
        return re.sub(r"^(as an? [^,]+), ", r"\1, you ", s)
    return s if s.startswith("you ") else "you " + s


def behavior_instruction(b: str, kw: dict[str, Any]) -> str:
    """How to enact behaviour ``b`` with its kwargs (from the TAXONOMY definition), or to cooperate for N."""
    if b == "N":
        return ("Be a cooperative customer: state your issue, answer the agent's questions with the facts above and "
                "follow their steps.")
    g = lambda k: re.sub(r"  +", ", ", str(kw.get(k, "")))  # noqa: E731
    field = lambda k: g(k).replace("_", " ")  # noqa: E731
    how = {
        "B1": f"you silently judge the agent by a criterion you never state: {_you(g('hidden_criterion'))}. Keep it "
              "to yourself (think about it in your reasoning) and show dissatisfaction when it is not met.",
        "B2": f"once the agent has made progress (after your turn {g('add_after_turn')}), add a requirement you did "
              f"not mention before: {_you(g('added_requirement'))}.",
        "B3": f"when the agent asks for your {field('withheld_field')}, do not give it (it is {g('withheld_value')}); "
              "dodge the question or answer only partly.",
        "B4": f"ask for this: \"{g('infeasible_request').rstrip('.')}\". When the agent explains it is not "
              "possible, keep "
              "insisting and ask again.",
        "B5": f"leave out your {field('withheld_field')} ({g('withheld_value')}) even when it would be needed, then "
              "later blame the agent for not figuring it out.",
        "B6": f"before your current issue is resolved (around your turn {g('switch_after_turn')}), abruptly switch to "
              f"a different request: {goal(g('second_subflow'))}.",
        "B7": "when the agent proposes steps, add constraints that rule them out: "
              + "; ".join(_you(x) for x in kw.get("constraints") or []) + ".",
        "B8": f"assert this false fact as if it were true: \"{g('false_premise').rstrip('.')}\" (your real "
              f"{field('premise_field')} is {g('true_value')}, but you claim {g('false_value')}).",
        "B9": f"you are under time pressure: {_you(g('pressure'))}. Push with urgency and complaints rather than "
              "useful corrections.",
        "B10": f"after your turn {g('abandon_after_turn')}, leave the conversation before your "
               f"{topic_name(g('abandoned_thread'))} issue is resolved.",
        "B11": f"first give your {field('contradicted_field')} as {g('original_value')}; later state it as "
               f"{g('contradicting_value')} without acknowledging the change.",
        "B12": "pack many requests into one message: " + "; ".join(str(x) for x in kw.get("requests") or []) + ".",
        "B13": f"you are entitled and belittling: {_you(g('entitlement'))}.",
    }[b]
    beh = TAXONOMY[b]
    return (f"Your behaviour in this conversation ({beh.definition}): {how} Enact it only through what you say, "
            "as a real customer would. Never describe, name or announce it (do not say that you are being "
            "difficult, impatient, contradictory and so on).")


def simulator_prompt(raw: str) -> str:
    """``raw`` (:func:`system_prompt`) in the ThoughtTrace layout the world's support conversations are
    trained in: all but the last two lines are the task, the last two the expectations
    (:func:`mimesis_lab.world.support.support_dialogue` splits it the same way)."""
    lines = raw.split("\n")
    return simulator_system_prompt("\n".join(lines[:-2]), "\n".join(lines[-2:]))


def system_prompt(sc: dict[str, Any], subflow: str, b: str, kw: dict[str, Any], budget: int) -> str:
    return "\n".join([
        "You are a customer chatting with an online store's customer-support agent. You are the customer, not "
        "the agent: never offer help or act as support.",
        f"Your goal: {goal(subflow)}.",
        "What you know (use only these facts; share them when it makes sense):", *_facts(sc),
        behavior_instruction(b, kw),
        f"You have at most {budget} messages. Write short, natural chat messages. Think privately inside "
        "<think>...</think> first, then write only what you say to the agent. When you are done or want to leave, "
        "say goodbye.",
    ])


_END = re.compile(r"###STOP###|\b(good ?bye|bye)\b|\b(no,? that'?s (all|it)|nothing else|that'?s everything)\b", re.I)


@register_task
class BehaviorEpisode(SimEpisode):
    """One rollout of one ABCD behaviour-task row (see the module docstring)."""

    data_source = DATA_SOURCE

    def __init__(self, row: dict[str, Any], ctx: TaskContext, rng: random.Random):
        super().__init__(row, ctx, rng)
        self.scenario = _json(row.get("scenario"), {})
        self.behavior, self.kwargs = row_behavior(row)
        if self.behavior not in TAXONOMY:
            raise ValueError(f"row {self.task_id}: unknown behaviour {self.behavior!r}")
        self.flow = str(row.get("flow") or self.scenario.get("flow") or "")
        self.subflow = str(row.get("subflow") or self.scenario.get("subflow") or "")
        self.turn_budget = episode_turn_budget(row, ctx.option(DATA_SOURCE, "turn_budget"))
        self.env_error: str | None = None
        self.system = simulator_prompt(system_prompt(self.scenario, self.subflow, self.behavior, self.kwargs,
                                                     self.turn_budget))
        try:
            self.agent: ABCDSupportAgent | None = ABCDSupportAgent(self.scenario, ctx.kb, ctx.guidelines,
                                                                   self.flow, self.subflow)
            self.public_log.extend(dict(t) for t in self.agent.opening())
        except Exception as exc:  # noqa: BLE001 — the partner failed: the rollout is invalid, not a crash
            self.agent, self.done = None, True
            self.env_error = f"agent failed to start: {type(exc).__name__}: {exc}"

    def messages(self) -> list[dict[str, str]]:
        out = [{"role": "system", "content": self.system}]
        for t in self.public_log:
            out.append({"role": "assistant" if t["role"] == "user" else "user", "content": t["content"]})
        return out

    def observe(self, parsed: ParsedReply, public: str) -> bool:
        if self.done:
            return True
        self.public_log.append({"role": "user", "content": public})
        self.private_log.append({"role": "user", "reasoning": parsed.reasoning, "content": public})
        if self.n_sim_turns >= self.turn_budget or _END.search(public) or self.agent is None:
            self.done = True
            return True
        try:
            reply = self.agent.reply(public)
        except Exception as exc:  # noqa: BLE001
            self.env_error = f"agent failed: {type(exc).__name__}: {exc}"
            self.done = True
            return True
        self.public_log.append({"role": "agent", "content": reply})
        return False

    def judge_request(self) -> BehaviorJudgeRequest:
        trace = TAXONOMY[self.behavior].needs_trace
        return BehaviorJudgeRequest(self.behavior, dict(self.kwargs), self.scenario, self.flow, self.subflow,
                                    [dict(t) for t in self.public_log],
                                    [dict(t) for t in self.private_log] if trace else None)

    def score(self, judge: Any) -> TaskScore:
        b = self.behavior
        if self.env_error:
            return TaskScore.failed("env_error", self.env_error, behavior=b)
        req = self.judge_request()
        try:
            v = judge.judge(req)
        except Exception as exc:  # noqa: BLE001 — judges should not raise; if one does, it is a judge failure
            return TaskScore.failed("judge_failure", f"judge raised {type(exc).__name__}: {exc}", behavior=b)
        if isinstance(v, JudgeFailure):
            return TaskScore.failed(v.reason, v.detail, behavior=b)
        try:
            raw = behavior_reward(v.exhibit, v.placement, v.naturalness, v.on_task, v.announced)
            gap = float(v.exhibit) - rule_check(req)
        except (ValueError, TypeError) as exc:
            return TaskScore.failed("judge_failure", f"invalid verdict: {exc}", behavior=b)
        comps = {"exhibit": float(v.exhibit), "placement": float(v.placement), "naturalness": float(v.naturalness),
                 "on_task": float(v.on_task), "announced": float(bool(v.announced)), "rule_judge_gap": gap}
        if b == "N":
            comps["cooperativeness"] = float(v.extras.get("cooperativeness", v.exhibit))
        return TaskScore(raw=raw, components=comps, labels={"behavior": b})


def _json(value: Any, default: Any) -> Any:
    if value is None or value == "":
        return default
    return json.loads(value) if isinstance(value, str) else value


#: behaviours whose kwargs say at which user turn they happen (``k``: the customer's earlier turns, so 2 = the
#: third message; the world's customer and the instruction "after your turn k" count the same way)
TIMING_KEYS = {"B2": "add_after_turn", "B6": "switch_after_turn", "B10": "abandon_after_turn"}


def row_behavior(row: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """A behaviour-task row's behaviour (its first id; ``N`` for an empty list) and kwargs (``{}`` for N)."""
    ids = _json(row.get("behavior_ids"), [])
    return (str(ids[0]), _json(row.get("kwargs"), {})) if ids else ("N", {})


def episode_turn_budget(row: dict[str, Any], override: int | None = None) -> int:
    """Simulator turns of the row's episode: ``override`` (``sim_rl.tasks.usersim_behavior.turn_budget``), else
    the row's ``turn_budget``, else 8."""
    return int(override if override is not None else row.get("turn_budget") or 8)


def unreachable_rows(rows: list[dict[str, Any]], turn_budget: int | None = None) -> list[str]:
    """Task ids of behaviour rows whose behaviour is timed past the episode's last simulator turn: a row's
    :data:`TIMING_KEYS` kwarg ``k`` needs turn ``k + 1`` of at most ``turn_budget`` (the override, else the row's
    own ``turn_budget``). Such an instruction cannot be enacted, so its GRPO group gets no exhibit variance
    (kwargs built for a longer budget than ``sim_rl.tasks.usersim_behavior.turn_budget``)."""
    out = []
    for row in rows:
        behavior, kwargs = row_behavior(row)
        at = kwargs.get(TIMING_KEYS.get(behavior, ""))
        if at is not None and int(at) > episode_turn_budget(row, turn_budget) - 1:
            out.append(str(row.get("task_id")))
    return out


def load_behavior_rows(path: str | Path) -> list[dict[str, Any]]:
    """The ``usersim_behavior`` rows of a behaviour-task parquet, as dicts
    (:class:`~mimesis_lab.io.ParquetReadError` if it cannot be read)."""
    import polars as pl

    from mimesis_lab.io import read_parquet

    df = read_parquet(path, "behaviour-task rows")
    if "data_source" in df.columns:
        df = df.filter(pl.col("data_source") == DATA_SOURCE)
    return df.to_dicts()
