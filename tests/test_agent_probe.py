"""scripts/agent_probe.py: the paired per-task agent effects of a chain and their pooling over chains, on
hand-computed cases (the probe's world and evaluation are the real `gyms` stage and `agent_eval` phase)."""
from __future__ import annotations

import importlib.util
import sys

import pytest

from tests.conftest import ROOT


def _probe():
    spec = importlib.util.spec_from_file_location("agent_probe", ROOT / "scripts" / "agent_probe.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("agent_probe", mod)
    spec.loader.exec_module(mod)
    return mod


def _r(agent, gym, task, reward, invalid=None):
    return {"agent": agent, "user": "scripted", "gym": gym, "task_id": task, "attempt": 0, "total_reward": reward,
            "invalid": invalid, "n_turns": 3}


def test_chain_effects_pairs_by_task_and_pools_the_training_gyms():
    P = _probe()
    rollouts = [_r("base", "travel", "t1", 0.0), _r("grpo", "travel", "t1", 1.0), _r("csd", "travel", "t1", 0.5),
                _r("base", "travel", "t2", 1.0), _r("grpo", "travel", "t2", 1.0), _r("csd", "travel", "t2", 1.0),
                _r("base", "turtle", "u1", 0.0), _r("grpo", "turtle", "u1", 0.0), _r("csd", "turtle", "u1", 0.0),
                _r("base", "intention", "i1", -0.2), _r("grpo", "intention", "i1", 0.1),
                _r("csd", "intention", "i1", 0.9, invalid="user_failed")]     # invalid: its pair drops out
    eff = P.chain_effects(rollouts, ["travel", "turtle", "intention"], ["travel", "turtle", "persuade"])
    t = eff["travel"]["grpo-base"]
    assert t["value"] == pytest.approx(0.5) and t["n"] == 2 and (t["grpo"], t["base"]) == (1.0, 0.5)
    assert eff["travel"]["csd-grpo"]["value"] == pytest.approx(-0.25)
    assert eff["intention"]["grpo-base"]["value"] == pytest.approx(0.3)
    assert "csd-grpo" not in eff["intention"]                        # no valid csd rollout to pair
    # "train" pools travel and turtle (intention is held out): (1 + 0 + 0) / 3; means over the 3 pairs
    tr = eff["train"]["grpo-base"]
    assert tr["value"] == pytest.approx(1 / 3) and tr["n"] == 3
    assert (tr["grpo"], tr["base"]) == (pytest.approx(2 / 3), pytest.approx(1 / 3))
    assert eff["travel"]["grpo-base"]["ci"][0] <= 0.5 <= eff["travel"]["grpo-base"]["ci"][1]
    # an agent failure (context overflow after some turns) is scored, as agent_eval scores it
    over = rollouts + [_r("base", "persuade", "p1", 0.0, invalid="context_overflow"), _r("grpo", "persuade", "p1", 0.2)]
    assert P.chain_effects(over, ["persuade"], ["persuade"])["persuade"]["grpo-base"]["n"] == 1


def test_pool_over_chains():
    P = _probe()
    per_chain = {"a": {"travel": {"grpo-base": {"value": 1.0}}},
                 "b": {"travel": {"grpo-base": {"value": 2.0}}},
                 "c": {"travel": {"grpo-base": {"value": 3.0}}, "turtle": {"grpo-base": {"value": -1.0}}}}
    out = P.pool(per_chain)
    e = out["travel"]["grpo-base"]
    assert e["mean"] == pytest.approx(2.0) and e["above_zero"] == 3 and e["chains"] == 3
    assert e["ci"] == pytest.approx([2 - 2.484, 2 + 2.484], abs=1e-3)          # t(2) = 4.303, s = 1
    assert out["turtle"]["grpo-base"] == {"values": [-1.0], "mean": -1.0, "ci": None, "above_zero": 0, "chains": 1}
