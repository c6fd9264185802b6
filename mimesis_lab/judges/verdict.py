"""What a behaviour judge is asked and what it answers (SPEC §2.4): the contract both judges implement.

:class:`BehaviorJudgeRequest` (behaviour + kwargs, scenario, public log, and the private log with the
reasoning only when ``TAXONOMY[b].needs_trace``) in; a :class:`Verdict` (the four scores in [0, 1] and
``announced``) or a :class:`JudgeFailure` (``judge_failure`` | ``timeout``) out — never a silent 0.
:func:`check_request` is the request check both judges run first.

The rule judge (:mod:`.behavior_judge`) and the LLM judge (:mod:`.openai_judge`) both import this
module and not each other (apart from :func:`~.behavior_judge.make_judge`, which builds either kind).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mimesis_lab.behaviors import TAXONOMY

__all__ = ["SCORE_KEYS", "FAILURE_REASONS", "BehaviorJudgeRequest", "Verdict", "JudgeFailure", "check_request"]

SCORE_KEYS = ("exhibit", "placement", "naturalness", "on_task")
FAILURE_REASONS = ("judge_failure", "timeout")


@dataclass
class BehaviorJudgeRequest:
    behavior_id: str  # "B1".."B13" or "N"
    kwargs: dict[str, Any]
    scenario: dict[str, Any]
    flow: str
    subflow: str
    public_log: list[dict[str, Any]]  # [{"role": "agent"|"user", "content"}]
    private_log: list[dict[str, Any]] | None = None  # simulator turns {"role", "reasoning", "content"}


@dataclass
class Verdict:
    exhibit: float
    placement: float
    naturalness: float
    on_task: float
    announced: bool
    rationale: str
    extras: dict[str, float] = field(default_factory=dict)  # e.g. {"cooperativeness": …} for N
    recovered_retries: int = 0  # failed endpoint attempts before this verdict (LLM judge; the rule judge: 0)


@dataclass
class JudgeFailure:
    reason: str  # "judge_failure" | "timeout"
    detail: str
    transient: bool = False  # the endpoint's retries ran out on a timeout / transport error / 429 / 5xx
    kind: str = ""  # the endpoint failure's reason (timeout, deadline, http, transport, malformed, invalid, refusal)

    def __post_init__(self) -> None:
        if self.reason not in FAILURE_REASONS:
            raise ValueError(f"JudgeFailure.reason must be one of {FAILURE_REASONS}, got {self.reason!r}")


def check_request(req: BehaviorJudgeRequest) -> str | None:
    """Why ``req`` cannot be judged (unknown behaviour, a public log that is not a list), else ``None``."""
    if req.behavior_id not in TAXONOMY:
        return f"unknown behaviour {req.behavior_id!r}"
    if not isinstance(req.public_log, list):
        return "public_log must be a list"
    return None
