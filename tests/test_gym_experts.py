"""Oracle traces for the agent SFT warm start: every oracle gym's bundled tasks yield a trace the
real gym rewards, in the rollout format the agent is trained on."""
from __future__ import annotations

import pytest

from mimesis_lab.envs.gyms.experts import ORACLE_GYMS, expert_actions, expert_trace
from mimesis_lab.envs.gyms.registry import ALL_GYMS, MODULES, load_tasks
from mimesis_lab.rollout.agent_rollout import parse_tool_call

TASKS = {g: load_tasks(g) for g in ALL_GYMS}


@pytest.mark.parametrize("gym", ORACLE_GYMS)
def test_oracle_traces_succeed_on_every_bundled_task(gym):
    rows = MODULES[gym].build_rows(TASKS[gym], "train")
    traces = [expert_trace(r, TASKS) for r in rows]
    assert all(t is not None for t in traces), [r["reward_model"]["id"] for r, t in zip(rows, traces) if t is None]
    for t in traces:
        assert t["total_reward"] > 0 and t["gym"] == gym
        roles = [m["role"] for m in t["messages"]]
        assert roles[:2] == ["system", "user"] and roles[2] == "assistant" and roles[-1] == "assistant"
        for m in t["messages"][2:]:
            if m["role"] == "assistant":
                assert not isinstance(parse_tool_call(m["content"]), str)   # a valid tool call every time
    # the final answer is what earns the reward (e.g. travel: 0.2 search + 1.0 best option)
    if gym == "travel":
        assert all(t["rewards"] == [0.2, 1.0] for t in traces)
    if gym in ("function", "search", "telepathy", "tau", "turtle"):
        assert all(t["rewards"][-1] == pytest.approx(1.0) for t in traces)


def test_no_oracle_without_a_user_independent_success():
    for gym in ("persuade", "intention"):
        task = next(iter(TASKS[gym].values()))
        assert expert_actions(gym, task) is None
        row = MODULES[gym].build_rows(TASKS[gym], "train")[0]
        assert expert_trace(row, TASKS) is None
