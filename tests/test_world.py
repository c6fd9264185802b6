"""The seeded synthetic world (mimesis_lab.world): determinism, the project's readers and stages accept
its files with no quarantine, its structural properties hold on the written data, one episode of
every gym plays through the real gym class (oracle or the world's own user policy), the agent-view
experts solve every world task by asking the user (their reward depends on the answers), and the
agent_traces stage gives rewarded warm-start traces on the world's training gyms."""
from __future__ import annotations

import filecmp
import json
import os
import random
import time
from pathlib import Path

import msgspec
import polars as pl
import pytest
from pydantic import ValidationError

from mimesis_lab import config as C
from mimesis_lab.abcd import load_abcd, load_guidelines, load_kb
from mimesis_lab.abcd_policy import base_subflow
from mimesis_lab.envs.gyms.base import ScriptedUser
from mimesis_lab.envs.gyms.experts import ORACLE_GYMS, expert_trace
from mimesis_lab.envs.gyms.registry import ALL_GYMS, MODULES, gym_for_row, load_tasks
from mimesis_lab.io import Quarantine
from mimesis_lab.world import WorldParams, generate_world
from mimesis_lab.world.__main__ import main as cli
from mimesis_lab.world.measure import (context_prediction, enactment, lengths, measure_all, read_jsonl,
                                       withholding)
from mimesis_lab.world.params import CHAT_SOURCES
from mimesis_lab.world.population import sample_population
from mimesis_lab.world.travel import ASK
from mimesis_lab.world.users import world_user
from stages import behavior_tasks as BT, behaviors as B, gyms as G, role_swap as R, splits as S, thoughttrace as T
from stages import tokenizer as TK
from stages.common import write_result
from tests.conftest import ROOT

SMALL = dict(users=24, chats_per_user=2, thoughttrace_conversations=40, abcd_scenarios=10, gym_tasks=4)


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> tuple[Path, dict, float]:
    out = tmp_path_factory.mktemp("world")
    t0 = time.perf_counter()
    counts = generate_world(WorldParams(), out)
    return out, counts, time.perf_counter() - t0


def _gym_tasks(root: Path) -> dict[str, dict[str, dict]]:
    return {g: load_tasks(g, root / "gyms" / g / "tasks.json") for g in ALL_GYMS}


@pytest.fixture(scope="module")
def stages_run(world, tmp_path_factory) -> dict[str, dict]:
    """Run the real data stages (role_swap, thoughttrace, behaviors, behavior_tasks, splits, gyms, tokenizer) on the world
    in a tmp project whose params.yaml points at it; returns each stage's metrics."""
    root = world[0]
    proj = tmp_path_factory.mktemp("proj")
    mixture = "\n".join(f"    {root}/chats/{s}.jsonl: 1.0" for s in CHAT_SOURCES)
    tasks = "\n".join(f"    {g}: {root}/gyms/{g}/tasks.json" for g in ALL_GYMS)
    (proj / "params.yaml").write_text(
        f"tracking: {{enabled: false}}\nrole_swap:\n  mixture:\n{mixture}\n  no_swap_sources: [tom_social]\n"
        f"thoughttrace:\n  input: {root}/thoughttrace/thoughttrace.jsonl\n"
        f"behavior_tasks:\n  abcd_input: {root}/abcd/abcd_v1.1.json\n  kb: {root}/abcd/kb.json\n"
        f"  guidelines: {root}/abcd/guidelines.json\ngyms:\n  tasks:\n{tasks}\n")
    cwd = os.getcwd()
    os.chdir(proj)
    try:
        params = C.load_params("params.yaml")
        out = {mod.STAGE: write_result(mod.STAGE, mod.build(params)) for mod in (R, T, B, BT, S, G, TK)}
        out["_proj"] = {"path": str(proj)}
    finally:
        os.chdir(cwd)
    return out


# ----------------------------------------------------------------------------- generation

def test_same_seed_same_bytes_other_seed_other_world(tmp_path):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    generate_world(WorldParams(**SMALL), a)
    generate_world(WorldParams(**SMALL), b)
    generate_world(WorldParams(seed=99, **SMALL), c)
    files = _tree(a)
    assert files == _tree(b) and len(files) == 21
    _, mismatch, errors = filecmp.cmpfiles(a, b, files, shallow=False)
    assert not mismatch and not errors
    differ = [f for f in files if (a / f).read_bytes() != (c / f).read_bytes()]
    assert "thoughttrace/thoughttrace.jsonl" in differ and "world/population.jsonl" in differ
    assert "abcd/kb.json" not in differ  # the manual is fixed; the worlds differ


def test_default_sizes_and_generation_time(world):
    root, counts, seconds = world
    p = WorldParams()
    assert seconds < 20  # measured ~3 s on one CPU core
    assert sum(counts[f"chats/{s}.jsonl"] for s in CHAT_SOURCES) == p.users * p.chats_per_user
    assert counts["thoughttrace/thoughttrace.jsonl"] == p.thoughttrace_conversations
    assert counts["abcd/abcd_v1.1.json"] == p.abcd_scenarios
    assert all(counts[f"gyms/{g}/tasks.json"] == p.gym_tasks for g in ALL_GYMS)
    manifest = json.loads((root / "world" / "manifest.json").read_text())
    assert manifest["synthetic"] is True and manifest["params"]["seed"] == 1234
    assert set(manifest["files"]) == set(counts)


def test_params_are_strict():
    with pytest.raises(ValidationError):
        WorldParams(unknown=1)
    with pytest.raises(ValidationError):
        WorldParams(users="10")
    with pytest.raises(ValidationError):
        WorldParams(chat_mix={"reddit": 1.0})
    with pytest.raises(ValidationError):
        WorldParams(min_user_turns=5, max_user_turns=3)
    assert all(f.description for f in WorldParams.model_fields.values())


def test_cli_writes_a_world(tmp_path, capsys):
    assert cli(["--out", str(tmp_path), "--seed", "7", "--users", "12", "--chats-per-user", "1",
                "--thoughttrace-conversations", "10", "--abcd-scenarios", "5", "--gym-tasks", "3"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["seed"] == 7 and rep["rows"]["gyms/travel/tasks.json"] == 3
    assert (tmp_path / "gyms" / "tau" / "db.json").is_file()
    assert cli(["--out", str(tmp_path), "--users", "2"]) == 2  # below the minimum: a clean error


# ----------------------------------------------------------------------------- formats and stages

def test_every_file_parses_with_the_projects_readers(world):
    root = world[0]
    for s in CHAT_SOURCES:
        for line in (root / "chats" / f"{s}.jsonl").read_bytes().splitlines():
            msgspec.json.decode(line, type=R.WildChatRecord)
    for line in (root / "thoughttrace" / "thoughttrace.jsonl").read_bytes().splitlines():
        msgspec.json.decode(line, type=T.TTRecord)
    q = Quarantine()
    records, n = load_abcd(root / "abcd" / "abcd_v1.1.json", q)
    kb, gl = load_kb(root / "abcd" / "kb.json"), load_guidelines(root / "abcd" / "guidelines.json")
    assert n == len(records) == 100 and not q.to_frame().height
    assert {base_subflow(r.scenario["subflow"]) for r in records} <= set(kb) and gl
    tasks = _gym_tasks(root)
    for g in ALL_GYMS:
        assert len(tasks[g]) == 30 and len(MODULES[g].build_rows(tasks[g], "train")) == 30


def test_stages_accept_the_world_without_quarantine(stages_run):
    for stage in ("role_swap", "thoughttrace", "behaviors", "behavior_tasks", "splits", "gyms", "tokenizer"):
        m = stages_run[stage]
        assert m["rows_quarantined"] == 0, (stage, m["quarantine_by_reason"])
        assert m["rows_in"] == m["rows_out"] > 0
    rs = stages_run["role_swap"]
    assert set(rs["sources"]) == set(CHAT_SOURCES) and rs["users"] == 150
    assert [k for k, v in rs["sources"].items() if not v["swap"]] == ["tom_social"]
    assert stages_run["thoughttrace"]["turns_without_reasons"] == 0
    assert all(v >= 5 for k, v in stages_run["behavior_tasks"]["tasks_by_behavior"].items() if k != "N")
    sizes = stages_run["splits"]["sizes"]
    assert all(sizes[d]["val"] > 0 for d in sizes)


def test_great_expectations_suites_pass_on_the_world(stages_run):
    from stages.validate import validate_all

    cwd = os.getcwd()
    os.chdir(stages_run["_proj"]["path"])
    try:
        report = validate_all(C.load_params("params.yaml"))
    finally:
        os.chdir(cwd)
    assert report["success"] and report["failed"] == 0 and report["suites_total"] >= 20


def test_midtrain_volume_and_val_tokens_seen_in_train(stages_run):
    """BPE tokens (the tokenizer the stage trained on the train splits): ≥ 45k target tokens per
    mid-training epoch, and ≥ 99% of validation tokens occur in training."""
    from mimesis_lab.tokenizer import load_tokenizer

    proj = Path(stages_run["_proj"]["path"])
    tok = load_tokenizer(proj / "models" / "tokenizer")

    def ids(ds: str, split: str, target: bool = False) -> list[int]:
        msgs = pl.read_parquet(proj / "data" / "splits" / ds / f"{split}.parquet", columns=["messages"])["messages"]
        texts = [m["content"] for conv in msgs.to_list() for m in conv if not target or m["role"] == "assistant"]
        return [i for x in tok(texts, add_special_tokens=False)["input_ids"] for i in x]
    assert len(ids("role_swap", "train", target=True)) >= 45_000
    for ds in ("role_swap", "thoughttrace"):
        seen, val = set(ids(ds, "train")), ids(ds, "val")
        assert sum(i in seen for i in val) / len(val) >= 0.99, ds


# ----------------------------------------------------------------------------- structural properties

@pytest.fixture(scope="module")
def files(world):
    root = world[0]
    return (read_jsonl(root / "thoughttrace" / "thoughttrace.jsonl"),
            read_jsonl(root / "world" / "thoughttrace_meta.jsonl"),
            read_jsonl(root / "world" / "population.jsonl"),
            json.loads((root / "gyms" / "travel" / "tasks.json").read_text()),
            [r for s in CHAT_SOURCES for r in read_jsonl(root / "chats" / f"{s}.jsonl")])


def test_reasoning_carries_what_the_reply_withholds(files):
    tt, meta = files[:2]
    w = withholding(tt, meta)
    assert w["withheld_share"] >= 0.25
    assert w["by_domain"]["travel"] >= 0.4 and w["by_domain"]["telepathy"] >= 0.9
    first = tt[[m["domain"] for m in meta].index("travel")]["messages"]
    assert "$" in first[0]["reasons"][0]["content"] and "$" not in first[0]["content"]


def test_behaviour_enactment_gives_reward_variance(files):
    tt, meta = files[:2]
    e = enactment(tt, meta)
    assert e["conversations"] >= 60
    assert 0.4 <= e["exhibited_share"] <= 0.8
    assert e["exhibit_mean_enacted"] >= 0.7 and e["exhibit_mean_not_enacted"] <= 0.25
    assert set(e["exhibited_by_behavior"]) == {f"B{i}" for i in range(1, 14)}


def test_support_conversations_open_as_the_behaviour_task_does(world, files, stages_run):
    """The simulator's first support turn is trained in the context simulator RL's behaviour task gives it: the
    agent's greeting (the replayed opening, SPEC 2.4) as the first user-role message. A WildChat chat opens
    with the user."""
    import mimesis_lab.envs.behavior_task as BTask
    from mimesis_lab.envs.base import TaskContext
    from mimesis_lab.judges.abcd_agent import GREETING

    root, proj = world[0], Path(stages_run["_proj"]["path"])
    tt, meta, chats = files[0], files[1], files[4]
    support = {m["id"] for m in meta if m["domain"] == "support"}
    assert support and all(r["messages"][0] == {**r["messages"][0], "type": "assistant", "content": GREETING}
                           and r["messages"][1]["type"] == "user" for r in tt if r["id"] in support)
    assert all(r["messages"][0]["type"] == "user" for r in tt if r["id"] not in support)
    assert all(c["conversation"][0]["role"] == "user" for c in chats)
    formatted = pl.read_parquet(proj / "data" / "processed" / "thoughttrace.parquet")
    sft = [m for cid, m in zip(formatted["conversation_id"], formatted["messages"]) if cid in support]
    assert len(sft) == len(support)
    row = pl.read_parquet(proj / "data" / "processed" / "behavior_tasks.parquet").row(0, named=True)
    ctx = TaskContext(kb=load_kb(root / "abcd" / "kb.json"),
                      guidelines=load_guidelines(root / "abcd" / "guidelines.json"))
    rl = BTask.BehaviorEpisode(row, ctx, random.Random(0)).messages()
    assert [m["role"] for m in rl] == ["system", "user"]
    for m in sft:
        assert [x["role"] for x in m[:3]] == ["system", "user", "assistant"] and m[1] == rl[1]
        assert m[2]["content"].startswith("<think>")


def test_public_context_predicts_hidden_preferences(files):
    """Read from public text only (requests, guessing-game categories), two-fold over users."""
    tt, _, pop, travel, chats = files
    c = context_prediction(tt, pop, travel, chats)
    for k in ("area_from_purpose", "amenity_from_purpose"):
        assert c[k]["users"] >= 140 and c[k]["accuracy"] >= c[k]["majority_baseline"] + 0.15, (k, c[k])
    assert c["food_from_cuisine"]["users"] >= 30
    assert c["food_from_cuisine"]["accuracy"] >= c["food_from_cuisine"]["majority_baseline"] + 0.2


def test_turns_are_short(files):
    ln = lengths(files[0])
    assert 3 <= ln["think_words_median"] <= 15 and ln["think_in_3_15"] >= 0.9
    assert ln["utterance_words_p90"] <= 20 and ln["utterance_in_1_20"] >= 0.95
    assert ln["user_turns_min"] >= 2 and ln["user_turns_max"] <= 6


def test_measure_all_summarises_the_world(world):
    m = measure_all(world[0])
    assert m["word_coverage_held_out_users"] >= 0.99
    assert set(m) == {"withholding", "enactment", "context_prediction", "lengths", "word_coverage_held_out_users"}


def test_gym_tasks_come_from_the_population(world):
    root = world[0]
    users = {u.uid: u for u in sample_population(1234, 150)}
    t = _gym_tasks(root)
    for task in t["travel"].values():
        u = users[task["world_user"]]
        assert task["preferences"][0]["check"] == {"attr": "price", "max": u.price_max}
        assert task["preferences"][2]["check"] == {"tag": u.amenity}
    for task in t["intention"].values():
        u = users[task["world_user"]]
        assert all(d["options"][0] in u.pref_value.values() for d in task["missing_details"])
    for task in t["telepathy"].values():
        assert task["entity"] in users[task["world_user"]].fav.values()
    for task in t["persuade"].values():
        u = users[task["world_user"]]
        assert any(tuple(task["reasons"]) == r and task["initial_stance"] == s for s, r in u.opinions.values())
    for task in t["turtle"].values():
        u = users[task["world_user"]]
        assert u.first in task["solution"]
    for task in t["tau"].values():
        assert users[task["world_user"]].email in task["instruction"]


# ----------------------------------------------------------------------------- one episode per gym

def _row(tasks, gym):
    return MODULES[gym].build_rows(tasks[gym], "test")[0]


@pytest.mark.parametrize("gym", ORACLE_GYMS)
def test_oracle_episode_on_every_task(world, gym):
    tasks = _gym_tasks(world[0])
    traces = [expert_trace(r, tasks) for r in MODULES[gym].build_rows(tasks[gym], "test")]
    assert all(t is not None and t["total_reward"] > 0 for t in traces)


# gyms whose reward depends on what only the user knows (their experts must ask)
USER_GYMS = ("travel", "turtle", "persuade", "intention", "telepathy", "tau")


@pytest.mark.parametrize("gym", USER_GYMS)
def test_world_experts_ask_and_depend_on_the_users_answers(world, gym):
    """On the world's tasks, as on the bundled ones: the experts ask the user, and an uninformative user
    (the same non-answer to everything) leaves them with less — the reward comes from the answers."""
    tasks = _gym_tasks(world[0])
    rows = MODULES[gym].build_rows(tasks[gym], "train")
    informed = [expert_trace(r, tasks) for r in rows]
    assert all(t is not None and t["user_turns"] > 0 for t in informed)
    blind_reply = "Irrelevant" if gym == "turtle" else "Hmm."
    blind = [expert_trace(r, tasks, user=ScriptedUser(lambda m: blind_reply)) for r in rows]
    got, without = (sum(t["total_reward"] for t in ts if t) for ts in (informed, blind))
    assert without < got
    if gym in ("turtle", "persuade", "intention", "tau"):
        assert without <= 0.2 * got
    if gym == "telepathy":   # three guesses among a category's few candidates (the cuisine named) can hit
        assert without <= 0.6 * got


def test_world_turtle_judge_pays_the_hidden_story_not_the_template(world):
    """TurtleGym's judge on the world's stories (words the title and surface show are no evidence; a fact needs
    more than half of its other words): the surface, and the name with the templates' frequent word ("kate's
    work"), earn nothing; the solution earns all. The expert, asking the host, explains 95% or more, and
    asks which job / pet / goods only after its first explanation (an episode of a few turns still answers)."""
    from mimesis_lab.envs.gyms import turtle as turt
    from mimesis_lab.envs.gyms.experts.turtle import KINDS

    tasks = _gym_tasks(world[0])
    for t in tasks["turtle"].values():
        shown, name = f"{t['title']} {t['surface']}", t["surface"].split()[0]
        assert turt.judge(t["key_facts"], t["surface"], shown=shown) == 0.0, t["id"]
        assert turt.judge(t["key_facts"], f"{name}'s work: {name} works, for work", shown=shown) == 0.0, t["id"]
        assert turt.judge(t["key_facts"], t["solution"], shown=shown) == 1.0, t["id"]
    traces = [expert_trace(r, tasks) for r in MODULES["turtle"].build_rows(tasks["turtle"], "train")]
    assert all(traces) and sum(t["total_reward"] for t in traces) >= 0.95 * len(traces)
    follow_ups = {f"[action] Does the story involve a {v}?" for vs in KINDS.values() for v in vs}
    for t in traces:
        replies = [m["content"] for m in t["messages"] if m["role"] == "assistant"]
        first_answer = next(i for i, r in enumerate(replies) if r.startswith("[answer]"))
        assert not any(r in follow_ups for r in replies[:first_answer]), replies


def test_warm_start_traces_on_the_worlds_training_gyms(stages_run):
    """The agent_traces stage on the world (gyms stage rows of the five training gyms), with the experts held to
    the agent's episode budget (agent_traces.max_steps = agent_rl.rollout.max_turns): every trace fits it and is
    rewarded, every gym with a user side asks it, and a row whose expert cannot finish in time is quarantined as
    unrewarded, counted, not dropped (tau's expert needs about 8 turns: none of its rows gets a trace)."""
    from stages import agent_traces as AT

    cwd = os.getcwd()
    os.chdir(stages_run["_proj"]["path"])
    try:
        default = C.load_params(ROOT / "params.yaml")      # the default profile's budget
        budget = default.agent_traces.max_steps
        assert budget <= default.agent_grpo.rollout.max_turns
        params = C.load_params("params.yaml")
        params = params.model_copy(update={"agent_traces": params.agent_traces.model_copy(update={"max_steps": budget})})
        m = write_result(AT.STAGE, AT.build(params))
        traces = pl.read_parquet(Path(params.agent_traces.output_dir) / "train.parquet")
    finally:
        os.chdir(cwd)
    assert m["rows_in"] == m["rows_out"] + m["rows_quarantined"] == 5 * WorldParams().gym_tasks   # train + val rows
    assert set(m["quarantine_by_reason"]) <= {"unrewarded"}
    assert m["per_gym"]["tau"].get("quarantined_unrewarded") == WorldParams().gym_tasks
    summary = m["summary"]["train"]
    assert set(summary) == {"travel", "turtle", "function", "persuade"}
    for gym, kinds in summary.items():
        assert kinds["oracle"]["mean_reward"] > 0
        assert kinds["oracle"]["mean_turns"] <= budget
        assert kinds["oracle"]["asked_user_share"] == (0.0 if gym == "function" else 1.0), gym
    replies = traces["messages"].map_elements(lambda ms: sum(x["role"] == "assistant" for x in ms),
                                              return_dtype=pl.Int64)
    assert replies.max() <= budget
    assert m["explore"]["kept"] > 0


def test_task_ids_never_collide_with_the_bundled_fixtures(world):
    """Components that ignore gyms.tasks and read the bundled files then fail loudly (unknown id)."""
    tasks = _gym_tasks(world[0])
    for g in ALL_GYMS:
        assert not set(tasks[g]) & set(load_tasks(g)), g
        assert all("-w1234-" in tid for tid in tasks[g])


def _play(world, gym):
    tasks = _gym_tasks(world[0])
    row = _row(tasks, gym)
    task = tasks[gym][row["reward_model"]["id"]]
    users = {u.uid: u for u in sample_population(1234, 150)}
    g = gym_for_row(row, tasks, ScriptedUser(world_user(gym, task, users)), random.Random(0))
    return g, task


def test_travel_episode_with_the_world_user(world):
    g, task = _play(world, "travel")
    total = 0.0
    for topic in ("price", "area", "amenity"):
        for _ in range(4):   # a vague answer gets a follow-up; a noncooperative user may dodge once
            res = g.step("action", ASK[topic].split("|")[0].strip("(").replace("{city}", task["city"]))
            total += res.reward
            if res.info["elicited"]:
                break
    assert total == pytest.approx(0.2 * sum(not p["stated"] for p in task["preferences"]))
    best = next(o for o in task["options"] if o["id"] == task["best_id"])
    assert g.step("search", best["name"]).reward == pytest.approx(0.2)
    assert g.step("answer", task["best_id"]).reward == pytest.approx(1.0)


def test_persuade_episode_moves_toward_the_target(world):
    from mimesis_lab.world.lexicon import CLAIMS

    g, task = _play(world, "persuade")
    claim = next(k for k, v in CLAIMS.items() if v[0] == task["claim"])
    key = dict(CLAIMS[claim][1] + CLAIMS[claim][2])[task["reasons"][0]]
    res = g.step("action", f"about the {key}: there is a good answer to that.")
    assert res.info["stance_parsed"] and res.reward == pytest.approx(1 / 6)


def test_intention_episode_uncovers_the_users_details(world):
    g, task = _play(world, "intention")
    for d in task["missing_details"]:
        res = g.step("action", d["inquiry"])
        assert d["options"][0].lower() in res.observation.lower()
    assert g.done and g.total_reward() > 0


def test_telepathy_turtle_tau_search_episodes_with_the_world_user(world):
    from mimesis_lab.world.lexicon import ATTRIBUTE_QUESTION, ENTITIES

    g, task = _play(world, "telepathy")
    cat = next(c for c, e in ENTITIES.items() if task["entity"] in e)
    attr = next(a for a in ATTRIBUTE_QUESTION if a in ENTITIES[cat][task["entity"]]) \
        if ENTITIES[cat][task["entity"]] else None
    if attr:
        assert g.step("action", ATTRIBUTE_QUESTION[attr]).observation.lower().startswith("y")
    assert g.step("answer", task["entity"]).reward == 1.0

    g, task = _play(world, "turtle")
    word = task["key_facts"][0].split()[-1]
    assert g.step("action", f"does the story involve a {word}?").observation == "Yes"
    assert g.step("action", "was it raining?").observation == "Irrelevant"
    assert g.step("answer", task["solution"]).reward == pytest.approx(1.0)

    g, task = _play(world, "tau")
    for a in task["actions"]:
        g.step("action", json.dumps({"name": a["name"], "arguments": a["kwargs"]}))
    assert "order" in g.step("answer", "Which order is it about?").observation
    res = g.step("answer", "Done. Is there anything else?")
    assert res.done and res.reward == 1.0 and res.info["ended_by"] == "user"

    g, task = _play(world, "search")
    assert g.step("action", "what do you mean?").observation.startswith("User:")
    g.step("search", task["question"])
    assert g.step("answer", task["answer"]).reward == 1.0
