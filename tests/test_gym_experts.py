"""Experts for the agent SFT warm start: each gym's expert plays the bundled tasks through the real gym
with the offline user, sees only what the agent sees (the prompt and the observations), asks the user
where the reward depends on what only the user knows, and records exploratory traces on request."""
from __future__ import annotations

import builtins
import copy
import dataclasses
import inspect
from pathlib import Path

import pytest

from mimesis_lab.envs.gyms import registry
from mimesis_lab.envs.gyms.base import ScriptedUser
from mimesis_lab.envs.gyms.experts import EXPERTS, ORACLE_GYMS, AgentView, agent_view, expert_trace
from mimesis_lab.envs.gyms.registry import ALL_GYMS, MODULES, load_tasks
from mimesis_lab.rollout.agent_rollout import parse_tool_call

TASKS = {g: load_tasks(g) for g in ALL_GYMS}
ROWS = {g: MODULES[g].build_rows(TASKS[g], "train") for g in ALL_GYMS}
# gyms whose reward depends on what only the user knows: their experts must ask
USER_GYMS = ("travel", "turtle", "persuade", "intention", "telepathy", "tau")
GYM_DATA = Path(registry.__file__).resolve().parents[3] / "data" / "raw" / "gyms"


def _replies(trace):
    return [m["content"] for m in trace["messages"] if m["role"] == "assistant"]


@pytest.mark.parametrize("gym", ORACLE_GYMS)
def test_expert_traces_are_rewarded_through_the_real_gym(gym):
    traces = [expert_trace(r, TASKS) for r in ROWS[gym]]
    kept = [t for t in traces if t is not None]
    # every bundled task but the odd one the reading heuristics miss (search-007: the museum's Spanish name)
    assert len(kept) >= 0.9 * len(traces), [r["reward_model"]["id"] for r, t in zip(ROWS[gym], traces) if t is None]
    for t in kept:
        assert t["total_reward"] > 0 and t["gym"] == gym and t["kind"] == "oracle"
        roles = [m["role"] for m in t["messages"]]
        assert roles[:2] == ["system", "user"] and roles[2] == "assistant" and roles[-1] == "assistant"
        assert len(_replies(t)) == len(t["rewards"]) <= 16
        for reply in _replies(t):
            assert not isinstance(parse_tool_call(reply), str)     # a valid tool call every time
        if gym in USER_GYMS:
            assert t["user_turns"] > 0                              # it asked the user
    if gym == "travel":                 # search 0.2 + three elicited preferences 0.2 each + the best option 1.0
        assert [round(t["total_reward"], 6) for t in kept].count(1.8) >= len(kept) - 1
        assert all(t["rewards"][-1] == 1.0 for t in kept)
    if gym in ("function", "search", "telepathy", "tau"):
        assert all(t["rewards"][-1] == pytest.approx(1.0) for t in kept)


def test_the_expert_input_holds_no_hidden_field():
    # by construction: the view is the gym's name and the prompt, and an expert is built from it alone
    assert {f.name for f in dataclasses.fields(AgentView)} == {"gym", "prompt"}
    for cls in EXPERTS.values():
        assert list(inspect.signature(cls).parameters) == ["view", "max_turns", "explore"]
    row = ROWS["travel"][0]
    view = agent_view(row)
    assert view.prompt == tuple((m["role"], m["content"]) for m in row["prompt"])
    assert row["reward_model"]["ground_truth"] not in repr(view)            # the best option's id


SENTINEL = "SENTINEL-hidden-value"


@pytest.mark.parametrize("gym", ORACLE_GYMS)
def test_hidden_fields_of_the_row_are_never_read(gym):
    """The row's ground truth and tool kwargs (besides the task id the gym needs) replaced by
    sentinels: the expert plays exactly the same, and no sentinel reaches its replies."""
    for row in ROWS[gym][:4]:
        poisoned = copy.deepcopy(row)
        poisoned["reward_model"] = {k: (v if k == "id" else SENTINEL) for k, v in row["reward_model"].items()}
        ck = poisoned["extra_info"]["tools_kwargs"]["interact_with_env"]["create_kwargs"]
        for k in ck:
            if k != "id":
                ck[k] = SENTINEL
        real, blind = expert_trace(row, TASKS), expert_trace(poisoned, TASKS)
        assert (real is None) == (blind is None)
        if real is not None:
            assert blind["messages"] == real["messages"]
            assert not any(SENTINEL in r for r in _replies(blind))


@pytest.mark.parametrize("gym", ORACLE_GYMS)
def test_an_expert_acts_on_the_prompt_and_the_observations_alone(gym, monkeypatch):
    """Replay a recorded episode to a fresh expert while every task file is unreadable: it takes the
    same actions, so nothing but the prompt and the observations went into them."""
    row = ROWS[gym][0]
    trace = expert_trace(row, TASKS, vague_rate=0.0)
    assert trace is not None
    observations = [m["content"].rsplit("\nReward:", 1)[0] for m in trace["messages"][2:] if m["role"] == "tool"]

    real_open = builtins.open

    def guarded_open(file, *a, **kw):
        if str(Path(str(file)).resolve()).startswith(str(GYM_DATA)):
            raise AssertionError(f"an expert read {file}")
        return real_open(file, *a, **kw)

    monkeypatch.setattr(builtins, "open", guarded_open)
    for name in ALL_GYMS:
        monkeypatch.setattr(MODULES[name], "load_tasks", lambda *a, **k: pytest.fail("an expert loaded tasks"))
    expert = EXPERTS[gym](agent_view(row), max_turns=16)
    actions = [expert.act(None)] + [expert.act(obs) for obs in observations]
    assert [f"[{choice}] {content}" for choice, content in actions] == _replies(trace)


@pytest.mark.parametrize("gym", USER_GYMS)
def test_user_gym_experts_depend_on_the_users_answers(gym):
    """An uninformative user (the same non-answer to everything) leaves the expert with less: its
    reward comes from what the user said, not from the task."""
    informed = blind = 0.0
    for row in ROWS[gym]:
        t = expert_trace(row, TASKS)
        informed += t["total_reward"] if t else 0.0
        t = expert_trace(row, TASKS, user=ScriptedUser(lambda m: "Irrelevant" if gym == "turtle" else "Hmm."))
        blind += t["total_reward"] if t else 0.0
    assert blind < informed
    if gym in ("turtle", "intention", "persuade"):
        assert blind <= 0.2 * informed
    if gym == "telepathy":     # three guesses among a category's few well-known candidates can still hit
        assert blind <= 0.5 * informed


@pytest.mark.parametrize("gym", ORACLE_GYMS)
def test_experts_stay_within_the_turn_limit_and_survive_vague_users(gym):
    for row in ROWS[gym][:5]:
        for max_steps in (4, 16):
            t = expert_trace(row, TASKS, max_steps=max_steps, vague_rate=1.0)   # every user reply uninformative
            if t is not None:
                assert len(t["rewards"]) <= max_steps
    if gym in ("travel", "tau", "persuade"):    # an uninformative reply is asked again, differently
        kept = [expert_trace(r, TASKS, vague_rate=0.3, user_seed=7) for r in ROWS[gym]]
        assert sum(t is not None for t in kept) >= 0.7 * len(kept)


@pytest.mark.parametrize("gym", ORACLE_GYMS)
def test_exploratory_traces_are_seeded_marked_and_differ(gym):
    differs = 0
    for row in ROWS[gym][:6]:
        oracle = expert_trace(row, TASKS)
        for seed in (1, 2):
            t = expert_trace(row, TASKS, explore=seed)
            assert t == expert_trace(row, TASKS, explore=seed)                  # seeded
            if t is None:
                continue
            assert t["kind"] == "exploratory" and t["seed"] == seed and t["total_reward"] > 0
            differs += oracle is None or _replies(t) != _replies(oracle)
    assert differs >= 3


def _gym(name, index=0, **user):
    import random

    from mimesis_lab.envs.gyms.offline_user import OfflineUser

    row = ROWS[name][index]
    gym = registry.gym_for_row(row, TASKS, None, random.Random(0))
    gym.user = OfflineUser(gym, random.Random(0), **user)
    return gym


def test_offline_user_answers_what_is_asked_and_no_more():
    travel = _gym("travel")                                   # travel-1: budget, beach, pet friendly
    assert travel.step("action", "Do you have a budget in mind?").observation == "Budget under $150 per night."
    assert travel.step("action", "Is spa important to you?").observation == "I don't mind about that."
    assert travel.step("action", "Anything else that matters to you?").observation == "Close to the beach."
    vague = _gym("travel", vague_rate=1.0)
    res = vague.step("action", "Do you have a budget in mind?")
    assert res.reward == 0 and "budget" not in res.observation.lower()

    turtle = _gym("turtle")                                   # the glass of water: hiccups
    assert turtle.step("action", "Did the man have hiccups?").observation == "Yes"
    assert turtle.step("action", "Was the glass of water poisoned?").observation != "Yes"   # surface words alone

    persuade = _gym("persuade")
    t = persuade.task
    res = persuade.step("action", "What are your main concerns about this claim?")
    assert res.reward == 0 and t["reasons"][0] in res.observation and "Stance" not in res.observation
    res = persuade.step("action", f"You said: {t['reasons'][0]} Here is why that is less of a problem.")
    assert res.reward == pytest.approx(1 / 6)                 # one step toward the target
