"""The `agent_traces` data stage: rewarded expert traces of the training gyms (the agent's SFT warm
start) — one oracle trace per task plus a seeded share of exploratory ones — every row accounted for
(kept or quarantined with its reason), the great-expectations suite on the output, and clear errors
on malformed input."""
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
    assert len(res.quarantine) == 0        # every training gym has an expert, and each bundled task is rewarded
    train = res.outputs["data/agent_sft/train.parquet"]
    assert set(train.get_column("gym")) == {"travel", "turtle", "function", "tau", "persuade"}
    assert (train.get_column("total_reward") > 0).all()
    oracle = train.filter(pl.col("kind") == "oracle")
    assert oracle.height + len(res.outputs["data/agent_sft/val.parquet"].filter(pl.col("kind") == "oracle")) \
        == res.rows_out
    for msgs in train.get_column("messages").to_list()[:5]:
        roles = [m["role"] for m in msgs]
        assert roles[-1] == "assistant" and len(roles) >= 3
        assert all(m["content"].startswith(("[action] ", "[answer] ", "[search] ")) for m in msgs
                   if m["role"] == "assistant")
    # the experts talk to the user wherever the reward depends on the user (FunctionGym has none)
    asked = oracle.group_by("gym").agg((pl.col("user_turns") > 0).mean().alias("share"))
    assert dict(asked.iter_rows()) == {"travel": 1.0, "turtle": 1.0, "tau": 1.0, "persuade": 1.0, "function": 0.0}
    assert all(v["success"] for v in res.extra["validation"].values())
    # no train/val task in both outputs
    val = res.outputs["data/agent_sft/val.parquet"]
    assert not set(train.get_column("task_id")) & set(val.get_column("task_id"))


def test_exploratory_traces_take_their_share_seeded_and_marked(project):
    params = load_params("params.yaml")
    res = A.build(params, explore_share=0.25, seed=3)
    frames = [res.outputs[f"data/agent_sft/{s}.parquet"] for s in ("train", "val")]
    both = pl.concat(frames)
    n_oracle = int((both.get_column("kind") == "oracle").sum())
    n_explore = int((both.get_column("kind") == "exploratory").sum())
    # 1 exploratory per 3 oracle traces (share 0.25 of all), split by split
    assert n_explore == sum(round(0.25 / 0.75 * int((f.get_column("kind") == "oracle").sum())) for f in frames)
    assert res.extra["explore"]["share"] == pytest.approx(n_explore / (n_oracle + n_explore), abs=1e-4)
    assert res.extra["explore"]["kept"] == n_explore and res.extra["explore"]["attempts"] >= n_explore
    explore = both.filter(pl.col("kind") == "exploratory")
    assert (explore.get_column("seed") != 0).all() and (explore.get_column("total_reward") > 0).all()
    for rec in explore.to_dicts():   # each has its task's oracle trace, and differs from it
        twin = both.filter((pl.col("task_id") == rec["task_id"]) & (pl.col("kind") == "oracle")).to_dicts()
        assert len(twin) == 1 and twin[0]["messages"] != rec["messages"]
    again = A.build(params, explore_share=0.25, seed=3)
    assert again.outputs["data/agent_sft/train.parquet"].equals(res.outputs["data/agent_sft/train.parquet"])
    none = A.build(params, explore_share=0.0)
    assert set(none.outputs["data/agent_sft/train.parquet"].get_column("kind")) == {"oracle"}
    with pytest.raises(StageError, match="explore_share"):
        A.build(params, explore_share=1.0)


def test_coached_copies_come_in_pairs_that_only_the_note_tells_apart(project):
    """agent_traces.coached_share: where the expert's best play and an exploratory play part ways after the
    same history, both are cut after their turn with the template coach's note for it as a user message right
    before it (CSD's teacher-row layout); the source traces stay unchanged."""
    from mimesis_lab.judges.coach import NOTES

    params = load_params("params.yaml")
    assert params.agent_traces.coached_share == 0.0          # the paper's warm start has no notes
    base = A.build(params)
    assert "kept" not in base.extra["coached"]
    res = A.build(params, coached_share=0.5)
    assert res.rows_out == base.rows_out and len(res.quarantine) == len(base.quarantine)
    assert all(v["success"] for v in res.extra["validation"].values())
    n = 0
    for split in ("train", "val"):
        out = res.outputs[f"data/agent_sft/{split}.parquet"]
        src = out.filter(pl.col("kind") != "coached")
        assert src.equals(base.outputs[f"data/agent_sft/{split}.parquet"])   # the originals stay as they were
        coached = out.filter(pl.col("kind") == "coached")
        n += coached.height
        assert coached.height <= round(0.5 * src.height) and coached.height % 2 == 0
        assert not set(coached.get_column("gym")) & {"tau", "function"}      # CSD skips them (agent_csd.csd)
        recs = coached.to_dicts()
        for a, b in zip(recs[::2], recs[1::2]):                                 # a: the oracle's side, b: the other
            assert a["task_id"] == b["task_id"] and a["seed"] == 0 != b["seed"]
            oracle = src.filter((pl.col("task_id") == a["task_id"]) & (pl.col("kind") == "oracle")).to_dicts()[0]
            assert a["messages"][:-2] + a["messages"][-1:] == oracle["messages"][:len(a["messages"]) - 1]
            assert a["messages"][:-2] == b["messages"][:-2]                     # the same history
            assert a["messages"][-1] != b["messages"][-1] and a["messages"][-2] != b["messages"][-2]
            for rec in (a, b):
                note, reply = rec["messages"][-2], rec["messages"][-1]["content"]
                assert note["role"] == "user" and rec["n_turns"] == len(rec["turn_rewards"])
                if reply.startswith("[answer] "):
                    assert note["content"] == NOTES["ready"]
                else:
                    assert reply.startswith("[action] ") and note["content"].startswith("Ask about their remaining")
    counts = res.extra["coached"]
    assert counts["kept"] == n == 2 * counts["pairs"] == counts["ready"] + counts["unmet"] and n > 0
    assert counts["ready"] > 0 and counts["unmet"] > 0
    again = A.build(params, coached_share=0.5)
    assert again.outputs["data/agent_sft/train.parquet"].equals(res.outputs["data/agent_sft/train.parquet"])
    with pytest.raises(StageError, match="coached_share"):
        A.build(params, coached_share=1.5)


def test_divergence_and_turn_note():
    a = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "[action] Do you have a budget?"},
         {"role": "tool", "content": "under $90\nReward: 0.2"}, {"role": "assistant", "content": "[answer] H1"}]
    b = a[:3] + [{"role": "assistant", "content": "[action] Is parking important to you?"}]
    assert A.divergence(a, b) == 3 and A.divergence(a, a) is None
    assert A.divergence(a, a[:1] + [{"role": "tool", "content": "x"}]) is None     # not two agent turns
    assert A.turn_note(a, 3) == "The user is ready: give the final answer now."
    assert A.turn_note(a, 1) == "Ask about their remaining preferences (budget) before searching or answering."
    assert A.turn_note(b, 3) == "Ask about their remaining preferences (amenities) before searching or answering."


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
    assert any(r.startswith("unrewarded: the travel oracle trace") for r in reasons)
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
    assert "rewarded" in json.dumps(entry["failures"])
    msgs = good.get_column("messages").to_list()
    msgs[0] = msgs[0][:-1] + [{"role": "assistant", "content": "no tool call here"}]
    bad2 = good.with_columns(pl.Series("messages", msgs, dtype=good.schema["messages"]))
    entry = run_spec(X.agent_traces_spec(params, "train"), bad2, {}, project / "x.parquet", get_runner())
    assert not entry["success"]
    assert json.dumps(entry["failures"]).count("replies_use_the_tool") >= 1
    # a coached copy without its note before the last reply, or without its source trace
    good = A.build(params, coached_share=0.5).outputs["data/agent_sft/train.parquet"]
    i = good.get_column("kind").to_list().index("coached")
    msgs = good.get_column("messages").to_list()
    msgs[i] = msgs[i][:-2] + msgs[i][-1:]
    bad3 = good.with_columns(pl.Series("messages", msgs, dtype=good.schema["messages"]))
    entry = run_spec(X.agent_traces_spec(params, "train"), bad3, {}, project / "x.parquet", get_runner())
    assert not entry["success"] and "coached_note_before_reply" in json.dumps(entry["failures"])
    orphan = good.filter(pl.col("kind") == "coached").head(1).with_columns(pl.lit("nope").alias("task_id"))
    entry = run_spec(X.agent_traces_spec(params, "train"), pl.concat([good, orphan]), {}, project / "x.parquet",
                     get_runner())
    assert not entry["success"] and "coached_has_oracle" in json.dumps(entry["failures"])


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



def test_traces_must_fit_the_agents_episode_budget():
    """agent_traces.max_steps above the agent rollouts' max_turns stops the stage naming both keys (the warm
    start would imitate episodes the agent may not finish); equal or below passes, for either RL phase."""
    import copy

    import yaml

    from mimesis_lab.config import parse_params
    from tests.conftest import ROOT

    data = yaml.safe_load((ROOT / "params.yaml").read_text())
    turns = data["agent_rl"]["rollout"]["max_turns"]
    assert data["agent_traces"]["max_steps"] <= turns
    for steps, ok in ((turns, True), (turns - 1, True), (turns + 1, False)):
        d = copy.deepcopy(data)
        d["agent_traces"]["max_steps"] = steps
        if ok:
            A.check_episode_budget(parse_params(d))
        else:
            with pytest.raises(StageError, match=r"agent_traces\.max_steps .*max_turns"):
                A.check_episode_budget(parse_params(d))
    d = copy.deepcopy(data)            # a phase's own override counts too
    d["agent_csd"]["rollout"] = {"max_turns": turns - 1}
    with pytest.raises(StageError, match="agent_csd"):
        A.check_episode_budget(parse_params(d))
    with pytest.raises(StageError, match="max_turns"):           # and build() checks before reading any row
        A.build(parse_params(d))
    # null (the schema default): the agent's own budget, the smaller of the two phases' max_turns
    d = copy.deepcopy(data)
    d["agent_traces"]["max_steps"] = None
    assert A.episode_budget(parse_params(d)) == turns
    d["agent_csd"]["rollout"] = {"max_turns": turns - 1}
    p = parse_params(d)
    assert A.episode_budget(p) == turns - 1
    A.check_episode_budget(p)
    d = {k: v for k, v in copy.deepcopy(data).items() if k not in ("agent_rl", "agent_grpo", "agent_csd")}
    d["agent_traces"].pop("max_steps")
    p = parse_params(d)
    assert p.agent_traces.max_steps is None and A.episode_budget(p) == 16   # no agent RL configured: UserRL's
