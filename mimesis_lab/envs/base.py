"""Simulator tasks: one interface, a registry keyed by ``data_source`` (SPEC §2.3).

Joint multi-domain simulator RL samples a task ``d ~ p(d)`` and maximises
``E_d E_{rho ~ P_phi^d} [ r_d(rho) ]``: every task keeps its own interaction protocol and its
own reward ``r_d``. Here a task is a :class:`SimEpisode` subclass registered under its
``data_source`` (``usersim_behavior``, ``usersim_next_turn``, ``usersim_persona``,
``usersim_tom``); an *episode* is one rollout of one task row.

Protocol (driven by :mod:`mimesis_lab.rollout.sim_rollout`, which batches the simulator's
turns of many episodes into one generation call):

1. ``episode.messages()`` — the chat the simulator sees now. **The simulator always speaks in
   the ``assistant`` slot** (it was trained that way: role swap and ThoughtTrace SFT), the
   partner (support agent, AI assistant, question asker) in the ``user`` slot; a ``system``
   message carries the task context. History turns of the simulator are given as their
   *public* utterance (reasoning is private and not fed back), as Qwen-style thinking
   templates do.
2. The runner generates one reply, parses it (:func:`~mimesis_lab.envs.output_format.parse_reply`)
   and handles what is not the task's business: a generation error/timeout, an empty public
   reply, a refusal to play the user (all *invalid*, the episode stops).
3. ``episode.observe(parsed, public)`` — the task records the simulator's turn (public log
   without reasoning, private log with it), lets its partner answer, and returns ``True``
   when the episode is over (turn budget, end of conversation, single-turn task).
4. ``episode.score(judge)`` → :class:`TaskScore`: the raw score in ``[0, 1]`` or an
   ``invalid`` reason (judge failure, …) — never a silent 0.

Format failures are not invalid: the runner keeps the episode going on the public text and
the update reward becomes 0 (:func:`~mimesis_lab.envs.output_format.update_reward`) while the
raw score is still judged and logged.
"""
from __future__ import annotations

import random
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

from mimesis_lab.envs.output_format import ParsedReply

__all__ = [
    "TaskScore",
    "TaskContext",
    "SimEpisode",
    "TASKS",
    "register_task",
    "make_episode",
    "INVALID_REASONS",
]

#: invalid-rollout reasons used across tasks (per-step counts are logged under these keys).
INVALID_REASONS = (
    "generation_error",   # the backend failed for this prompt
    "timeout",            # a backend / judge / episode time limit was hit
    "empty_reply",        # nothing public to show the partner
    "refusal",            # the simulator refused to play the user ("As an AI …")
    "context_overflow",   # the episode's prompt no longer fits the model
    "judge_failure",      # the judge did not return a schema-valid verdict after its retries
    "env_error",          # an exception inside the task / partner
)


@dataclass
class TaskScore:
    """The judged outcome of one episode.

    ``raw``: the task's score in ``[0, 1]`` (``None`` iff ``invalid`` is set).
    ``invalid``: a reason key (see :data:`INVALID_REASONS`) and ``detail`` a human-readable
    message. ``components``: numbers logged as per-step means, e.g. ``exhibit``,
    ``placement``, ``naturalness``, ``on_task``, ``announced`` (0/1), ``rule_judge_gap``,
    ``cooperativeness``. ``labels``: categorical tags used to slice the logged reward, e.g.
    ``{"behavior": "B9"}`` (``"N"`` for neutral).
    """

    raw: float | None
    invalid: str | None = None
    detail: str | None = None
    components: dict[str, float] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if (self.raw is None) == (self.invalid is None):
            raise ValueError("TaskScore needs exactly one of raw (a score) or invalid (a reason)")
        if self.raw is not None and not 0.0 <= float(self.raw) <= 1.0:
            raise ValueError(f"TaskScore.raw must be in [0, 1], got {self.raw}")

    @classmethod
    def failed(cls, reason: str, detail: str | None = None, **labels: str) -> "TaskScore":
        return cls(raw=None, invalid=reason, detail=detail, labels=dict(labels))


@dataclass
class TaskContext:
    """What episodes may need besides their row: shared, read-only resources.

    ``kb``: ABCD ``kb.json`` (subflow → required action buttons); ``guidelines``: ABCD
    ``guidelines.json``; ``options``: task-specific settings from ``params.yaml``
    (``sim_rl.tasks.<data_source>``), e.g. ``turn_budget``.
    """

    kb: dict[str, list[str]] = field(default_factory=dict)
    guidelines: dict[str, Any] = field(default_factory=dict)
    options: dict[str, dict[str, Any]] = field(default_factory=dict)

    def option(self, data_source: str, key: str, default: Any = None) -> Any:
        return (self.options.get(data_source) or {}).get(key, default)


class SimEpisode(ABC):
    """One rollout of one simulator task row (see the module docstring for the protocol).

    Subclasses set ``data_source`` and implement :meth:`messages`, :meth:`observe`,
    :meth:`score`; they keep ``public_log`` (``[{"role": "user"|"agent"|…, "content"}]`` with
    the simulator's turns as ``role="user"`` — the human the simulator plays — and no
    reasoning) and ``private_log`` (the simulator's turns with ``reasoning`` and ``content``).
    """

    data_source: ClassVar[str] = ""

    def __init__(self, row: dict[str, Any], ctx: TaskContext, rng: random.Random):
        self.row = row
        self.ctx = ctx
        self.rng = rng
        self.task_id = str(row.get("task_id") or row.get("id") or "")
        self.public_log: list[dict[str, str]] = []
        self.private_log: list[dict[str, str]] = []
        self.done = False

    @abstractmethod
    def messages(self) -> list[dict[str, str]]:
        """The simulator's prompt now: system + history, the simulator in the ``assistant`` slot."""

    @abstractmethod
    def observe(self, parsed: ParsedReply, public: str) -> bool:
        """Record the simulator's reply (``public`` = what the partner sees); the partner answers.

        Returns ``True`` when the episode is over.
        """

    @abstractmethod
    def score(self, judge: Any) -> TaskScore:
        """Judge the finished episode (``judge`` is the behaviour judge for tasks that use one)."""

    @property
    def n_sim_turns(self) -> int:
        return len(self.private_log)


TASKS: dict[str, type[SimEpisode]] = {}


def register_task(cls: type[SimEpisode]) -> type[SimEpisode]:
    """Class decorator: register a task under its ``data_source`` (unique)."""
    if not cls.data_source:
        raise ValueError(f"{cls.__name__} has no data_source")
    if cls.data_source in TASKS and TASKS[cls.data_source] is not cls:
        raise ValueError(f"data_source {cls.data_source!r} is already registered by {TASKS[cls.data_source].__name__}")
    TASKS[cls.data_source] = cls
    return cls


def make_episode(row: dict[str, Any], ctx: TaskContext, rng: random.Random) -> SimEpisode:
    """The episode of ``row`` for the task named by its ``data_source``."""
    ds = row.get("data_source")
    if ds not in TASKS:
        raise KeyError(f"no simulator task registered for data_source {ds!r} (known: {sorted(TASKS)})")
    return TASKS[ds](row, ctx, rng)


RowBuilder = Callable[..., list[dict[str, Any]]]
