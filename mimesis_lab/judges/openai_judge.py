"""LLM behaviour judge of the ABCD behaviour task (SPEC §2.4); the rule judge is :mod:`.behavior_judge`.

:class:`OpenAIJudge` posts one :class:`~mimesis_lab.judges.verdict.BehaviorJudgeRequest` to
``{base_url}/chat/completions`` with :data:`RESPONSE_FORMAT` (strict JSON schema :data:`VERDICT_SCHEMA`)
through the shared retry loop (:meth:`mimesis_lab.endpoint.ChatEndpoint.call`), validates the answer with
:func:`validate_verdict` and retries a bad answer, a timeout, a transport error or an HTTP 429/5xx at most
``endpoint.max_retries`` times (``k * backoff_s`` between tries). It never raises: the result is a
:class:`~mimesis_lab.judges.verdict.Verdict` (``recovered_retries`` counts the failed tries before it) or a
:class:`~mimesis_lab.judges.verdict.JudgeFailure` (``judge_failure`` | ``timeout``, ``transient``, and ``kind``:
the endpoint's failure reason). ``judge(req, deadline=t)`` stops its retries at ``t`` (``timeout``).
``workers`` and ``deadline_s`` are read by :func:`mimesis_lab.rollout.sim_rollout.score_rollouts`, which
judges a batch on ``workers`` threads under one ``deadline_s``.
:func:`judge_messages` builds the prompt (the user's private reasoning only when a private log is given).
Build either judge kind with :func:`mimesis_lab.judges.behavior_judge.make_judge`.
"""
from __future__ import annotations

import json
import math
from typing import Any

import httpx

from mimesis_lab.behaviors import TAXONOMY
from mimesis_lab.config import OpenAIEndpoint
from mimesis_lab.endpoint import ChatEndpoint, json_answer
from mimesis_lab.judges.verdict import SCORE_KEYS, BehaviorJudgeRequest, JudgeFailure, Verdict, check_request

__all__ = ["OpenAIJudge", "validate_verdict", "judge_messages", "VERDICT_SCHEMA", "RESPONSE_FORMAT"]

_NUM_PROP = {"type": "number", "description": "a score between 0 and 1"}
VERDICT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {**{k: dict(_NUM_PROP) for k in SCORE_KEYS}, "announced": {"type": "boolean"},
                   "rationale": {"type": "string"}},
    "required": [*SCORE_KEYS, "announced", "rationale"],
    "additionalProperties": False,
}
RESPONSE_FORMAT: dict[str, Any] = {
    "type": "json_schema", "json_schema": {"name": "behavior_verdict", "strict": True, "schema": VERDICT_SCHEMA}}
RETRY_BACKOFF_S = 1.0
WORKERS = 8              # concurrent judge calls of one batch
DEADLINE_S = 900.0       # overall seconds for one batch's judge calls (then the rest are invalid ``timeout``)


def validate_verdict(obj: Any) -> Verdict:
    """Schema check of a judge answer; ``ValueError`` naming the first problem."""
    keys = set(VERDICT_SCHEMA["required"])
    if not isinstance(obj, dict):
        raise ValueError("answer must be a JSON object")
    if set(obj) != keys:
        extra, missing = sorted(set(obj) - keys), sorted(keys - set(obj))
        raise ValueError(f"keys must be {sorted(keys)} (extra {extra}, missing {missing})")
    for k in SCORE_KEYS:
        v = obj[k]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not 0 <= v <= 1:
            raise ValueError(f"{k} must be a number in [0, 1], got {v!r}")
    if not isinstance(obj["announced"], bool):
        raise ValueError(f"announced must be a boolean, got {obj['announced']!r}")
    if not isinstance(obj["rationale"], str):
        raise ValueError("rationale must be a string")
    return Verdict(*(float(obj[k]) for k in SCORE_KEYS), obj["announced"], obj["rationale"])


def judge_messages(req: BehaviorJudgeRequest) -> list[dict[str, str]]:
    b = TAXONOMY[req.behavior_id]
    target = ("N (neutral): the user should simply cooperate. `exhibit` is the user's cooperativeness (answers the "
              "agent's questions with the scenario's facts, follows the steps, no difficult behaviour)."
              if b.id == "N" else f"{b.id} {b.name}: the user {b.definition}.\nBehaviour parameters: "
              f"{json.dumps(req.kwargs, ensure_ascii=False, sort_keys=True)}")
    system = (
        "You judge a simulated customer (the USER) talking to a customer-support agent (ABCD). The simulator was "
        f"asked to enact one behaviour.\nTarget behaviour: {target}\n\nScore each in [0, 1]:\n"
        "- exhibit: how clearly and fully the user enacts the target behaviour through what they say;\n"
        "- placement: whether the behaviour appears at a fitting point of the dialogue (after the relevant agent "
        "turn, when progress makes it meaningful, within the conversation);\n"
        "- naturalness: sounds like a real customer (human length, not repetitive, no role confusion, no meta "
        "talk);\n- on_task: consistent with the scenario's facts and support topic.\n"
        "announced: true if the user *describes or names* the behaviour (e.g. 'I will now act impatient') "
        "instead of enacting it.\nrationale: one or two sentences. Answer with the JSON object only.")
    lines = []
    priv = [str(t.get("reasoning") or "") for t in (req.private_log or [])]
    k = 0
    for i, t in enumerate(req.public_log):
        role = "USER" if t.get("role") == "user" else "AGENT"
        lines.append(f"[{i}] {role}: {t.get('content', '')}")
        if role == "USER":
            if req.private_log is not None and k < len(priv) and priv[k]:
                lines.append(f"    (user's private reasoning: {priv[k]})")
            k += 1
    user = (f"Scenario ({req.flow} / {req.subflow}):\n{json.dumps(req.scenario, ensure_ascii=False, sort_keys=True)}"
            "\n\nConversation:\n" + "\n".join(lines))
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


class OpenAIJudge:
    """LLM judge over ``{base_url}/chat/completions`` (strict JSON schema, bounded retries, never raises)."""

    kind = "openai"

    def __init__(self, endpoint: OpenAIEndpoint, client: httpx.Client | None = None, backoff_s: float | None = None,
                 workers: int = WORKERS, deadline_s: float = DEADLINE_S):
        if workers < 1 or deadline_s <= 0:
            raise ValueError(f"workers must be >= 1 and deadline_s > 0, got {workers}, {deadline_s}")
        self.endpoint = endpoint
        self.backoff_s = RETRY_BACKOFF_S if backoff_s is None else backoff_s
        self.workers, self.deadline_s = workers, deadline_s
        self.chat = ChatEndpoint(endpoint, client, backoff_s=self.backoff_s)

    def close(self) -> None:
        self.chat.close()

    def request_body(self, req: BehaviorJudgeRequest) -> dict[str, Any]:
        return {"model": self.endpoint.model, "temperature": self.endpoint.temperature,
                "messages": judge_messages(req), "response_format": RESPONSE_FORMAT}

    def judge(self, req: BehaviorJudgeRequest, *, deadline: float | None = None) -> Verdict | JudgeFailure:
        bad = check_request(req)
        if bad:
            return JudgeFailure("judge_failure", bad, kind="request")
        res = self.chat.call(self.request_body(req), json_answer(validate_verdict), deadline=deadline)
        if not res.ok:
            f = res.failure
            return JudgeFailure("timeout" if f.reason in ("timeout", "deadline") else "judge_failure", f.detail,
                                f.transient, f.reason)
        v = res.value
        v.recovered_retries = res.recovered_retries
        if req.behavior_id == "N":
            v.extras["cooperativeness"] = v.exhibit
        return v
