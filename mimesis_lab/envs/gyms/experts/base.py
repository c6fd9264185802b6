"""What an expert may see, and how it acts: :class:`AgentView` and :class:`Expert`.

An expert is an agent written by hand. It gets exactly what a trained agent gets — the row's
prompt (:class:`AgentView`: the gym's name and the prompt messages, nothing of ``reward_model`` or
``extra_info``) and, turn by turn, the observation text the gym returned — and answers with one
``(choice, content)`` tool call per turn. It never holds the gym, the task record or the user side,
so it cannot read a hidden field: what it knows of the user it learnt from the user's replies.

A subclass writes its play as a generator, :meth:`Expert.policy`: ``observation = yield (choice,
content)``. ``explore`` (a seeded ``random.Random``, or ``None``) makes it deviate from its best
play — another question order, an extra question, an earlier answer — for the exploratory traces
that give RL choices to weigh; :meth:`Expert.coin` draws those deviations.
"""
from __future__ import annotations

import abc
import random
from dataclasses import dataclass
from typing import Any, ClassVar, Generator

__all__ = ["Action", "AgentView", "Expert", "agent_view"]

Action = tuple[str, str]


@dataclass(frozen=True)
class AgentView:
    """Everything an expert may read before its first turn: the gym's name and the row's prompt
    (``(role, content)`` pairs). It holds no task record, ground truth or tool kwargs by construction."""

    gym: str
    prompt: tuple[tuple[str, str], ...]

    @property
    def request(self) -> str:
        """The prompt's user message(s): the task as the agent is told it."""
        return "\n".join(c for r, c in self.prompt if r == "user")


def agent_view(row: dict[str, Any]) -> AgentView:
    """The :class:`AgentView` of a UserRL row: its gym (by ``data_source``, ours or UserRL's name) and
    ``prompt``, nothing else."""
    from mimesis_lab.envs.gyms.base import gym_name

    return AgentView(gym=gym_name(row["data_source"]) or str(row["data_source"]).removeprefix("interact_"),
                     prompt=tuple((str(m["role"]), str(m["content"])) for m in row["prompt"]))


class Expert(abc.ABC):
    """A hand-written agent of one gym (module docstring). ``act(observation)`` → the next
    ``(choice, content)``, or ``None`` when it has nothing more to do; ``turns_left`` counts the
    turns still allowed (``max_turns`` in all, the gym's step limit)."""

    gym: ClassVar[str] = ""

    def __init__(self, view: AgentView, max_turns: int = 16, explore: random.Random | None = None):
        if view.gym != self.gym:
            raise ValueError(f"{type(self).__name__} plays {self.gym!r}, not {view.gym!r}")
        self.view = view
        self.max_turns = max_turns
        self.explore = explore
        self.turns = 0
        self._play = self.policy()
        self._started = False

    @property
    def turns_left(self) -> int:
        """Turns still allowed, counting the one about to be taken."""
        return self.max_turns - self.turns

    def coin(self, p: float) -> bool:
        """True with probability ``p`` when exploring; always False for the best play."""
        return self.explore is not None and self.explore.random() < p

    def act(self, observation: str | None) -> Action | None:
        if self.turns >= self.max_turns:
            return None
        try:
            if not self._started:
                self._started = True
                action = next(self._play)
            else:
                action = self._play.send(observation or "")
        except StopIteration:
            return None
        self.turns += 1
        return action

    @abc.abstractmethod
    def policy(self) -> Generator[Action, str, None]:
        """The gym's play: ``observation = yield (choice, content)`` until the episode is done."""
