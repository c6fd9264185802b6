"""Integration: the agent learns. On TravelGym (the easiest training gym) the tiny warm-started
agent's mean reward rises under the real `agent_grpo` Prefect flow + DeepSpeed job with a fixed
seed (scripts/agent_grpo_signal.py), and the curve is in MLflow."""
from __future__ import annotations

import json

import pytest

from scripts import agent_grpo_signal as sig

pytestmark = [pytest.mark.slow, pytest.mark.long]


@pytest.fixture(scope="module")
def signal(tmp_path_factory):
    out = tmp_path_factory.mktemp("agent_signal")
    params = sig.build(out, steps=30)
    res = sig.run(params, out)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return out


def test_reward_rises_on_travel(signal):
    curve = sig.reward_curve(signal)
    assert len(curve) == 30
    first, last = sum(curve[:10]) / 10, sum(curve[-10:]) / 10
    # measured with this seed: 0.11 -> 0.32; the margin leaves room for platform noise
    assert last > first + 0.08, (first, last, curve)


def test_curve_and_agent_in_mlflow(signal):
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{signal / 'mlflow.db'}")
    exp = client.get_experiment_by_name("agent-grpo-signal")
    runs = client.search_runs([exp.experiment_id], filter_string="attributes.run_name = 'agent_grpo'")
    child = next(r for r in runs if r.data.tags.get("mimesis.kind") == "train")
    hist = client.get_metric_history(child.info.run_id, "reward/mean")
    assert len(hist) == 30 and [h.step for h in hist] == list(range(1, 31))
    assert len(client.get_metric_history(child.info.run_id, "reward/gym/travel")) == 30
    assert client.get_registered_model("mimesis-agent-signal").aliases.get("agent_grpo")
    summary = json.loads((signal / "agent_grpo" / "final" / "training_summary.json").read_text())
    assert summary["last_reward_mean"] > summary["first_reward_mean"]
