"""UserRL's rows and task files as published: the real ``data_source`` names, tasks inline in
``create_kwargs`` (turtle, telepathy, persuade) or in UserRL's task schemas, gym tasks that cannot be
played or reward a wrong answer rejected with the field named, the ``gyms`` stage's import of the
rows (``gyms.userrl_rows``) accounting for every row by reason, and the consumers of rows
(``load_gym_rows``, ``agent_eval.select_rows``, ``agent_traces``) on rows without our columns.

The real samples live in ``../shared/reference-data/userrl`` (skipped when absent)."""
from __future__ import annotations

import json
import math
import random
import shutil
from pathlib import Path
from types import SimpleNamespace

import polars as pl
import pytest

from mimesis_lab import config as C
from mimesis_lab.envs.gyms import experts, registry
from mimesis_lab.envs.gyms.base import GYMS, USERRL_DATA_SOURCES, gym_name
from mimesis_lab.envs.gyms.offline_user import OfflineUser
from mimesis_lab.io import Quarantine
from mimesis_lab.rollout.agent_env import load_gym_rows
from stages import gyms as G
from stages.common import StageError, quarantine_path, write_result
from tests.conftest import ROOT

REF = ROOT.parent / "shared" / "reference-data" / "userrl"
ROWS = REF / "rows-sample"
need_ref = pytest.mark.skipif(not ROWS.is_dir(), reason="shared UserRL reference data absent")
RAW = ROOT / "data" / "raw" / "gyms"


def _rows(name: str) -> list[dict]:
    path = ROWS / f"{name}_train_sample.parquet" if (ROWS / f"{name}_train_sample.parquet").is_file() \
        else REF / f"{name}_multiturn_test.parquet"
    return pl.read_parquet(path).to_dicts()


def _ref_tasks() -> dict[str, dict]:
    return {"function": registry.load_tasks("function", REF / "functions.json"),
            "intention": registry.load_tasks("intention", REF / "all_intentions_test.json"),
            "turtle": registry.load_tasks("turtle", REF / "turtle_stories_sample.json"),
            "telepathy": registry.load_tasks("telepathy", REF / "telepathy_entities_sample.json")}


def test_userrl_data_source_names_are_registered_and_ours_stay():
    for ds, name in USERRL_DATA_SOURCES.items():
        assert gym_name(ds) == name and GYMS[ds] is GYMS[f"interact_{name}"]
    for name in registry.ALL_GYMS:
        assert gym_name(f"interact_{name}") == name
    assert gym_name("interact_nosuchgym") is None
    with pytest.raises(registry.RowError, match="unknown_data_source"):
        registry.row_identity({"data_source": "interact_nosuchgym"})


# --------------------------------------------------------------------------------------- real rows
@need_ref
@pytest.mark.parametrize("name", ["function", "intention", "persuade", "turtle", "telepathy"])
def test_episode_runs_and_expert_scores_on_real_rows(name):
    """Each real sample row resolves to an episode that runs; the gym's expert with the offline user
    scores > 0 (every row for function and persuade, at least one row for the others)."""
    tasks = _ref_tasks()
    rows = _rows("intention" if name == "intention" else name)
    if name == "intention":
        rows = pl.read_parquet(REF / "intention_multiturn_test.parquet").to_dicts()[:6]
    scores = []
    for row in rows:
        ident = registry.row_identity(row)
        assert ident["gym"] == name and ident["task_id"] and ident["split"] in ("train", "test")
        gym = registry.gym_for_row(row, tasks, None, random.Random(0), max_steps=4)
        gym.user = OfflineUser(gym, random.Random(0))
        res = gym.step("action", "1 2 3 4" if name == "function" else "Is it something people use every day?")
        assert isinstance(res.observation, str) and res.observation and math.isfinite(res.reward)
        tr = experts.expert_trace(row, tasks)
        scores.append(0.0 if tr is None else tr["total_reward"])
    if name == "turtle":
        # the expert knows our classic puzzles and generic hunches, not these stories; copying their surface
        # into the explanation earns nothing (the judge does not count words the surface already shows)
        assert max(scores) == 0, scores
        return
    assert max(scores) > 0
    if name in ("function", "persuade"):
        assert min(scores) > 0, scores


@need_ref
def test_inline_tasks_read_from_create_kwargs():
    t = registry.resolve_task(_rows("turtle")[0], {})
    assert t[0] == "turtle" and t[1] == "The Online Meeting" and t[2]["solution"].startswith("When Xiaomei")
    assert t[2]["key_facts"]
    name, tid, task = registry.resolve_task(_rows("telepathy")[0], {})
    assert (name, tid, task["entity"]) == ("telepathy", "Da Vinci's The Last Supper", "Da Vinci's The Last Supper")
    assert "The Last Supper" in task["aliases"] and task["category"] == "artwork"
    name, tid, task = registry.resolve_task(_rows("persuade")[0], {})
    assert name == "persuade" and tid == "GXQNF6JJFMTV" and task["target"] == "disagree" and task["reasons"]
    # UserRL's persuade prompt says: argue with `answer`; that must not end the episode
    gym = registry.gym_for_row(_rows("persuade")[0], {}, None, random.Random(0))
    gym.user = OfflineUser(gym, random.Random(0))
    assert not gym.step("answer", "Paying athletes would be fair.").done


@need_ref
def test_userrl_task_files_load_and_name_missing_fields(tmp_path):
    tasks = _ref_tasks()
    assert len(tasks["turtle"]) == 6 and all(t["key_facts"] for t in tasks["turtle"].values())
    assert all(t["evaluation"] for t in tasks["turtle"].values())    # UserRL's LLM-judge statements kept
    assert tasks["telepathy"]["entity_001"]["entity"] == "Albert Einstein"
    for g in ("turtle", "telepathy"):
        for row in registry.MODULES[g].build_rows(tasks[g], "test"):
            registry.gym_for_row(row, tasks, None, random.Random(0))
    story = json.loads((REF / "turtle_stories_sample.json").read_text())
    del story["5"]["new_surface"]
    (tmp_path / "t.json").write_text(json.dumps({"5": story["5"]}))
    with pytest.raises(ValueError, match="new_surface"):
        registry.load_tasks("turtle", tmp_path / "t.json")
    ent = json.loads((REF / "telepathy_entities_sample.json").read_text())[0]
    del ent["target_entity"]
    (tmp_path / "e.json").write_text(json.dumps([ent]))
    with pytest.raises(ValueError, match="target_entity"):
        registry.load_tasks("telepathy", tmp_path / "e.json")


# ------------------------------------------------------------------------- unplayable / wrong tasks
GOOD_FN = {"id": "f-ok", "rule": "a + b * c - d", "test_case": [2, 3, 4, 5], "expected_result": 9.0}


@pytest.mark.parametrize("patch, field", [
    ({"expected_result": float("nan")}, "expected_result"),
    ({"expected_result": float("inf")}, "expected_result"),
    ({"expected_result": 10.0}, "does not follow from the rule"),
    ({"expected_result": "9.0"}, "expected_result"),
    ({"test_case": ["2", "3", "4", "5"]}, "test_case"),
    ({"test_case": [2.0, 3, 4, 5]}, "test_case"),
    ({"test_case": [True, 3, 4, 5]}, "test_case"),
    ({"test_case": None}, "test_case"),
])
def test_function_task_that_rewards_a_wrong_answer_is_rejected(tmp_path, patch, field):
    path = tmp_path / "f.json"
    path.write_text(json.dumps([GOOD_FN, dict(GOOD_FN, id="f-bad", **patch)]))
    with pytest.raises(ValueError, match=field):
        registry.load_tasks("function", path)
    q = Quarantine()
    _, n, loaded = G.load_gym("function", str(path), q)
    assert n == 2 and [t for _, t, _ in loaded] == ["f-ok"]
    assert len(q) == 1 and "f-bad" in q.reason[0] and field.split()[0] in q.reason[0]


def test_intention_null_options_are_rejected(tmp_path):
    tasks = json.loads((RAW / "intention" / "tasks.json").read_text())
    bad = json.loads(json.dumps(tasks[0]))
    bad["id"] = "bad-1"
    bad["missing_details"][0]["options"] = None
    path = tmp_path / "i.json"
    path.write_text(json.dumps([tasks[0], bad]))
    q = Quarantine()
    _, _, loaded = G.load_gym("intention", str(path), q)
    assert len(loaded) == 1 and len(q) == 1 and "options" in q.reason[0] and "missing_details[0]" in q.reason[0]


# --------------------------------------------------------------------------------- the gyms stage
def _params(tmp_path: Path, tasks: dict[str, str], extra: str = "") -> C.Params:
    lines = ["role_swap:", '  mixture: {"data/raw/chats/*.jsonl": 1.0}', "tracking: {enabled: false}", "gyms:",
             "  tasks:"] + [f"    {g}: {p}" for g, p in tasks.items()]
    (tmp_path / "params.yaml").write_text("\n".join(lines) + "\n" + extra)
    return C.load_params(tmp_path / "params.yaml")


@need_ref
def test_import_of_real_rows_accounts_for_every_row(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rows").mkdir()
    for f in [*ROWS.glob("*.parquet"), *REF.glob("*_multiturn_test.parquet")]:
        shutil.copy(f, tmp_path / "rows" / f.name)
    tasks = {g: str(RAW / g / "tasks.json") for g in registry.ALL_GYMS}
    tasks.update(function=str(REF / "functions.json"), intention=str(REF / "all_intentions_test.json"))
    params = _params(tmp_path, tasks, "  userrl_rows: rows\n")
    m = write_result(G.STAGE, G.build(params))
    n_in = sum(pl.read_parquet(f).height for f in (tmp_path / "rows").glob("*.parquet"))
    assert m["rows_in"] == n_in == m["rows_out"] + m["rows_quarantined"]
    per = m["per_gym"]
    assert sum(v["rows_in"] for v in per.values()) == n_in
    for g, v in per.items():
        assert v["rows_in"] == v["rows_out"] + v["rows_quarantined"] == v["rows_out"] + sum(
            v["quarantine_by_reason"].values())
        assert v["rows_out"] == v["train"] + v["val"] + v["test"]
    # inline gyms and function import fully; tau/travel/intention-train ids are not in the task files given
    for g in ("function", "persuade", "turtle", "telepathy"):
        assert per[g]["rows_quarantined"] == 0, per[g]
    assert per["function"]["test"] == 78 and per["telepathy"]["test"] == per["telepathy"]["moved_to_test"] == 4
    assert per["persuade"]["train"] + per["persuade"]["val"] == 4 and per["persuade"]["val"] >= 1
    for g in ("tau", "travel"):
        assert per[g]["quarantine_by_reason"] == {"task_missing": 4}
    assert per["intention"]["quarantine_by_reason"] == {"task_missing": 4} and per["intention"]["test"] == 40
    # the gyms left without a row say why (they are not evaluated; validate does not require them)
    assert m["gyms_without_rows"] == {"tau": "all 4 row(s) quarantined (task_missing: 4)",
                                      "travel": "all 4 row(s) quarantined (task_missing: 4)",
                                      "search": "no row in gyms.userrl_rows"}
    q = pl.read_parquet(quarantine_path(G.STAGE))
    assert q.height == m["rows_quarantined"] and q.get_column("reason").str.starts_with("task_missing").all()
    assert q.filter(pl.col("reason").str.contains("retail-train-000")).height == 1
    # our data_source in the outputs, UserRL's kept; the outputs pass their suites' key checks
    test = pl.read_parquet(tmp_path / "data" / "gyms" / "test.parquet")
    tele = test.filter(pl.col("gym") == "telepathy")
    assert set(tele.get_column("data_source")) == {"interact_telepathy"}
    extra = json.loads(tele.get_column("extra_info")[0])
    assert extra["userrl_data_source"] == "interact_telepathygym"
    assert extra["tools_kwargs"]["interact_with_env"]["create_kwargs"]["id"] == tele.get_column("task_id")[0]
    # every imported row makes an episode, through the consumers' loader
    tasks_by = {g: registry.load_tasks(g, p) for g, p in tasks.items() if g in ("function", "intention")}
    for split in ("train", "val", "test"):
        for row in load_gym_rows(tmp_path / "data" / "gyms" / f"{split}.parquet"):
            registry.gym_for_row(row, tasks_by, None, random.Random(0))


def test_import_quarantines_bad_rows_by_reason(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fn = json.loads((RAW / "function" / "tasks.json").read_text())
    ok = G.registry.MODULES["function"].build_rows({fn[0]["id"]: fn[0], fn[1]["id"]: fn[1]}, "train")
    wrong_gt = json.loads(json.dumps(ok[1]))
    wrong_gt["reward_model"]["ground_truth"] = "123456.0"
    wrong_gt["reward_model"]["id"] = wrong_gt["extra_info"]["tools_kwargs"]["interact_with_env"]["create_kwargs"][
        "id"] = fn[2]["id"]
    rows = [*ok, wrong_gt, dict(ok[0]), {**ok[0], "data_source": "interact_nosuchgym"},
            {**ok[0], "prompt": []},
            {**ok[0], "extra_info": {"tools_kwargs": {"interact_with_env": {"create_kwargs": {"id": "nope"}}}},
             "reward_model": {"id": "nope"}},
            {"data_source": "interact_turtlegym", "prompt": ok[0]["prompt"], "ability": "interaction",
             "reward_model": {}, "extra_info": {"tools_kwargs": {"interact_with_env": {"create_kwargs": {
                 "title": "T", "surface": "A man smiles."}}}}}]
    (tmp_path / "rows").mkdir()
    pl.DataFrame([{k: (json.dumps(v) if k in ("reward_model", "extra_info") else v) for k, v in r.items()}
                  for r in rows]).write_parquet(tmp_path / "rows" / "r.parquet")
    params = _params(tmp_path, {g: str(RAW / g / "tasks.json") for g in registry.ALL_GYMS}, "  userrl_rows: rows\n")
    m = write_result(G.STAGE, G.build(params))
    assert m["rows_in"] == len(rows) and m["rows_out"] == 2
    assert m["quarantine_by_reason"] == {"duplicate": 1, "ground_truth": 1, "malformed task": 1, "prompt": 1,
                                         "task_missing": 1, "unknown_data_source": 1}
    reasons = pl.read_parquet(quarantine_path(G.STAGE)).get_column("reason").to_list()
    assert any("'bottom'" in r for r in reasons)      # the missing inline field is named


def test_stage_writes_its_quarantine_when_it_then_fails(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shutil.copytree(RAW, tmp_path / "raw" / "gyms")
    path = tmp_path / "raw" / "gyms" / "function" / "tasks.json"
    path.write_text(json.dumps([dict(t, expected_result=float(t["expected_result"]) + 1)
                                for t in json.loads(path.read_text())]))
    params = _params(tmp_path, {g: f"raw/gyms/{g}/tasks.json" for g in registry.ALL_GYMS})
    with pytest.raises(StageError, match="0 usable task"):
        G.build(params)
    q = pl.read_parquet(quarantine_path(G.STAGE))
    assert q.height == len(json.loads(path.read_text()))
    assert q.get_column("reason").str.contains("does not follow from the rule").all()


# ------------------------------------------------------------------------------------- consumers
@need_ref
def test_consumers_accept_rows_without_our_columns(tmp_path):
    frames = [pl.read_parquet(f) for f in sorted(ROWS.glob("*.parquet"))]
    combined = pl.concat([f.select("data_source", "prompt", "ability") for f in frames], how="vertical")
    combined = combined.with_columns(
        reward_model=pl.Series([json.dumps(r) for f in frames for r in f.get_column("reward_model").to_list()]),
        extra_info=pl.Series([json.dumps(r) for f in frames for r in f.get_column("extra_info").to_list()]))
    bad = combined.head(1).with_columns(data_source=pl.lit("interact_nosuchgym"))
    pl.concat([combined, bad]).write_parquet(tmp_path / "all.parquet")
    skipped: dict[str, int] = {}
    rows = load_gym_rows(tmp_path / "all.parquet", skipped)
    assert len(rows) == combined.height and skipped == {"unknown_data_source": 1}
    assert {r["gym"] for r in rows} == {"function", "intention", "persuade", "tau", "telepathy", "travel", "turtle"}
    assert all(r["task_id"] and r["split"] == "train" for r in rows)

    from mimesis_lab.evals.agent_eval import select_rows

    cfg = SimpleNamespace(data=[str(tmp_path / "all.parquet")], gyms=["turtle", "telepathy", "function", "tau"],
                          max_tasks_per_gym=lambda: 3)
    skipped = {}
    tasks = {"function": registry.load_tasks("function", REF / "functions.json"),
             "tau": registry.load_tasks("tau"), "turtle": {}, "telepathy": {}}
    sel = select_rows(cfg, skipped, tasks)
    assert {g: len(v) for g, v in sel.items()} == {"turtle": 3, "telepathy": 3, "function": 3, "tau": 0}
    assert skipped == {"unknown_data_source": 1, "gym_not_evaluated": 12, "task_missing": 4,
                       "over_tasks_per_gym": 3}
    assert sum(skipped.values()) + sum(len(v) for v in sel.values()) == combined.height + 1


@need_ref
def test_agent_traces_on_published_rows(tmp_path, monkeypatch):
    from stages import agent_traces as A

    monkeypatch.chdir(tmp_path)
    (tmp_path / "data" / "gyms").mkdir(parents=True)
    for split, names in (("train", ("function", "persuade", "tau")), ("val", ("turtle",))):
        rows = [r for n in names for r in pl.read_parquet(ROWS / f"{n}_train_sample.parquet").to_dicts()]
        pl.DataFrame([{**r, "reward_model": json.dumps(r["reward_model"]), "extra_info": json.dumps(r["extra_info"])}
                      for r in rows]).write_parquet(tmp_path / "data" / "gyms" / f"{split}.parquet")
    params = _params(tmp_path, {"function": str(REF / "functions.json")})
    res = A.build(params, explore_share=0.0)
    assert res.rows_in == 16 == res.rows_out + len(res.quarantine)
    train = res.outputs["data/agent_sft/train.parquet"]
    assert {"function", "persuade"} <= set(train.get_column("gym"))
    assert set(train.get_column("split")) == {"train"}
    assert all(r.startswith(("error:", "unrewarded:", "task_missing:", "task_file:")) for r in res.quarantine.reason)
    tau = [r for r in res.quarantine.reason if "retail-train-000" in r]   # tau ids absent from the bundled file
    assert tau and all(r.startswith(("task_missing:", "task_file:")) for r in tau), tau


@need_ref
def test_real_tau_rows_resolve_on_the_real_task_file_and_retail_db():
    """UserRL's tau rows (interact_taugym, task id in create_kwargs) find their tasks in UserRL's tau task file
    read against tau-bench's retail database (gyms.tau_db), and the gym plays them."""
    import random

    from mimesis_lab.envs.gyms.registry import gym_for_row, load_tasks, resolve_task

    rows = pl.read_parquet(ROWS / "tau_train_sample.parquet").to_dicts()
    tasks = {"tau": load_tasks("tau", REF / "tau_train_tasks_sample.json", db=REF.parent / "tau-bench-retail")}
    got = [resolve_task(r, tasks)[:2] for r in rows]
    assert got == [("tau", f"retail-train-00{i}") for i in range(len(rows))]
    gym = gym_for_row(rows[0], tasks, None, random.Random(0))
    assert gym.task["id"] == "retail-train-000"


@need_ref
def test_turtle_oracle_guess_scores_on_real_stories():
    """A guess is judged by the bottom story's sentences, from the task file as from the rows: the bottom
    story itself scores 1 on every real story (UserRL's meta-phrased evaluation statements gave 0 on
    2 of 6), half of it scores in between, the surface alone scores less."""
    from mimesis_lab.envs.gyms import turtle

    stories = registry.load_tasks("turtle", REF / "turtle_stories_sample.json")
    inline = [registry.resolve_task(r, {})[2] for r in _rows("turtle")]
    for t in [*stories.values(), *inline]:
        gym = turtle.TurtleGym(t)
        assert gym.step("answer", t["solution"]).reward == 1.0, t["id"]
        sents = t["key_facts"]
        half = turtle.judge(sents, " ".join(sents[: len(sents) // 2]))
        if len(sents) >= 2:
            assert 0 < half < 1, t["id"]
        assert turtle.judge(sents, t["surface"]) < 1.0
        assert turtle.judge(sents, t["surface"], shown=f"{t['title']} {t['surface']}") == 0.0, t["id"]


@need_ref
def test_tau_expert_on_real_tau_tasks_and_rows():
    """The tau expert reads the choice mapping from the row's prompt (UserRL's rows: `answer` calls a
    tool, `action` talks to the customer) and, with the offline user, earns tau-bench's reward on
    UserRL's real rows (returns, an exchange with a cancel) and on every real task (returns, exchanges,
    cancels, payment changes, item modifications, an item "modified" to itself) with a clear user."""
    from mimesis_lab.envs.gyms.experts.tau import userrl_protocol
    from mimesis_lab.envs.gyms import tau

    tasks = {"tau": registry.load_tasks("tau", REF / "tau_train_tasks_sample.json", db=REF.parent / "tau-bench-retail")}
    rows = _rows("tau")
    assert userrl_protocol(rows[0]["prompt"][0]["content"])
    assert userrl_protocol(tau.USERRL_SYSTEM_PROMPT) and not userrl_protocol(tau.system_prompt())
    scores = [(tr or {}).get("total_reward", 0.0) for tr in (experts.expert_trace(r, tasks) for r in rows)]
    assert scores == [1.0] * len(rows)
    built = registry.MODULES["tau"].build_rows(tasks["tau"], "train")
    scores = [(experts.expert_trace(r, tasks, vague_rate=0.0) or {}).get("total_reward", 0.0) for r in built]
    assert len(built) == 12 and scores == [1.0] * 12, scores


# --------------------------------------------------------------------------------- consumers, no task file
@need_ref
def test_an_unreadable_task_file_leaves_inline_rows_playable_and_names_the_file(tmp_path):
    """Rows that carry their task inline need no task file; the others are left out with reason
    ``task_file`` naming the file and the error, in every consumer (not a FileNotFoundError)."""
    missing = tmp_path / "nowhere" / "tasks.json"
    tasks = {g: registry.load_tasks_or_unreadable(g, missing) for g in ("persuade", "tau")}
    assert all(isinstance(t, registry.UnreadableTasks) for t in tasks.values())
    assert str(missing) in tasks["tau"].error and "FileNotFoundError" in tasks["tau"].error
    name, tid, task = registry.resolve_task(_rows("persuade")[0], tasks)    # inline: no file needed
    assert name == "persuade" and task["reasons"]
    with pytest.raises(registry.TaskLookupError) as e:
        registry.resolve_task(_rows("tau")[0], tasks)
    assert e.value.reason == "task_file" and str(missing) in str(e.value)
    # the agent RL jobs: rows counted by reason, the playable ones kept
    from mimesis_lab.jobs.agent_grpo import load_training_rows

    rows_file = tmp_path / "rows.parquet"
    pl.DataFrame(_rows("persuade") + _rows("tau")).write_parquet(rows_file)
    cfg = SimpleNamespace(data=str(rows_file), gyms={"persuade": 1.0, "tau": 1.0})
    skipped: dict[str, int] = {}
    by_gym, got = load_training_rows(cfg, {"persuade": str(missing), "tau": str(missing)}, skipped_out=skipped)
    assert set(by_gym) == {"persuade"} and len(by_gym["persuade"]) == 4 and skipped == {"task_file": 4}
    # a well-formed file without the row's id keeps the old reason
    err = registry.TaskLookupError("x")
    assert err.reason == "task_missing"
