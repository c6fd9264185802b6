"""Integration: simulator RL end to end with the real Prefect, DeepSpeed and MLflow.

- the `sim_rl` flow on a controllable configuration (B9 behaviour task, rule judge, tiny random
  policy; scripts/sim_rl_signal.py): the judged behaviour reward rises over 36 steps (fixed seed,
  with a margin), every per-step metric of the issue is an MLflow metric history, the final model
  is registered with alias `sim_rl`, episodes are logged, the Prefect summary artifact exists;
- resume: 2 steps then extended to 4 gives the same weights as 4 steps straight;
- failures are data: an unreachable LLM judge makes every rollout invalid `judge_failure`,
  counted per step, nothing trained on and nothing lost.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT

pytestmark = pytest.mark.slow
sys.path.insert(0, str(ROOT / "scripts"))
import sim_rl_signal  # noqa: E402

STEPS = 36


@pytest.fixture(scope="module")
def signal_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("simrl")
    params_path = sim_rl_signal.build(tmp, steps=STEPS)
    res = sim_rl_signal.run(params_path, tmp, timeout=1200)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return tmp, yaml.safe_load(params_path.read_text()), res.stdout + res.stderr


def _history(c, run_id, key):
    return [m.value for m in sorted(c.get_metric_history(run_id, key), key=lambda m: m.step)]


def test_behavior_reward_rises_and_is_in_mlflow(signal_run):
    import mlflow

    tmp, params, _ = signal_run
    c = mlflow.MlflowClient(tracking_uri=params["tracking"]["tracking_uri"])
    exp = c.get_experiment_by_name(params["tracking"]["experiment"])
    runs = c.search_runs([exp.experiment_id])
    parent = [r for r in runs if r.info.run_name == "sim_rl" and r.data.tags.get("mimesis.kind") == "flow"]
    assert len(parent) == 1 and parent[0].info.status == "FINISHED"
    child = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent[0].info.run_id]
    assert [r.info.run_name for r in child] == ["sim_rl"] and child[0].info.status == "FINISHED"
    rid = child[0].info.run_id
    for key in ("reward/raw_mean", "reward/update_mean", "reward/task/usersim_behavior", "reward/behavior/B9",
                "judge/exhibit", "judge/placement", "judge/naturalness", "judge/on_task", "announced_rate",
                "rule_judge_gap", "format_failure_rate", "invalid_total", "invalid/judge_failure", "invalid/refusal",
                "invalid/empty_reply", "invalid/timeout", "response_length_mean", "update/ppo_loss", "episodes_per_s"):
        assert [m.step for m in c.get_metric_history(rid, key)] == list(range(1, STEPS + 1)), key
    raw = _history(c, rid, "reward/raw_mean")
    first, last = sum(raw[:6]) / 6, sum(raw[-6:]) / 6
    assert last > first + 0.15, f"no learning signal: first {first:.3f} last {last:.3f} ({raw})"
    exhibit = _history(c, rid, "judge/exhibit")
    assert sum(exhibit[-6:]) / 6 > sum(exhibit[:6]) / 6
    assert child[0].data.params["sim_rl.judge.kind"] == "rule"
    mv = c.get_model_version_by_alias("mimesis-simulator-signal", "sim_rl")
    assert mv.run_id == rid
    arts = {a.path for a in c.list_artifacts(rid)}
    assert {"model", "config", "rollouts"} <= arts


def test_metrics_file_rollout_log_and_final_model(signal_run):
    from mimesis_lab.models import load_model

    tmp, params, log = signal_run
    m = json.loads((tmp / "metrics" / "sim_rl.json").read_text())
    assert m["steps"] == STEPS and m["last_reward_raw_mean"] > m["first_reward_raw_mean"]
    assert m["rollouts_total"] == STEPS * 32 and m["registered_version"]
    lines = [json.loads(x) for x in (tmp / "sim_rl" / "rollouts.jsonl").read_text().splitlines()]
    assert len(lines) == STEPS * 32
    valid = [x for x in lines if x["invalid"] is None]
    assert all(x["labels"] == {"behavior": "B9"} and 0 <= x["raw"] <= 1 for x in valid)
    assert all(x["invalid_detail"] for x in lines if x["invalid"])
    assert all(x["public_log"][0]["role"] == "agent" for x in lines)
    load_model(tmp / "sim_rl" / "final")
    assert "Finished in state Completed()" in log


def test_prefect_summary_artifact(signal_run):
    tmp, _, _ = signal_run
    code = ("import asyncio\nfrom prefect.client.orchestration import get_client\n"
            "async def main():\n    async with get_client() as c:\n"
            "        print(sorted({a.key for a in await c.read_artifacts() if a.key}))\nasyncio.run(main())\n")
    res = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PREFECT_HOME": str(tmp / "prefect")},
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "'sim-rl-summary'" in res.stdout and "'sim-rl-flow-summary'" in res.stdout


def _job(params_path: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    env.pop("MLFLOW_RUN_ID", None)
    return subprocess.run([sys.executable, "-m", "mimesis_lab.jobs.sim_rl", "--phase", "sim_rl", "--params",
                           str(params_path)], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def _variant(tmp: Path, name: str, **overrides) -> Path:
    params = yaml.safe_load((tmp / "params.yaml").read_text())
    params["sim_rl"].update(output_dir=str(tmp / name), **overrides)
    p = tmp / f"{name}.yaml"
    p.write_text(yaml.safe_dump(params, sort_keys=False))
    return p


@pytest.mark.long
def test_resume_extends_a_run_exactly(tmp_path):
    from safetensors.torch import load_file

    sim_rl_signal.build(tmp_path, steps=4)
    # stratified rows: the resumed job must replay the earlier steps' task draws to find each task's position
    kw = dict(save_every=2, prompts_per_step=2, rollouts_per_prompt=4, row_order="stratified")
    straight = _variant(tmp_path, "straight", steps=4, **kw)
    first = _variant(tmp_path, "resumed", steps=2, **kw)
    for p in (straight, first):
        res = _job(p, tmp_path)
        assert res.returncode == 0, res.stderr[-3000:]
    second = _variant(tmp_path, "resumed", steps=4, **kw)
    res = _job(second, tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "resumed from" in res.stdout + res.stderr
    a = load_file(tmp_path / "straight" / "final" / "model.safetensors")
    b = load_file(tmp_path / "resumed" / "final" / "model.safetensors")
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)
    steps = [json.loads(x)["step"] for x in (tmp_path / "resumed" / "metrics.jsonl").read_text().splitlines()
             if json.loads(x)["kind"] == "train"]
    assert steps == [1, 2, 3, 4]


def test_judge_failures_are_counted_not_zeroed(tmp_path):
    sim_rl_signal.build(tmp_path, steps=1)
    judge = {"kind": "openai", "openai": {"base_url": "http://127.0.0.1:9/v1", "model": "judge",
                                          "api_key_env": "NO_SUCH_KEY", "timeout_s": 2.0, "max_retries": 1,
                                          "temperature": 0.0}}
    p = _variant(tmp_path, "nojudge", steps=1, prompts_per_step=2, rollouts_per_prompt=4, judge=judge)
    res = _job(p, tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    rec = [json.loads(x) for x in (tmp_path / "nojudge" / "metrics.jsonl").read_text().splitlines()]
    m = next(r["metrics"] for r in rec if r["kind"] == "train")
    assert m["rollouts"] == 8 and m["rollouts_valid"] + m["invalid_total"] == 8
    lines = [json.loads(x) for x in (tmp_path / "nojudge" / "rollouts.jsonl").read_text().splitlines()]
    # every rollout is either invalid (judge unreachable, or an empty/refused reply) or ended by the
    # policy's own format failure before there was anything to judge (valid, update reward 0)
    unjudged = sum(x["ended_by_format_failure"] and x["invalid"] is None for x in lines)
    assert m["invalid/judge_failure"] + m["invalid/empty_reply"] + m["invalid/refusal"] + unjudged == 8
    assert m["invalid/judge_failure"] >= 1 and "reward/raw_mean" not in m
    assert m["batch/rollouts_in_update"] == m["rollouts_valid"]
    assert all(x["raw"] is None for x in lines)
    assert all(x["update_reward"] is None for x in lines if x["invalid"])
    assert any("127.0.0.1:9" in (x["invalid_detail"] or "") or "connect" in (x["invalid_detail"] or "").lower()
               for x in lines)
