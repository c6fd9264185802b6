"""Experts for the gyms: rewarded traces for the agent's SFT warm start (SPEC §3.2).

The paper starts agent RL from an SFT checkpoint on *successful* traces. Here a hand-written expert
per gym plays the task through the real gym, and the gym scores every step; a trace is kept only if
the gym rewarded it. An expert sees what the agent sees and nothing else — the row's prompt
(:class:`~.base.AgentView`) and the observation of each step — so where success depends on what
only the user knows it must ask the user (an ``action`` turn, or ``answer`` to the customer in
TauGym) and act on the reply:

- Travel (:mod:`.travel`): search, ask about what splits the options, recommend the one that fits;
- Turtle (:mod:`.turtle`): test the twists the surface story suggests (classic puzzles' twists, and
  generic ones: a pet, work, a friend, sickness…) with yes/no questions, explain with the confirmed ones;
- Persuade (:mod:`.persuade`): ask what holds the user back, answer each concern;
- Intention (:mod:`.intention`): ask what is still missing, then ask about it;
- Telepathy (:mod:`.telepathy`): narrow the category's well-known candidates down with yes/no
  questions, then guess;
- Tau (:mod:`.tau`): verify the customer, ask what they need, look it up, confirm, call the tools;
- Function (:mod:`.function`): retrieve the test case, query it, answer the output;
- Search (:mod:`.search`): search the question, answer with the span of the passages that fits it.

In the ``agent_traces`` stage the user side is the scripted :class:`~mimesis_lab.envs.gyms.offline_user.OfflineUser`
(in RL it is the simulator). :func:`expert_trace` records one episode; with ``explore`` it records an
*exploratory* one (another question order, an extra question, an earlier answer) so RL has choices
to weigh. Traces use the rollout format exactly (``[choice] content`` replies, tool feedback with
``Reward: r``), so SFT teaches the interface that GRPO then optimises.
"""
from __future__ import annotations

import random
import zlib
from typing import Any

from mimesis_lab.envs.gyms.experts.base import Action, AgentView, Expert, agent_view
from mimesis_lab.envs.gyms.experts.function import FunctionExpert
from mimesis_lab.envs.gyms.experts.intention import IntentionExpert
from mimesis_lab.envs.gyms.experts.persuade import PersuadeExpert
from mimesis_lab.envs.gyms.experts.search import SearchExpert
from mimesis_lab.envs.gyms.experts.tau import TauExpert
from mimesis_lab.envs.gyms.experts.telepathy import TelepathyExpert
from mimesis_lab.envs.gyms.experts.travel import TravelExpert
from mimesis_lab.envs.gyms.experts.turtle import TurtleExpert
from mimesis_lab.envs.gyms.offline_user import OfflineUser
from mimesis_lab.envs.gyms.registry import gym_for_row, row_identity

__all__ = ["EXPERTS", "ORACLE_GYMS", "KINDS", "VAGUE_RATE", "Action", "AgentView", "Expert", "agent_view",
           "expert_trace", "user_turns"]

EXPERTS: dict[str, type[Expert]] = {e.gym: e for e in (TravelExpert, TurtleExpert, FunctionExpert, TauExpert,
                                                        PersuadeExpert, IntentionExpert, TelepathyExpert,
                                                        SearchExpert)}
ORACLE_GYMS = tuple(EXPERTS)
KINDS = ("oracle", "exploratory")
VAGUE_RATE = 0.1   # share of the offline user's replies that are uninformative


def user_turns(gym: str, messages: list[dict[str, str]]) -> int:
    """How many of the agent's replies went to the user: ``action`` turns (TauGym: ``answer`` turns
    other than ``###DONE###``; FunctionGym has no user)."""
    if gym == "function":
        return 0
    asks = ("[answer] ",) if gym == "tau" else ("[action] ",)
    return sum(1 for m in messages if m["role"] == "assistant" and m["content"].startswith(asks)
               and m["content"].strip() != "[answer] ###DONE###")


def expert_trace(row: dict[str, Any], tasks: dict[str, dict[str, dict[str, Any]]], show_reward: bool = True,
                 max_steps: int = 16, *, explore: int | None = None, user_seed: int | None = None,
                 vague_rate: float = VAGUE_RATE, user: Any = None) -> dict[str, Any] | None:
    """Play the gym's expert on ``row`` through the real gym; the trace if the gym rewarded it, else ``None``.

    The expert gets only :func:`agent_view` of the row and the observations. ``user`` is the gym's
    user side (default: an :class:`OfflineUser`, uninformative ``vague_rate`` of the time, seeded
    with ``user_seed`` or else from the gym, the task id and ``explore``). ``explore`` (a seed)
    records an exploratory trace instead of the best play. Returns ``{"messages", "rewards",
    "total_reward", "gym", "task_id", "kind", "seed", "user_turns"}`` with messages = the row's prompt,
    then alternating ``assistant`` replies and ``tool`` feedback (as in rollouts), ending with the
    agent's last reply.
    """
    view = agent_view(row)
    expert_cls = EXPERTS.get(view.gym)
    if expert_cls is None:
        return None
    tid = str(row_identity(row)["task_id"])
    gym = gym_for_row(row, tasks, user=None, rng=random.Random(0), max_steps=max_steps)
    if user is None:
        seed = zlib.crc32(f"{view.gym}:{tid}:{explore}".encode()) if user_seed is None else user_seed
        user = OfflineUser(gym, random.Random(seed), vague_rate)
    gym.user = user
    expert = expert_cls(view, max_turns=max_steps, explore=None if explore is None else random.Random(explore))
    messages = [dict(m) for m in row["prompt"]]
    obs = gym.reset()
    if obs:
        messages.append({"role": "tool", "content": obs})
    rewards: list[float] = []
    while True:
        action = expert.act(obs)
        if action is None:
            break
        choice, content = action
        messages.append({"role": "assistant", "content": f"[{choice}] {content}"})
        res = gym.step(choice, content)
        rewards.append(float(res.reward))
        if res.done:
            break
        obs = res.observation
        messages.append({"role": "tool", "content": obs + (f"\nReward: {res.reward:g}" if show_reward else "")})
    while messages and messages[-1]["role"] == "tool":   # the expert stopped early: end on its last reply
        messages.pop()
    if not rewards or sum(rewards) <= 0:
        return None
    return {"messages": messages, "rewards": rewards, "total_reward": sum(rewards), "gym": view.gym, "task_id": tid,
            "kind": KINDS[explore is not None], "seed": 0 if explore is None else int(explore),
            "user_turns": user_turns(view.gym, messages)}
