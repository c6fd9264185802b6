"""Judges and scripted partners of the simulator tasks (SPEC §2.4).

- :mod:`.abcd_agent` — :class:`ABCDSupportAgent`, the deterministic kb/guideline-driven ABCD
  support agent the simulator talks to in the behaviour task.
- :mod:`.behavior_judge` — the behaviour judges: :class:`RuleJudge` (offline default, graded
  rules per behaviour), :class:`OpenAIJudge` (strict-JSON LLM judge with bounded retries),
  :func:`make_judge`, and :func:`rule_check` (the independent check logged as ``rule_judge_gap``).
"""
from mimesis_lab.judges.abcd_agent import ABCDSupportAgent
from mimesis_lab.judges.behavior_judge import (
    BehaviorJudgeRequest,
    JudgeFailure,
    OpenAIJudge,
    RuleJudge,
    Verdict,
    make_judge,
    rule_check,
)

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
