"""LLM behaviour annotator over an OpenAI-compatible ``/chat/completions`` endpoint.

The request asks for structured output (``response_format`` = strict JSON schema
``behavior_annotations``: ``{"annotations": [{behavior, turns, quote, severity,
rationale}]}``). The answer is parsed and checked with
:func:`mimesis_lab.behaviors.validate_annotations` (behaviour in B1..B13|N, turns that
exist, severity 1..3, strings). The request goes through the shared retry loop
(:meth:`mimesis_lab.endpoint.ChatEndpoint.call`): a timeout, transport error, HTTP 429/5xx,
a body that is not JSON, a missing message or a schema-violating answer is retried up to
``max_retries`` times (another HTTP 4xx or a refusal is final at once); after that the
result is a failure carrying the last reason and whether it was transient — the stage
quarantines the conversation (``annotator: …``), it is never dropped or turned into ``N``
silently.

:meth:`OpenAIAnnotator.annotate_all` annotates a stage's conversations on ``workers`` threads
under one overall deadline (``deadline_s``; each call's retries honour it): a conversation not
annotated by then fails with ``timeout: …`` (reason ``deadline`` or ``late``). Every outcome is
counted by reason in :attr:`OpenAIAnnotator.tally` (:class:`mimesis_lab.endpoint.Tally`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import httpx

from mimesis_lab.behaviors import ALL_CODES, TAXONOMY, Turn, serialize_conversation, validate_annotations
from mimesis_lab.config import OpenAIEndpoint
from mimesis_lab.endpoint import ChatEndpoint, Tally, json_answer, map_with_deadline

ANNOTATION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "annotations": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "behavior": {"type": "string", "enum": list(ALL_CODES)},
                    "turns": {"type": "array", "items": {"type": "integer"}},
                    "quote": {"type": "string"},
                    "severity": {"type": "integer", "enum": [1, 2, 3]},
                    "rationale": {"type": "string"},
                },
                "required": ["behavior", "turns", "quote", "severity", "rationale"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["annotations"],
    "additionalProperties": False,
}

RETRY_BACKOFF_S = 1.0  # seconds; the k-th retry waits k * this
WORKERS = 8            # concurrent annotation calls of one stage run
DEADLINE_S = 3600.0    # overall seconds for all of a stage run's conversations

RESPONSE_FORMAT: dict[str, Any] = {
    "type": "json_schema",
    "json_schema": {"name": "behavior_annotations", "strict": True, "schema": ANNOTATION_SCHEMA},
}


def system_prompt() -> str:
    codes = "\n".join(
        f"- {b.id} {b.name}: {b.definition}" + (" (may be coded from the self-reports alone)" if b.needs_trace else "")
        for b in TAXONOMY.values()
    )
    return (
        "You annotate human-AI conversations for realistic user behaviours. Each numbered turn is a USER or "
        "ASSISTANT message; user turns carry the user's self-reported reasons for sending them, assistant turns "
        "the user's self-reported reactions to that reply. Behaviours such as noncooperation and "
        "contradiction are relations between turns.\n\nCodes:\n" + codes + "\n\n"
        "Return every behaviour the USER exhibits, at most one annotation per code: `turns` are the 0-based "
        "turn indices involved, `quote` the most telling excerpt (at most 200 characters), `severity` 1 (mild) "
        "to 3 (strong), `rationale` one sentence. If the user exhibits none, return exactly one `N` annotation "
        "with empty turns."
    )


@dataclass
class AnnotatorResult:
    """``annotations`` on success, else ``error`` (the last failure's detail), ``reason`` (its kind:
    ``http``, ``timeout``, ``deadline``, ``late``, …) and ``transient`` (the retries ran out on a timeout,
    transport error, 429 or 5xx, or the deadline passed: a later run may succeed)."""

    annotations: list[dict[str, Any]] | None
    error: str | None = None
    attempts: int = 0
    errors: list[str] = field(default_factory=list)
    transient: bool = False
    recovered_retries: int = 0     # failed attempts before the annotations that were used
    reason: str | None = None

    @property
    def ok(self) -> bool:
        return self.annotations is not None


class OpenAIAnnotator:
    """Annotates conversations through ``{base_url}/chat/completions`` with bounded retries
    (the shared loop :meth:`mimesis_lab.endpoint.ChatEndpoint.call`, linear backoff)."""

    def __init__(self, endpoint: OpenAIEndpoint, client: httpx.Client | None = None,
                 backoff_s: float | None = None, workers: int = WORKERS, deadline_s: float = DEADLINE_S):
        if workers < 1 or deadline_s <= 0:
            raise ValueError(f"workers must be >= 1 and deadline_s > 0, got {workers}, {deadline_s}")
        self.endpoint = endpoint
        self.backoff_s = RETRY_BACKOFF_S if backoff_s is None else backoff_s
        self.workers, self.deadline_s = workers, deadline_s
        self.chat = ChatEndpoint(endpoint, client, backoff_s=self.backoff_s)
        self.tally = Tally()

    def close(self) -> None:
        self.chat.close()

    def __enter__(self) -> "OpenAIAnnotator":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def request_body(self, turns: Sequence[Turn]) -> dict[str, Any]:
        return {
            "model": self.endpoint.model,
            "temperature": self.endpoint.temperature,
            "messages": [
                {"role": "system", "content": system_prompt()},
                {"role": "user", "content": serialize_conversation(turns)},
            ],
            "response_format": RESPONSE_FORMAT,
        }

    def annotate(self, turns: Sequence[Turn], *, deadline: float | None = None) -> AnnotatorResult:
        """One conversation (``deadline``: a :func:`time.monotonic` value the retries stop at)."""
        n_turns = len(turns)
        res = self.chat.call(self.request_body(turns), json_answer(lambda obj: validate_annotations(obj, n_turns)),
                             deadline=deadline)
        errors = [e.detail for e in res.errors]
        if res.ok:
            self.tally.record(ok=True, recovered_retries=res.recovered_retries)
            return AnnotatorResult(res.value, None, res.attempts, errors, recovered_retries=res.recovered_retries)
        f = res.failure
        self.tally.record(ok=False, reason=f.reason, transient=f.transient)
        detail = f"timeout: {f.detail}" if f.reason == "deadline" else f.detail
        return AnnotatorResult(None, detail, res.attempts, errors, transient=f.transient, reason=f.reason)

    def annotate_all(self, conversations: Sequence[Sequence[Turn]]) -> list[AnnotatorResult]:
        """Every conversation, ``workers`` at a time, under one ``deadline_s``; results in input order (one
        still unfinished at the deadline fails ``timeout: …``, reason ``late``)."""
        batch = map_with_deadline(lambda turns, deadline: self.annotate(turns, deadline=deadline), conversations,
                                  workers=self.workers, deadline_s=self.deadline_s)
        out = batch.results
        for i in batch.late:
            self.tally.record(ok=False, reason="late", transient=True)
            out[i] = AnnotatorResult(None, f"timeout: the annotation deadline of {self.deadline_s:g}s passed before "
                                           f"this conversation was annotated ({len(batch.late)} of "
                                           f"{len(conversations)} late)", transient=True, reason="late")
        return out
