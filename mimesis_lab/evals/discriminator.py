"""Human-vs-simulated discriminator for the SimulatorArena-style Turing distance (SPEC §4.1).

Input: the human conversations and the simulated ones, each a list of user-turn strings, with a
*group* per conversation — the held-out conversation it comes from (a real conversation and its
simulated re-play share the group). Output: :class:`DiscriminatorResult` with the accuracy in
percent over the conversations that could be classified (``turing_distance = |a - 50|``), the
per-conversation predictions and the number of failures (excluded, never scored as wrong).

:class:`RuleDiscriminator` (offline default): a **nearest-centroid** classifier over transparent
style features of a conversation's user turns (:data:`STYLE_FEATURES`, :func:`style_features`),
z-scored with the training fold's mean and standard deviation. Evaluated with **leave-one-group-out
cross-validation**: to classify the conversations of group ``g`` it is fit on every *other* group,
so it never scores a conversation it was fit on, nor the simulated twin of a human conversation
(which would leak the shared context and, with identical human and simulated sets, push the
accuracy to 0 instead of 50). A tie in distance predicts ``human``. A fold whose training part
lacks one of the two classes cannot classify: its conversations count as failures.

:class:`OpenAIDiscriminator`: an LLM answers ``{"label": "human"|"simulated"}`` per conversation
(strict JSON, bounded retries); unparsable answers are counted as parse failures and a conversation
without a valid answer after the retries is a failure, excluded from the accuracy (its prediction
has ``error`` and ``transient``: whether the retries ran out on a timeout, transport error, 429 or 5xx).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Hashable, Sequence

from mimesis_lab.endpoint import EndpointFailure, JsonJudgeClient, json_answer
from mimesis_lab.envs.usersim_tasks import has_politeness, words
from mimesis_lab.evals.fidelity_judge import technical_share

__all__ = ["STYLE_FEATURES", "style_features", "DiscriminatorResult", "RuleDiscriminator", "OpenAIDiscriminator",
           "make_discriminator", "HUMAN", "SIMULATED"]

HUMAN, SIMULATED = "human", "simulated"
STYLE_FEATURES = ("words_per_turn", "words_sd", "question_rate", "exclamation_rate", "politeness_rate",
                  "lowercase_start_rate", "technical_share", "non_ascii_share", "type_token_ratio",
                  "mean_word_length")


def style_features(turns: Sequence[str]) -> list[float]:
    """:data:`STYLE_FEATURES` of one conversation's user turns (all 0 for no turns)."""
    turns = [str(t) for t in turns]
    if not turns:
        return [0.0] * len(STYLE_FEATURES)
    n = len(turns)
    counts = [len(words(t)) for t in turns]
    mean = sum(counts) / n
    sd = math.sqrt(sum((c - mean) ** 2 for c in counts) / n)
    ws = [w for t in turns for w in words(t)]
    chars = "".join(turns)
    return [
        mean, sd,
        sum("?" in t for t in turns) / n,
        sum("!" in t for t in turns) / n,
        sum(has_politeness(t) for t in turns) / n,
        sum(t.strip()[:1].islower() for t in turns) / n,
        technical_share(turns),
        (sum(ord(c) > 127 for c in chars) / len(chars)) if chars else 0.0,
        (len(set(ws)) / len(ws)) if ws else 0.0,
        (sum(len(w) for w in ws) / len(ws)) if ws else 0.0,
    ]


@dataclass
class DiscriminatorResult:
    accuracy: float | None          # percent over classified conversations (None: nothing classified)
    n_scored: int
    n_failed: int
    parse_failures: int = 0
    predictions: list[dict[str, Any]] = field(default_factory=list)


def _result(preds: list[dict[str, Any]], parse_failures: int = 0) -> DiscriminatorResult:
    scored = [p for p in preds if p["predicted"] is not None]
    acc = 100.0 * sum(p["predicted"] == p["label"] for p in scored) / len(scored) if scored else None
    return DiscriminatorResult(acc, len(scored), len(preds) - len(scored), parse_failures, preds)


class RuleDiscriminator:
    """Nearest centroid over z-scored style features, leave-one-group-out (see the module docstring)."""

    kind = "rule"
    identity = "rule:nearest-centroid(style features, z-scored), leave-one-conversation-group-out CV"

    def classify(self, human: Sequence[Sequence[str]], simulated: Sequence[Sequence[str]],
                 human_groups: Sequence[Hashable] | None = None,
                 sim_groups: Sequence[Hashable] | None = None) -> DiscriminatorResult:
        hg = list(human_groups) if human_groups is not None else [("h", i) for i in range(len(human))]
        sg = list(sim_groups) if sim_groups is not None else [("s", i) for i in range(len(simulated))]
        if len(hg) != len(human) or len(sg) != len(simulated):
            raise ValueError("one group per conversation is needed")
        items = [(style_features(t), HUMAN, g, i) for i, (t, g) in enumerate(zip(human, hg))] + \
                [(style_features(t), SIMULATED, g, i) for i, (t, g) in enumerate(zip(simulated, sg))]
        preds: list[dict[str, Any]] = []
        for g in dict.fromkeys(x[2] for x in items):
            train = [x for x in items if x[2] != g]
            test = [x for x in items if x[2] == g]
            model = self._fit(train)
            for feats, label, _, idx in test:
                preds.append({"group": g, "index": idx, "label": label,
                              "predicted": self._predict(model, feats) if model else None})
        return _result(preds)

    @staticmethod
    def _fit(train: list[tuple[list[float], str, Any, int]]):
        if not any(x[1] == HUMAN for x in train) or not any(x[1] == SIMULATED for x in train):
            return None
        k = len(train[0][0])
        mu = [sum(x[0][j] for x in train) / len(train) for j in range(k)]
        sd = [math.sqrt(sum((x[0][j] - mu[j]) ** 2 for x in train) / len(train)) or 1.0 for j in range(k)]
        z = lambda v: [(v[j] - mu[j]) / sd[j] for j in range(k)]  # noqa: E731
        cents = {}
        for lab in (HUMAN, SIMULATED):
            zs = [z(x[0]) for x in train if x[1] == lab]
            cents[lab] = [sum(r[j] for r in zs) / len(zs) for j in range(k)]
        return z, cents

    @staticmethod
    def _predict(model, feats: list[float]) -> str:
        z, cents = model
        v = z(feats)
        d = {lab: sum((a - b) ** 2 for a, b in zip(v, c)) for lab, c in cents.items()}
        return SIMULATED if d[SIMULATED] < d[HUMAN] - 1e-12 else HUMAN


LABEL_SCHEMA = {"type": "object", "properties": {"label": {"type": "string", "enum": [HUMAN, SIMULATED]}},
                "required": ["label"], "additionalProperties": False}


def _label(obj: Any) -> str:
    """The ``label`` of a strict ``{"label": "human"|"simulated"}`` answer (``ValueError`` otherwise)."""
    if not isinstance(obj, dict) or set(obj) != {"label"} or obj["label"] not in (HUMAN, SIMULATED):
        raise ValueError(f"not a label object: {json.dumps(obj)[:100]}")
    return obj["label"]


class OpenAIDiscriminator(JsonJudgeClient):
    """An LLM labels each conversation ``human`` or ``simulated`` (strict JSON, retries, never raises)."""

    def _one(self, turns: Sequence[str]) -> tuple[str | None, int, EndpointFailure | None]:
        convo = "\n".join(f"[user turn {k + 1}] {t}" for k, t in enumerate(turns))
        body = {"model": self.endpoint.model, "temperature": self.endpoint.temperature,
                "response_format": {"type": "json_schema", "json_schema": {"name": "turing_label", "strict": True,
                                                                           "schema": LABEL_SCHEMA}},
                "messages": [{"role": "system", "content": "Here are the user's messages of a chat with an AI "
                              "assistant. Were they written by a real human or by a user simulator (a language "
                              "model)? Answer with the JSON object {\"label\": \"human\"|\"simulated\"} only."},
                             {"role": "user", "content": convo}]}
        res = self.chat.call(body, json_answer(_label))
        return res.value, res.count("invalid"), res.failure

    def classify(self, human: Sequence[Sequence[str]], simulated: Sequence[Sequence[str]],
                 human_groups: Sequence[Hashable] | None = None,
                 sim_groups: Sequence[Hashable] | None = None) -> DiscriminatorResult:
        preds, parse = [], 0
        for label, convs, groups in ((HUMAN, human, human_groups), (SIMULATED, simulated, sim_groups)):
            for i, turns in enumerate(convs):
                pred, p, failure = self._one(turns)
                parse += p
                preds.append({"group": groups[i] if groups is not None else i, "index": i, "label": label,
                              "predicted": pred, "error": failure.detail if failure else None,
                              "transient": failure.transient if failure else None})
        return _result(preds, parse)


def make_discriminator(cfg: Any, client: Any = None) -> RuleDiscriminator | OpenAIDiscriminator:
    """``cfg.kind`` ``rule`` | ``openai`` (a :class:`~mimesis_lab.config_eval.DiscriminatorParams`)."""
    if cfg.kind == "rule":
        return RuleDiscriminator()
    if cfg.kind == "openai":
        return OpenAIDiscriminator(cfg.openai, client)
    raise ValueError(f"unknown discriminator kind {cfg.kind!r} (expected 'rule' or 'openai')")
