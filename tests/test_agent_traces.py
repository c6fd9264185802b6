"""The `agent_traces` data stage: rewarded oracle traces of the training gyms (the agent's SFT warm
start), every row accounted for (kept or quarantined with its reason), the great-expectations suite
on the output, and clear errors on malformed input."""
from __future__ import annotations

import json

import polars as pl
import pytest

from mimesis_lab import expectations as X
from mimesis_lab.config import load_params
from mimesis_lab.io import InputFileError
from stages import agent_traces as A
from stages import gyms as G
from stages.common import StageError, write_result


@pytest.fixture
def project(in_tmp):
    (in_tmp / "params.yaml").write_text("role_swap:\n  mixture: {\"data/raw/chats/*.jsonl\": 1.0}\n"
                                        "tracking: {enabled: false}\n")
    params = load_params("params.yaml")
    write_result("gyms", G.run_gyms(params.gyms))
    return in_tmp


def test_every_row_accounted_and_traces_rewarded(project):
    params = load_params("params.yaml")
    res = A.build(params)
    n_in = sum(pl.read_parquet(f"data/gyms/{s}.parquet").height for s in ("train", "val"))
    assert res.rows_in == n_in == res.rows_out + len(res.quarantine)
    q = res.quarantine.to_frame()
    assert set(q.get_column("reason").str.extract(r"^([a-z_]+):").to_list()) == {"no_oracle"}   # persuade only
    train = res.outputs["data/agent_sft/train.parquet"]
    assert set(train.get_column("gym")) == {"travel", "turtle", "function", "tau"}
    assert (train.get_column("total_reward") > 0).all()
    for msgs in train.get_column("messages").to_list()[:5]:
        roles = [m["role"] for m in msgs]
        assert roles[-1] == "assistant" and len(roles) >= 3
        assert all(m["content"].startswith(("[action] ", "[answer] ", "[search] ")) for m in msgs
                   if m["role"] == "assistant")
    assert all(v["success"] for v in res.extra["validation"].values())
    # no train/val task in both outputs
    val = res.outputs["data/agent_sft/val.parquet"]
    assert not set(train.get_column("task_id")) & set(val.get_column("task_id"))


def test_unrewarded_and_failing_oracles_are_quarantined(project, monkeypatch):
    from mimesis_lab.envs.gyms import experts

    real = experts.expert_trace

    def flaky(row, tasks, **kw):
        if row["gym"] == "travel":
            return None
        if row["gym"] == "turtle":
            raise RuntimeError("the gym exploded")
        return real(row, tasks, **kw)

    monkeypatch.setattr(experts, "expert_trace", flaky)
    res = A.build(load_params("params.yaml"))
    reasons = res.quarantine.to_frame().get_column("reason").to_list()
    assert any(r.startswith("unrewarded: the travel oracle") for r in reasons)
    assert any(r.startswith("error: turtle task") and "exploded" in r for r in reasons)
    assert res.rows_in == res.rows_out + len(res.quarantine)


def test_malformed_inputs_name_file_and_row(project):
    params = load_params("params.yaml")
    df = pl.read_parquet("data/gyms/train.parquet")
    df.with_columns(pl.when(pl.int_range(pl.len()) == 2).then(pl.lit("{not json")).otherwise(pl.col("reward_model"))
                    .alias("reward_model")).write_parquet("data/gyms/train.parquet")
    with pytest.raises(InputFileError, match=r"train.parquet: row 3: field `reward_model`"):
        A.build(params)
    (project / "data/gyms/train.parquet").unlink()
    with pytest.raises(InputFileError, match="gym rows not found"):
        A.build(params)


def test_no_successful_trace_fails_the_stage(project, monkeypatch):
    from mimesis_lab.envs.gyms import experts

    monkeypatch.setattr(experts, "expert_trace", lambda row, tasks, **kw: None)
    with pytest.raises(StageError, match="no successful oracle trace"):
        A.build(load_params("params.yaml"))


def test_suite_fails_on_corrupted_output(project):
    from stages.validate import get_runner, run_spec

    params = load_params("params.yaml")
    res = A.build(params)
    good = res.outputs["data/agent_sft/train.parquet"]
    bad = good.with_columns(pl.lit(0.0).alias("total_reward"))
    entry = run_spec(X.agent_traces_spec(params, "train"), bad, {}, project / "x.parquet", get_runner())
    assert not entry["success"]
    failed = {f["column"] for f in entry["failures"]}
    assert "total_reward" in failed
    msgs = good.get_column("messages").to_list()
    msgs[0] = msgs[0][:-1] + [{"role": "assistant", "content": "no tool call here"}]
    bad2 = good.with_columns(pl.Series("messages", msgs, dtype=good.schema["messages"]))
    entry = run_spec(X.agent_traces_spec(params, "train"), bad2, {}, project / "x.parquet", get_runner())
    assert not entry["success"]
    assert json.dumps(entry["failures"]).count("replies_use_the_tool") >= 1


def test_show_reward_must_match_agent_grpo():
    import copy

    import yaml

    from mimesis_lab.config import ConfigError, parse_params
    from tests.conftest import ROOT

    data = yaml.safe_load((ROOT / "params.yaml").read_text())
    bad = copy.deepcopy(data)
    bad["agent_traces"]["show_reward"] = False
    with pytest.raises(ConfigError, match="show_reward"):
        parse_params(bad)
