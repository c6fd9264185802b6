"""Oracle experts for the gyms: successful traces for the agent's SFT warm start (SPEC §3.2).

The paper starts agent RL from an SFT checkpoint on *successful* traces. Here an oracle that
reads the hidden task plays the gyms whose success does not depend on the user's answers, and
the real gym scores every step — so a trace is kept only if the gym itself rewarded it:

- Travel: search for the best option's name, then answer its id (valid search 0.2 + best 1.0);
- Function: retrieve the test case, answer the expected result;
- Turtle: explain the solution;
- Tau: the gold tool calls, then ``###DONE###`` (final-state hash check);
- Search: search the question, answer the gold answer;
- Telepathy: name the entity.

Persuade and Intention need the user's replies and have no oracle. The traces use the rollout
format exactly (``[choice] content`` replies, tool feedback with ``Reward: r``), so SFT teaches
the agent the same interface that GRPO then optimises.
"""
from __future__ import annotations

import json
import random
from typing import Any

from mimesis_lab.envs.gyms.registry import gym_for_row

__all__ = ["ORACLE_GYMS", "expert_actions", "expert_trace"]

ORACLE_GYMS = ("travel", "function", "turtle", "tau", "search", "telepathy")


def expert_actions(gym: str, task: dict[str, Any]) -> list[tuple[str, str]] | None:
    """The oracle's ``(choice, content)`` sequence for ``task``, or ``None`` for gyms without an oracle."""
    if gym == "travel":
        best = next(o for o in task["options"] if o["id"] == task["best_id"])
        return [("search", str(best.get("name") or best["id"])), ("answer", str(task["best_id"]))]
    if gym == "function":
        return [("search", "test"), ("answer", f"{float(task['expected_result']):g}")]
    if gym == "turtle":
        return [("answer", str(task["solution"]))]
    if gym == "tau":
        calls = [("action", json.dumps({"name": a["name"], "arguments": a.get("kwargs") or {}}))
                 for a in task.get("actions") or []]
        return calls + [("answer", "###DONE###")]
    if gym == "search":
        return [("search", str(task["question"])), ("answer", str(task["answer"]))]
    if gym == "telepathy":
        return [("answer", str(task["entity"]))]
    return None


def expert_trace(row: dict[str, Any], tasks: dict[str, dict[str, dict[str, Any]]], show_reward: bool = True,
                 max_steps: int = 16) -> dict[str, Any] | None:
    """Play the oracle on ``row`` through the real gym; the trace if the gym rewarded it, else ``None``.

    Returns ``{"messages", "rewards", "total_reward", "gym", "task_id"}`` with messages = the row's
    prompt, then alternating ``assistant`` replies and ``tool`` feedback (as in rollouts).
    """
    gym_name = str(row["data_source"]).removeprefix("interact_")
    rm = row.get("reward_model") or {}
    tid = str(rm.get("id"))
    task = (tasks.get(gym_name) or {}).get(tid)
    actions = expert_actions(gym_name, task) if task is not None else None
    if not actions:
        return None
    gym = gym_for_row(row, tasks, user=None, rng=random.Random(0), max_steps=max_steps)
    messages = [dict(m) for m in row["prompt"]]
    first = gym.reset()
    if first:
        messages.append({"role": "tool", "content": first})
    rewards: list[float] = []
    for choice, content in actions:
        messages.append({"role": "assistant", "content": f"[{choice}] {content}"})
        res = gym.step(choice, content)
        rewards.append(float(res.reward))
        if res.done:
            break
        messages.append({"role": "tool", "content": res.observation + (f"\nReward: {res.reward:g}" if show_reward
                                                                       else "")})
    if sum(rewards) <= 0:
        return None
    return {"messages": messages, "rewards": rewards, "total_reward": sum(rewards), "gym": gym_name, "task_id": tid}
