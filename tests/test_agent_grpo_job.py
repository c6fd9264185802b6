"""Integration: the `agent_grpo` DeepSpeed job end to end — gyms rows, the agent's tool calls, the
user side behind the real privileged shim, per-turn rewards, multi-turn GRPO update, checkpoints,
export — and privacy: the simulator's reasoning (which carries a unique secret here) is stored
per episode but never reaches an agent input."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import polars as pl
import pytest
import torch
import yaml

from mimesis_lab.config import resolve_groups
from scripts.agent_grpo_signal import serve_user
from tests.conftest import ROOT

pytestmark = pytest.mark.slow
SECRET = "hidden-preference-token-7f3a9c beach budget"


REPLY = f"<think>{SECRET}</think>Yes, I would like the beach."   # the simulator's reply: a secret in its reasoning


def _gym_rows(path):
    from mimesis_lab.envs.gyms.registry import MODULES, load_tasks

    rows = []
    for g in ("travel", "persuade"):
        for r in MODULES[g].build_rows(load_tasks(g), "train"):
            rows.append({"data_source": r["data_source"], "gym": g, "task_id": r["reward_model"]["id"],
                         "split": "train", "prompt": r["prompt"], "ability": r["ability"],
                         "reward_model": json.dumps(r["reward_model"]), "extra_info": json.dumps(r["extra_info"])})
    pl.DataFrame(rows).write_parquet(path)
    return rows


def _agent(tmp, rows):
    """A tiny agent taught (plain torch, in-process) to open with a tool call."""
    from mimesis_lab.config import ModelParams
    from mimesis_lab.models import build_tiny_model, save_hf
    from mimesis_lab.tokenizer import train_tokenizer

    target = "[action] Do you like the beach?<|im_end|>"
    texts = [m["content"] for r in rows for m in r["prompt"]] + [target] * 20
    tok = train_tokenizer(texts, vocab_size=1500, min_frequency=1)
    model = build_tiny_model(ModelParams(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                                         max_position_embeddings=2048, seed=3), len(tok), tok.pad_token_id,
                             tok.eos_token_id)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    tgt = tok.encode(target, add_special_tokens=False)
    for step in range(300):
        r = rows[step % len(rows)]
        p = tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False)
        ids = torch.tensor([tok.encode(p, add_special_tokens=False)[-200:] + tgt])
        labels = ids.clone()
        labels[0, :-len(tgt)] = -100
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.2, loss.item()
    save_hf(model, tok, tmp / "agent")


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("agent")
    rows = _gym_rows(tmp / "gyms.parquet")
    _agent(tmp, rows)
    srv = serve_user(lambda raw: REPLY)
    params = resolve_groups(yaml.safe_load((ROOT / "params.yaml").read_text()))   # agent_grpo in full
    params["tracking"]["enabled"] = False
    params["gyms"]["tasks"] = {g: None for g in params["gyms"]["tasks"]}   # the rows come from the bundled tasks
    cfg = params["agent_grpo"]
    cfg.update(init_from=str(tmp / "agent"), data=str(tmp / "gyms.parquet"), gyms={"travel": 1.0, "persuade": 1.0},
               deepspeed_config=str(ROOT / "configs/tiny/ds_rl.json"), steps=2, prompts_per_step=2,
               rollouts_per_prompt=2, save_every=1, output_dir=str(tmp / "out"))
    cfg["user"].update(kind="openai", openai={**cfg["user"]["openai"], "base_url": f"http://127.0.0.1:{srv.server_port}/v1"})
    cfg["rollout"].update(max_turns=2, max_new_tokens=16, temperature=0.0)
    (tmp / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    env.pop("MLFLOW_RUN_ID", None)
    res = subprocess.run([sys.executable, "-m", "mimesis_lab.jobs.agent_grpo", "--phase", "agent_grpo", "--params",
                          str(tmp / "params.yaml")], cwd=tmp, env=env, capture_output=True, text=True, timeout=600)
    srv.shutdown()
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return tmp


def test_job_accounts_rewards_and_exports(job):
    recs = [json.loads(x) for x in (job / "out" / "metrics.jsonl").read_text().splitlines()]
    steps = [r["metrics"] for r in recs if r["kind"] == "train"]
    assert len(steps) == 2
    for m in steps:
        assert m["rollouts"] == 4 and m["rollouts_valid"] + m["invalid_total"] == 4
        assert m["privileged_turns"] > 0 and m["privacy_leaks"] == 0
        assert m["choice_rate/action"] > 0
    assert (job / "out" / "final" / "config.json").is_file()
    summary = json.loads((job / "out" / "final" / "training_summary.json").read_text())
    assert summary["rollouts_total"] == 8


def test_reasoning_stored_but_never_shown_to_the_agent(job):
    from mimesis_lab.tokenizer import load_tokenizer

    tok = load_tokenizer(job / "agent")
    lines = [json.loads(x) for x in (job / "out" / "rollouts.jsonl").read_text().splitlines()]
    assert len(lines) == 8
    asked = [x for x in lines if "action" in x["choices"]]
    assert asked
    for x in asked:
        assert x["privileged"] and all(p == SECRET for p in x["privileged"])
        agent_view = json.dumps(x["messages"])
        assert SECRET not in agent_view
        tool = [m["content"] for m in x["messages"] if m["role"] == "tool"]
        assert tool and not any("<think>" in t or "</think>" in t for t in tool)
        assert "Yes, I would like the beach." in agent_view           # the public utterance does arrive
        # per-turn rewards recorded for every turn
        assert len(x["turn_rewards"]) == x["n_turns"]
    # and not in any token the agent was conditioned on (the decoded streams of every trajectory)
    assert all(SECRET not in json.dumps(x["messages"]) for x in lines)
    assert tok.decode(tok.encode(SECRET, add_special_tokens=False)) == SECRET   # the check is not vacuous


def test_siblings_train_side_by_side_in_one_flow_run(tmp_path):
    """`python -m flows.train --phases agent_grpo agent_csd` (the `agent_rl` DVC stage) with `sibling_jobs:
    concurrent`: the real Prefect flow starts both DeepSpeed jobs at once (their MLflow child runs overlap in
    time) under one parent run named `agent_rl`, and both finish with their metrics, models and versions. A
    rerun for the CSD sibling's settings resumes GRPO from its last checkpoint."""
    import mlflow

    rows = _gym_rows(tmp_path / "gyms.parquet")
    _agent(tmp_path, rows)
    srv = serve_user(lambda raw: REPLY)
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["tracking"].update(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}", artifact_location=str(tmp_path / "art"),
                              experiment="siblings")
    params["gyms"]["tasks"] = {g: None for g in params["gyms"]["tasks"]}
    params["agent_rl"].update(init_from=str(tmp_path / "agent"), data=str(tmp_path / "gyms.parquet"),
                              gyms={"travel": 1.0, "persuade": 1.0}, steps=2, prompts_per_step=2,
                              rollouts_per_prompt=2, save_every=1, sibling_jobs="concurrent",
                              deepspeed_config=str(ROOT / "configs/tiny/ds_rl.json"))
    params["agent_rl"]["user"].update(kind="openai", openai={**params["agent_rl"]["user"]["openai"],
                                                             "base_url": f"http://127.0.0.1:{srv.server_port}/v1"})
    params["agent_rl"]["rollout"].update(max_turns=2, max_new_tokens=16, temperature=0.0)
    params["agent_grpo"]["output_dir"] = str(tmp_path / "grpo")
    params["agent_csd"]["output_dir"] = str(tmp_path / "csd")
    params["agent_csd"]["csd"].update(require_reply=False, placebo=False)
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"), "PYTHONPATH": str(ROOT),
           "PATH": f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ['PATH']}"}
    for key in ("MLFLOW_RUN_ID", "OMP_NUM_THREADS"):
        env.pop(key, None)

    def train():
        (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
        res = subprocess.run([sys.executable, "-m", "flows.train", "--phases", "agent_grpo", "agent_csd", "--params",
                              str(tmp_path / "params.yaml")], cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=900)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]

    try:
        train()
        for phase, out in (("agent_grpo", "grpo"), ("agent_csd", "csd")):
            assert (tmp_path / out / "final" / "config.json").is_file(), phase
            assert json.loads((tmp_path / "metrics" / f"{phase}.json").read_text())["rollouts_total"] == 8
        client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
        exp = client.get_experiment_by_name("siblings")
        runs = {r.info.run_name: r for r in client.search_runs([exp.experiment_id])}
        parent, grpo, csd = runs["agent_rl"], runs["agent_grpo"], runs["agent_csd"]
        assert {grpo.data.tags["mlflow.parentRunId"], csd.data.tags["mlflow.parentRunId"]} == {parent.info.run_id}
        assert all(r.info.status == "FINISHED" for r in (parent, grpo, csd))
        # side by side: each job started before the other finished
        assert grpo.info.start_time < csd.info.end_time and csd.info.start_time < grpo.info.end_time
        assert {"agent_grpo", "agent_csd"} <= set(client.get_registered_model("mimesis-agent").aliases)
        assert len({v.version for v in client.search_model_versions("name='mimesis-agent'")}) == 2

        # a rerun for the CSD sibling's settings (`dvc repro agent_rl` after `agent_csd.csd.alpha` changed) resumes
        # GRPO from its last checkpoint: nothing of it is trained again
        grpo_steps = (tmp_path / "grpo" / "metrics.jsonl").read_text().count('"kind": "train"')
        params["agent_csd"]["csd"]["alpha"] = 0.02
        train()
    finally:
        srv.shutdown()
    log = (tmp_path / "grpo" / "job.log").read_text()
    assert "resumed from" in log and "steps 2->2" in log, log[-2000:]
    assert (tmp_path / "grpo" / "metrics.jsonl").read_text().count('"kind": "train"') == grpo_steps
    assert (tmp_path / "grpo" / "final" / "config.json").is_file()
    assert "resumed from" not in (tmp_path / "csd" / "job.log").read_text()
