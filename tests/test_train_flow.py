"""Integration: the Prefect flow `train` (midtrain -> sft) with the real Prefect, DeepSpeed
and MLflow on a tiny tmp project: nested MLflow runs, per-step metrics, registered model
versions with the phase aliases, metrics files, Prefect markdown artifacts."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
import yaml

from tests.conftest import ROOT

pytestmark = pytest.mark.slow


def _conversations(n: int, offset: int = 0) -> list[list[dict]]:
    out = []
    for i in range(offset, offset + n):
        out.append([
            {"role": "system", "content": "You are a real human user."},
            {"role": "assistant", "content": f"<think>I need help with task {i}</think>can you help me plan day {i}?"},
            {"role": "user", "content": f"Sure. For day {i} I suggest a museum and a walk."},
            {"role": "assistant", "content": "<think>too long</think>shorter please"},
            {"role": "user", "content": "Museum, then walk."},
        ])
    return out


@pytest.fixture(scope="module")
def flow_run(tmp_path_factory):
    from mimesis_lab.tokenizer import train_tokenizer

    tmp = tmp_path_factory.mktemp("flow")
    schema = {"conversation_id": pl.Utf8, "user_id": pl.Utf8,
              "messages": pl.List(pl.Struct({"role": pl.Utf8, "content": pl.Utf8}))}
    for split, n, off in (("train", 24, 0), ("val", 4, 100)):
        convs = _conversations(n, off)
        pl.DataFrame({"conversation_id": [f"c{off + i}" for i in range(n)],
                      "user_id": [f"u{(off + i) % 5}" for i in range(n)], "messages": convs},
                     schema=schema).write_parquet(tmp / f"{split}.parquet")
    texts = [m["content"] for c in _conversations(24) for m in c]
    train_tokenizer(texts, vocab_size=400, min_frequency=1).save_pretrained(tmp / "tokenizer")
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["tracking"].update(tracking_uri=f"sqlite:///{tmp / 'mlflow.db'}", artifact_location=str(tmp / "art"),
                              experiment="flow-test")
    params["tokenizer"]["output_dir"] = str(tmp / "tokenizer")
    params["model"].update(hidden_size=32, intermediate_size=64, num_hidden_layers=1, head_dim=16)
    for phase, init in (("midtrain", "model"), ("sft", str(tmp / "midtrain" / "final"))):
        params[phase].update(train=str(tmp / "train.parquet"), val=str(tmp / "val.parquet"), init_from=init,
                             deepspeed_config=str(ROOT / "configs/tiny/ds_zero2.json"), max_len=128,
                             epochs=1.0, max_steps=4, eval_every=2, save_every=2, output_dir=str(tmp / phase))
    (tmp / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    env = {**os.environ, "PREFECT_HOME": str(tmp / "prefect"), "OMP_NUM_THREADS": "1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    res = subprocess.run([sys.executable, "-m", "flows.train", "--phases", "midtrain", "sft", "--params", str(tmp / "params.yaml")],
                         cwd=tmp, env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return tmp, params, res.stdout + res.stderr


def test_nested_runs_step_metrics_and_registered_models(flow_run):
    import mlflow

    tmp, params, _ = flow_run
    c = mlflow.MlflowClient(tracking_uri=params["tracking"]["tracking_uri"])
    exp = c.get_experiment_by_name("flow-test")
    runs = c.search_runs([exp.experiment_id])
    parents = [r for r in runs if r.info.run_name == "train"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    children = {r.info.run_name: r for r in runs if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id}
    assert set(children) == {"midtrain", "sft"}
    for phase, run in children.items():
        assert run.info.status == "FINISHED"
        assert run.data.params[f"{phase}.max_steps"] == "4"
        assert len(run.data.tags["git_commit"]) == 40
        for key in ("train_loss", "lr", "grad_norm", "tokens_per_s"):
            assert [m.step for m in c.get_metric_history(run.info.run_id, key)] == [1, 2, 3, 4], key
        assert len(c.get_metric_history(run.info.run_id, "val_loss")) >= 3
        arts = {a.path for a in c.list_artifacts(run.info.run_id)}
        assert {"model", "config"} <= arts
    versions = {v.tags.get("phase"): v for v in c.search_model_versions("name='mimesis-simulator'")}
    assert set(versions) == {"midtrain", "sft"}
    for alias in ("midtrain", "sft"):
        mv = c.get_model_version_by_alias("mimesis-simulator", alias)
        assert mv.run_id == children[alias].info.run_id


def test_metrics_files_and_final_models(flow_run):
    from mimesis_lab.models import load_model

    tmp, _, log = flow_run
    for phase in ("midtrain", "sft"):
        m = json.loads((tmp / "metrics" / f"{phase}.json").read_text())
        assert m["steps"] == 4 and m["registered_version"] in {"1", "2"}
        assert m["final_val_loss"] < m["initial_val_loss"]
        load_model(tmp / phase / "final")
    sft = json.loads((tmp / "metrics" / "sft.json").read_text())
    assert sft["format_prompts"] == 8 and 0 <= sft["format_think_open_close_rate"] <= 1
    assert "Finished in state Completed()" in log


def test_prefect_markdown_artifacts(flow_run):

    tmp, _, _ = flow_run
    code = (
        "import asyncio\n"
        "from prefect.client.orchestration import get_client\n"
        "async def main():\n"
        "    async with get_client() as c:\n"
        "        arts = await c.read_artifacts()\n"
        "        print(sorted({a.key for a in arts if a.key}))\n"
        "asyncio.run(main())\n"
    )
    env = {**os.environ, "PREFECT_HOME": str(tmp / "prefect")}
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "['midtrain-summary', 'sft-summary', 'train-flow-summary']" in res.stdout


def test_concurrent_siblings_and_flow_run_names():
    """agent_grpo and agent_csd run side by side only when both are asked for and both say so; each job gets
    half the cores per rank (at least one thread)."""
    from flows.train import concurrent_siblings, flow_run_name
    from mimesis_lab.config import load_params

    params = load_params(ROOT / "params.yaml")
    both = ["agent_grpo", "agent_csd"]
    assert params.agent_grpo.sibling_jobs == params.agent_csd.sibling_jobs == "concurrent"
    assert concurrent_siblings(params, both, cores=2) == {"agent_grpo": 1, "agent_csd": 1}
    assert concurrent_siblings(params, both, cores=16) == {"agent_grpo": 8, "agent_csd": 8}
    assert concurrent_siblings(params, both, world_size=4, cores=16) == {"agent_grpo": 2, "agent_csd": 2}
    assert concurrent_siblings(params, both, world_size=4, cores=2) == {"agent_grpo": 1, "agent_csd": 1}
    assert concurrent_siblings(params, ["agent_grpo"], cores=2) == {}
    one_says_no = params.model_copy(update={"agent_csd": params.agent_csd.model_copy(
        update={"sibling_jobs": "sequential"})})
    assert concurrent_siblings(one_says_no, both, cores=2) == {}
    assert flow_run_name(["sft"]) == "sft" and flow_run_name(["agent_csd", "agent_grpo"]) == "agent_rl"
    assert flow_run_name(["midtrain", "sft"]) == "train"
