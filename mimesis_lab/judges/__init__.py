"""Judges and scripted partners of the simulator tasks (SPEC §2.4).

- :mod:`.abcd_agent` — :class:`ABCDSupportAgent`, the deterministic kb/guideline-driven ABCD
  support agent the simulator talks to in the behaviour task.
- :mod:`.verdict` — what a behaviour judge is asked and answers (:class:`BehaviorJudgeRequest`,
  :class:`Verdict`, :class:`JudgeFailure`, ``SCORE_KEYS``, :func:`~.verdict.check_request`).
- :mod:`.behavior_judge` — :class:`RuleJudge` (offline default, graded rules per behaviour),
  :func:`make_judge` (either kind), and :func:`rule_check` (the independent check logged as
  ``rule_judge_gap``); re-exports the :mod:`.verdict` types.
- :mod:`.openai_judge` — :class:`OpenAIJudge` (strict-JSON LLM judge on the shared retry loop of
  :mod:`mimesis_lab.endpoint`), :func:`validate_verdict`, :func:`judge_messages`, ``VERDICT_SCHEMA`` /
  ``RESPONSE_FORMAT``.
- :mod:`.coach` — the CSD coach (:class:`~.coach.TemplateCoach` offline default, :class:`~.coach.OpenAICoach`).
- :mod:`.leak` — the leak validator of coaching notes.
"""
from mimesis_lab.judges.abcd_agent import ABCDSupportAgent
from mimesis_lab.judges.behavior_judge import (
    BehaviorJudgeRequest,
    JudgeFailure,
    RuleJudge,
    Verdict,
    make_judge,
    rule_check,
)
from mimesis_lab.judges.openai_judge import OpenAIJudge

__all__ = [
    "ABCDSupportAgent",
    "BehaviorJudgeRequest",
    "JudgeFailure",
    "OpenAIJudge",
    "RuleJudge",
    "Verdict",
    "make_judge",
    "rule_check",
]
