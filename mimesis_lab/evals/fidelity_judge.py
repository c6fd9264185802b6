"""RealUserSim-style fidelity judge (SPEC §4.1): does the simulated user match the real one, per dimension?

One :class:`FidelityRequest` holds one held-out conversation's context (the system prompt with
``Task:`` / ``Expectations:`` / ``User profile:``), the **real** user turns and the **simulated**
user turns (public utterances only, reasoning removed) that answered the same assistant. A judge
returns ``m_d ∈ {0, 1}`` for each of :data:`DIMENSIONS` (:class:`FidelityVerdict`) or a
:class:`FidelityFailure` — never a silent 0 (the caller counts failures and excludes them).

:class:`RuleFidelityJudge` (offline default) compares transparent features of the real and the
simulated user turns; each dimension is a thresholded 0/1 (thresholds in :data:`THRESHOLDS`):

- **persona** = 1 iff the simulated turns add no profile contradiction
  (:func:`~mimesis_lab.envs.usersim_tasks.profile_contradictions`) and no assistant-like phrasing
  (:func:`~mimesis_lab.envs.usersim_tasks.is_assistant_like`) that the real turns do not have, and
  ``grounding(sim) >= persona_min_ratio * grounding(real)``; grounding = share of the content stems
  of task + expectations + profile that the user turns use.
- **style** = 1 iff ``min/max`` of the mean words per turn ``>= style_length_ratio_min`` and at
  least ``style_min_agree`` of three per-turn rates — politeness markers, ``?`` questions, turns
  starting lower-case — differ by at most ``style_rate_tol``.
- **technical_competency** = 1 iff the technical-token shares (:func:`technical_share`: code
  symbols, camelCase / snake_case, letter-digit mixes, decimal numbers, code fences) differ by at
  most ``tech_share_tol``.
- **information_flow** = 1 iff, over the task facts (:func:`~mimesis_lab.evals.user_stats.task_facts`)
  stated by either user, the share first stated **at the same user turn** by both is at least
  ``info_min_agreement`` (no fact stated by either → 1).
- **pacing** = 1 iff the numbers of user turns differ by at most ``pacing_turn_tol`` and the mean,
  over aligned turns, of ``min/max`` word counts is at least ``pacing_length_ratio_min``.

Identical real and simulated turns match on every dimension (every comparison is relative).

:class:`OpenAIFidelityJudge` asks an LLM (the shared loop :meth:`mimesis_lab.endpoint.ChatEndpoint.call`)
for a strict JSON verdict ``{persona, style, technical_competency, information_flow, pacing: bool,
rationale}``, retrying up to ``endpoint.max_retries`` times; each unparsable / schema-invalid answer
is counted (``parse_failures``), and after the last try the result is a :class:`FidelityFailure`
(``transient`` when the retries ran out on a timeout, transport error, 429 or 5xx).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Sequence

from mimesis_lab.endpoint import JsonJudgeClient, json_answer
from mimesis_lab.envs.usersim_tasks import (
    has_politeness, is_assistant_like, parse_system_prompt, profile_contradictions, words,
)
from mimesis_lab.evals.user_stats import first_disclosure, stems, task_facts

__all__ = ["DIMENSIONS", "THRESHOLDS", "FidelityRequest", "FidelityVerdict", "FidelityFailure", "RuleFidelityJudge",
           "OpenAIFidelityJudge", "make_fidelity_judge", "technical_share", "rule_features", "VERDICT_SCHEMA"]

DIMENSIONS: tuple[str, ...] = ("persona", "style", "technical_competency", "information_flow", "pacing")

#: documented thresholds of the rule judge (see the module docstring)
THRESHOLDS: dict[str, float] = {
    "persona_min_ratio": 0.5,
    "style_length_ratio_min": 0.5,
    "style_rate_tol": 0.5,
    "style_min_agree": 2,
    "tech_share_tol": 0.10,
    "info_min_agreement": 0.5,
    "pacing_turn_tol": 0,
    "pacing_length_ratio_min": 0.4,
}

_TECH = re.compile(r"[{}\[\]()<>=_\\/$`#;|^~*]|[a-z][A-Z]|[A-Za-z]\d|\d[A-Za-z]|^\d+\.\d+$")


@dataclass
class FidelityRequest:
    conversation_id: str
    system_prompt: str
    real_turns: list[str]          # the real user's turns (truncated to what the simulator could say)
    sim_turns: list[str]           # the simulated user's public turns
    assistant_turns: list[str] = field(default_factory=list)   # what the user answered (for LLM judges)


@dataclass
class FidelityVerdict:
    matches: dict[str, int]
    features: dict[str, Any] = field(default_factory=dict)
    rationale: str = ""
    parse_failures: int = 0
    recovered_retries: int = 0     # failed endpoint attempts before this verdict (LLM judge)


@dataclass
class FidelityFailure:
    reason: str                    # "judge_failure" | "timeout"
    detail: str
    parse_failures: int = 0
    transient: bool = False        # the endpoint's retries ran out on a timeout / transport / 429 / 5xx


# ----------------------------------------------------------------------------- features
def technical_share(turns: Sequence[str]) -> float:
    """Share of whitespace tokens that look technical (see the module docstring); code fences count as 1."""
    toks = [t for turn in turns for t in str(turn).split()]
    if not toks:
        return 0.0
    return sum(1 for t in toks if "```" in t or _TECH.search(t)) / len(toks)


def _mean_words(turns: Sequence[str]) -> float:
    return sum(len(words(t)) for t in turns) / len(turns) if turns else 0.0


def _ratio(a: float, b: float) -> float:
    return 1.0 if a == b == 0 else min(a, b) / max(a, b)


def _rate(turns: Sequence[str], pred) -> float:
    return sum(1 for t in turns if pred(t)) / len(turns) if turns else 0.0


def _grounding(turns: Sequence[str], context: set[str]) -> float:
    if not context:
        return 0.0
    said = set().union(*(stems(t) for t in turns)) if turns else set()
    return len(said & context) / len(context)


def rule_features(req: FidelityRequest) -> dict[str, Any]:
    """The per-side features the rule judge compares (also written to the records)."""
    info = parse_system_prompt(req.system_prompt)
    ctx = stems(f"{info['task']} {info['expectations']} {info['profile_text']}")
    real, sim = list(req.real_turns), list(req.sim_turns)
    facts = task_facts(req.system_prompt)
    fr, fs = first_disclosure(real, facts), first_disclosure(sim, facts)
    union = [f for f in facts if fr[f] is not None or fs[f] is not None]

    def side(turns: Sequence[str]) -> dict[str, Any]:
        return {
            "turns": len(turns), "words_per_turn": _mean_words(turns),
            "politeness_rate": _rate(turns, has_politeness), "question_rate": _rate(turns, lambda t: "?" in t),
            "lowercase_start_rate": _rate(turns, lambda t: t.strip()[:1].islower()),
            "technical_share": technical_share(turns), "grounding": _grounding(turns, ctx),
            "contradictions": sum(len(profile_contradictions(t, info["profile"])) for t in turns),
            "assistant_like": sum(1 for t in turns if is_assistant_like(t)),
            "turn_words": [len(words(t)) for t in turns],
        }

    return {"real": side(real), "sim": side(sim), "facts": len(facts), "facts_stated": len(union),
            "info_agreement": (sum(1 for f in union if fr[f] == fs[f]) / len(union)) if union else 1.0}


class RuleFidelityJudge:
    """Deterministic feature comparison (offline default); see the module docstring."""

    kind = "rule"
    identity = "rule:fidelity_judge.RuleFidelityJudge(v1)"

    def __init__(self, thresholds: dict[str, float] | None = None):
        self.t = dict(THRESHOLDS, **(thresholds or {}))

    def judge(self, req: FidelityRequest) -> FidelityVerdict | FidelityFailure:
        if not req.real_turns or not req.sim_turns:
            return FidelityFailure("judge_failure", "nothing to compare: "
                                   f"{len(req.real_turns)} real and {len(req.sim_turns)} simulated user turns")
        t, f = self.t, rule_features(req)
        r, s = f["real"], f["sim"]
        persona = (s["contradictions"] <= r["contradictions"] and s["assistant_like"] <= r["assistant_like"]
                   and s["grounding"] >= t["persona_min_ratio"] * r["grounding"])
        agree = sum(abs(s[k] - r[k]) <= t["style_rate_tol"]
                    for k in ("politeness_rate", "question_rate", "lowercase_start_rate"))
        style = _ratio(s["words_per_turn"], r["words_per_turn"]) >= t["style_length_ratio_min"] \
            and agree >= t["style_min_agree"]
        tech = abs(s["technical_share"] - r["technical_share"]) <= t["tech_share_tol"]
        info = f["info_agreement"] >= t["info_min_agreement"]
        aligned = list(zip(r["turn_words"], s["turn_words"]))
        len_ratio = sum(_ratio(a, b) for a, b in aligned) / len(aligned)
        pacing = abs(s["turns"] - r["turns"]) <= t["pacing_turn_tol"] and len_ratio >= t["pacing_length_ratio_min"]
        f["pacing_length_ratio"] = len_ratio
        f["style_rates_agreeing"] = agree
        matches = {"persona": int(persona), "style": int(style), "technical_competency": int(tech),
                   "information_flow": int(info), "pacing": int(pacing)}
        return FidelityVerdict(matches, f, "rule: " + ", ".join(f"{k}={v}" for k, v in matches.items()))


# ----------------------------------------------------------------------------- LLM judge
VERDICT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {**{d: {"type": "boolean"} for d in DIMENSIONS}, "rationale": {"type": "string"}},
    "required": [*DIMENSIONS, "rationale"],
    "additionalProperties": False,
}
RESPONSE_FORMAT = {"type": "json_schema",
                   "json_schema": {"name": "fidelity_verdict", "strict": True, "schema": VERDICT_SCHEMA}}


def _validate(obj: Any) -> FidelityVerdict:
    keys = set(VERDICT_SCHEMA["required"])
    if not isinstance(obj, dict) or set(obj) != keys:
        raise ValueError(f"answer must be an object with exactly the keys {sorted(keys)}")
    for d in DIMENSIONS:
        if not isinstance(obj[d], bool):
            raise ValueError(f"{d} must be a boolean, got {obj[d]!r}")
    if not isinstance(obj["rationale"], str):
        raise ValueError("rationale must be a string")
    return FidelityVerdict({d: int(obj[d]) for d in DIMENSIONS}, {}, obj["rationale"])


def judge_messages(req: FidelityRequest) -> list[dict[str, str]]:
    def block(turns: Sequence[str]) -> str:
        lines = []
        for k, u in enumerate(turns):
            lines.append(f"[user turn {k + 1}] {u}")
            if k < len(req.assistant_turns) and k + 1 < len(turns):
                lines.append(f"[assistant] {req.assistant_turns[k][:1500]}")
        return "\n".join(lines)

    system = ("You compare a SIMULATED user with the REAL user of the same conversation (same profile, same "
              "task, same assistant replies). For each dimension answer true if the simulated user matches the "
              "real one: persona (who they are, their profile and goal), style (length, tone, punctuation, "
              "casing, politeness), technical_competency (technical vocabulary, code), information_flow (which "
              "facts of the task they reveal and at which turn), pacing (number of turns, turn lengths, when "
              "they stop). Answer with the JSON object only.")
    user = (f"Context given to both users:\n{req.system_prompt}\n\nREAL user:\n{block(req.real_turns)}\n\n"
            f"SIMULATED user:\n{block(req.sim_turns)}")
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


class OpenAIFidelityJudge(JsonJudgeClient):
    """LLM fidelity judge (strict JSON, bounded retries, never raises)."""

    def judge(self, req: FidelityRequest) -> FidelityVerdict | FidelityFailure:
        body = {"model": self.endpoint.model, "temperature": self.endpoint.temperature,
                "messages": judge_messages(req), "response_format": RESPONSE_FORMAT}
        res = self.chat.call(body, json_answer(_validate))
        parse = res.count("invalid")
        if res.ok:
            v = res.value
            v.parse_failures, v.recovered_retries = parse, res.recovered_retries
            return v
        f = res.failure
        return FidelityFailure("timeout" if f.reason == "timeout" else "judge_failure", f.detail, parse, f.transient)


def make_fidelity_judge(judge_cfg: Any, client: Any = None) -> RuleFidelityJudge | OpenAIFidelityJudge:
    """``judge_cfg.kind`` ``rule`` → :class:`RuleFidelityJudge`; ``openai`` → :class:`OpenAIFidelityJudge`."""
    if judge_cfg.kind == "rule":
        return RuleFidelityJudge()
    if judge_cfg.kind == "openai":
        return OpenAIFidelityJudge(judge_cfg.openai, client)
    raise ValueError(f"unknown fidelity judge kind {judge_cfg.kind!r} (expected 'rule' or 'openai')")
