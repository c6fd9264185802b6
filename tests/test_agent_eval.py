"""Agent evaluation (SPEC §4.2): aggregation (Mean, MR, invalid cells), cache/resume, failing users, the
training-user guard, and the scripted evaluation user.

Tiny and offline: a byte-level BPE trained on a few gym prompts, a hand-wired 2-layer agent that always
replies ``[action] What matters most to you?`` (its layers' outputs are zeroed and the embedding/LM head form
a token chain: greedy decoding follows it from the generation prompt's last token to ``<|im_end|>``), a
random tiny agent, the scripted user and loopback HTTP endpoints that refuse, fail or chat without a stance.
"""
from __future__ import annotations

import json
import random
import shutil

import polars as pl
import pytest
import torch

from mimesis_lab.config import AgentRolloutParams, ModelParams, OpenAIEndpoint
from mimesis_lab.config_eval import AgentEvalParams, EvalUserParams
from mimesis_lab.envs.gyms.registry import MODULES, gym_for_row, load_tasks
from mimesis_lab.evals.agent_eval import aggregate, cell_from_records, run_agent_eval
from mimesis_lab.evals.eval_users import ScriptedEvalUser, TrainingUserError
from mimesis_lab.rollout.serve import BackgroundHTTPServer, HTTPError

REPLY = "[action] What matters most to you?"
GYMS = ("travel", "function", "persuade")


# ----------------------------------------------------------------------------------- aggregation
def _cell(score):
    return {"score": score, "status": "ok" if score is not None else "invalid"}


def test_aggregate_mean_and_rank_with_ties_and_invalid_cells():
    table = {  # agent -> user -> gym -> score (None = invalid cell)
        "a1": {"A": {"g1": 1.0, "g2": 0.5, "g3": None}, "B": {"g1": None, "g2": None, "g3": 0.3},
               "C": {"g1": None, "g2": None, "g3": None}},
        "a2": {"A": {"g1": 1.0, "g2": 0.0, "g3": 0.7}, "B": {"g1": None, "g2": None, "g3": 0.9},
               "C": {"g1": None, "g2": None, "g3": None}},
        "a3": {"A": {"g1": 0.0, "g2": 0.5, "g3": 0.2}, "B": {"g1": None, "g2": None, "g3": 0.3},
               "C": {"g1": None, "g2": None, "g3": None}},
    }
    cells = {a: {u: {g: _cell(s) for g, s in gs.items()} for u, gs in us.items()} for a, us in table.items()}
    per_user, overall = aggregate(cells)
    # user A: g3 is invalid for a1 -> left out for every method; g1 ties a1/a2 (1.5, 1.5, 3), g2 ties a1/a3
    a = per_user["A"]
    assert a["gyms_used"] == ["g1", "g2"] and a["excluded_gyms"] == {"g3": ["a1"]}
    assert a["mean"] == pytest.approx({"a1": 0.75, "a2": 0.5, "a3": 0.25})
    assert a["mean_rank"] == pytest.approx({"a1": 1.5, "a2": 2.25, "a3": 2.25})
    # user B: only g3 is valid; a1/a3 tie for rank 2.5
    assert per_user["B"]["mean"] == pytest.approx({"a1": 0.3, "a2": 0.9, "a3": 0.3})
    assert per_user["B"]["mean_rank"] == pytest.approx({"a1": 2.5, "a2": 1.0, "a3": 2.5})
    # user C: nothing valid -> None, never 0
    assert per_user["C"]["mean"] == {"a1": None, "a2": None, "a3": None}
    assert per_user["C"]["mean_rank"] == {"a1": None, "a2": None, "a3": None}
    # overall Mean = mean over users with a value; MR over the valid (user, gym) columns A/g1, A/g2, B/g3
    assert overall["mean"] == pytest.approx({"a1": (0.75 + 0.3) / 2, "a2": (0.5 + 0.9) / 2, "a3": (0.25 + 0.3) / 2})
    assert overall["mean_rank"] == pytest.approx({"a1": 5.5 / 3, "a2": 5.5 / 3, "a3": 7 / 3})
    assert overall["columns_used"] == 3


def _rec(task, total, turns=None, invalid=None, choices=None):
    turns = turns if turns is not None else [total]
    return {"task_id": task, "total_reward": total, "turn_rewards": turns, "n_turns": len(turns),
            "invalid": invalid, "choices": choices or ["action"] * len(turns)}


def test_cell_invalid_rollouts_are_excluded_not_zero():
    recs = [_rec("t1", 1.0), _rec("t1", 0.0, [0.0], invalid="refusal"), _rec("t2", 0.0, [], invalid="user_error"),
            _rec("t2", 0.5, [0.5, 0.0], invalid="context_overflow"), _rec("t3", 0.0, [], invalid="context_overflow")]
    c = cell_from_records("function", recs)
    assert c["score"] == pytest.approx(0.75)          # (1.0 + 0.5) / 2: invalid ones are not zeros
    assert (c["status"], c["rollouts"], c["valid"], c["invalid"]) == ("ok", 5, 2, 3)
    assert c["invalid_reasons"] == {"context_overflow": 1, "refusal": 1, "user_error": 1}
    assert c["agent_failures"] == {"context_overflow": 1}   # overflow after a turn: the agent's failure
    assert c["pass_at_k"] == pytest.approx(0.5)              # t1 passed, t2 did not, t3 had no valid attempt
    assert "micro_avg" not in c
    bad = cell_from_records("persuade", [_rec("t1", 0.0, [0.0], invalid="refusal")])
    assert (bad["score"], bad["status"], bad["pass_at_k"], bad["invalid_reasons"]) == (None, "invalid", None,
                                                                                        {"refusal": 1})
    travel = cell_from_records("travel", [
        _rec("t1", 1.4, [0.2, 0.2, 1.0], choices=["action", "search", "answer"]),
        _rec("t2", 1.0, [0.2, 0.8], choices=["search", "answer"]),
        _rec("t3", 0.0, [0.0], invalid="timeout")])
    assert travel["score"] == pytest.approx(1.2)
    assert travel["micro_avg"] == pytest.approx(((1.4 / 3) + 0.5) / 2)
    assert travel["micro_max"] == pytest.approx(0.9)
    assert travel["pass_at_k"] == pytest.approx(0.5)          # success = the best option (answer reward 1.0)


# ----------------------------------------------------------------------------------- fixtures
def _rows(path):
    rows = []
    for g in GYMS:
        for r in MODULES[g].build_rows(load_tasks(g), "val")[:2]:
            rows.append({"data_source": r["data_source"], "gym": g, "task_id": r["reward_model"]["id"],
                         "split": "val", "prompt": r["prompt"], "ability": r["ability"],
                         "reward_model": json.dumps(r["reward_model"]), "extra_info": json.dumps(r["extra_info"])})
    pl.DataFrame(rows).write_parquet(path)
    return rows


def _model_params(seed):
    return ModelParams(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                       num_key_value_heads=1, head_dim=32, max_position_embeddings=8192, tie_word_embeddings=False,
                       seed=seed)


def _random_agent(tok, out, seed):
    from mimesis_lab.models import build_tiny_model, save_hf

    save_hf(build_tiny_model(_model_params(seed), len(tok), tok.pad_token_id, tok.eos_token_id), tok, out)


def _chain_agent(tok, out):
    """Greedy decoding after ``<|im_start|>assistant\\n`` spells REPLY then ``<|im_end|>``."""
    from mimesis_lab.models import build_tiny_model, save_hf

    gen_prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                         tokenize=False)
    seq = [tok.encode(gen_prompt, add_special_tokens=False)[-1]] + tok.encode(REPLY, add_special_tokens=False) \
        + [tok.eos_token_id]
    assert len(set(seq[:-1])) == len(seq) - 1 and len(seq) < 64, seq   # a chain: one successor per token
    model = build_tiny_model(_model_params(0), len(tok), tok.pad_token_id, tok.eos_token_id)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight.zero_()
        model.lm_head.weight.zero_()
        for d, (cur, nxt) in enumerate(zip(seq, seq[1:])):
            model.model.embed_tokens.weight[cur, d] = 1.0
            model.lm_head.weight[nxt, d] = 1.0
    save_hf(model, tok, out)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from mimesis_lab.tokenizer import train_tokenizer

    tmp = tmp_path_factory.mktemp("agent_eval")
    rows = _rows(tmp / "gyms.parquet")
    tok = train_tokenizer([m["content"] for r in rows for m in r["prompt"]] + [REPLY] * 30, vocab_size=700,
                          min_frequency=1)
    _chain_agent(tok, tmp / "asker")
    _random_agent(tok, tmp / "mute", seed=5)
    return {"tmp": tmp, "data": str(tmp / "gyms.parquet"), "tok": tok}


def _cfg(world, agents, users, gyms=("travel", "function"), training_user=None):
    return AgentEvalParams(agents=agents, users=users, training_user=training_user or str(world["tmp"] / "nobody"),
                           data=[world["data"]], gyms=list(gyms), tasks_per_gym=1, pass_k=1,
                           rollout=AgentRolloutParams(temperature=0.0, max_turns=2, max_new_tokens=16, batch_size=8,
                                                      max_total_tokens=8192))


def _strip(path):
    return [{k: v for k, v in json.loads(line).items() if k != "wall_s"} for line in path.read_text().splitlines()]


def _no_counts(summary):
    return {k: v for k, v in summary.items() if k != "counts"}


# ----------------------------------------------------------------------------------- resume
def test_resume_runs_only_missing_rollouts(world, tmp_path):
    from mimesis_lab.tokenizer import load_tokenizer

    mute = tmp_path / "mute"
    shutil.copytree(world["tmp"] / "mute", mute)
    cfg = _cfg(world, {"asker": str(world["tmp"] / "asker"), "mute": str(mute)},
               {"scripted": EvalUserParams(kind="scripted")})
    out, cache = tmp_path / "out", tmp_path / "cache"
    s1 = run_agent_eval(cfg, out, cache)
    assert s1["counts"] == {"rollouts": 4, "from_cache": 0, "run": 4, "executed": 4, "invalid": 0,
                            "invalid_cells": 0, "agent_failures": 0}
    first = _strip(out / "rollouts.jsonl")
    asker_travel = next(r for r in first if (r["agent"], r["gym"]) == ("asker", "travel"))
    assert asker_travel["choices"] == ["action", "action"]        # two turns, one preference elicited per turn
    assert asker_travel["turn_rewards"] == pytest.approx([0.2, 0.2])
    assert s1["cells"]["asker"]["scripted"]["travel"]["score"] == pytest.approx(0.4)
    assert set(s1["cells"]["asker"]["scripted"]["travel"]) >= {"micro_avg", "micro_max"}
    assert json.loads((out / "summary.json").read_text()) == s1

    keys = sorted(p for p in cache.glob("*.json") if not p.name.startswith("_"))
    assert len(keys) == 4
    keys[0].unlink()
    s2 = run_agent_eval(cfg, out, cache)
    assert (s2["counts"]["from_cache"], s2["counts"]["run"], s2["counts"]["executed"]) == (3, 1, 1)
    assert _no_counts(s2) == _no_counts(s1) and _strip(out / "rollouts.jsonl") == first

    s3 = run_agent_eval(cfg, out, cache)
    assert (s3["counts"]["from_cache"], s3["counts"]["run"]) == (4, 0)

    # new weights for one agent invalidate only that agent's rollouts
    shutil.rmtree(mute)
    _random_agent(load_tokenizer(world["tmp"] / "mute"), mute, seed=6)
    s4 = run_agent_eval(cfg, out, cache)
    assert (s4["counts"]["from_cache"], s4["counts"]["run"]) == (2, 2)
    assert s4["agents"]["mute"]["fingerprint"] != s1["agents"]["mute"]["fingerprint"]
    assert s4["agents"]["asker"] == s1["agents"]["asker"]


# ----------------------------------------------------------------------------------- workers
def test_shard_pairs_spreads_rollouts_and_keeps_agents_together():
    from mimesis_lab.evals.agent_eval import shard_pairs

    pairs = [("a", "scripted", 240), ("b", "scripted", 240), ("c", "scripted", 240)] + \
        [(a, u, 32) for a in "abc" for u in ("sim", "prompted")]
    shards = shard_pairs(pairs, 2)
    loads = [sum(n for a, u, n in pairs if (a, u) in s) for s in shards]
    assert sorted(loads) == [432, 480] and sum(len(s) for s in shards) == 9
    assert all(s == sorted(s) for s in shards)          # agent by agent: each agent loaded once per shard
    assert shard_pairs(pairs[:1], 4) == [[("a", "scripted")]]     # never more shards than pairs
    assert shard_pairs(pairs, 1) == [sorted((a, u) for a, u, _ in pairs)]


def test_workers_play_the_same_rollouts_as_one_process(world, tmp_path):
    """``workers: 2`` plays the pairs in two spawned processes: the same records, summary and cache."""
    cfg = _cfg(world, {"asker": str(world["tmp"] / "asker"), "mute": str(world["tmp"] / "mute")},
               {"scripted": EvalUserParams(kind="scripted")})
    one = run_agent_eval(cfg, tmp_path / "one", tmp_path / "cache1")
    two = run_agent_eval(cfg.model_copy(update={"workers": 2}), tmp_path / "two", tmp_path / "cache2")
    assert two["counts"] == one["counts"] and two["counts"]["executed"] == 4
    assert _no_counts(two) == _no_counts(one)
    assert _strip(tmp_path / "two" / "rollouts.jsonl") == _strip(tmp_path / "one" / "rollouts.jsonl")
    again = run_agent_eval(cfg.model_copy(update={"workers": 2}), tmp_path / "two", tmp_path / "cache2")
    assert (again["counts"]["from_cache"], again["counts"]["executed"]) == (4, 0)


# ----------------------------------------------------------------------------------- failing users
class _FixedUser(BackgroundHTTPServer):
    """A loopback OpenAI-style endpoint that always answers ``reply`` (or fails with ``status``)."""

    def __init__(self, reply: str = "", status: int = 200):
        super().__init__("127.0.0.1", 0)
        self.reply, self.status, self.calls = reply, status, 0

    def handle(self, handler, method, path):
        if method == "POST" and path.endswith("/chat/completions"):
            handler.read_json()
            self.calls += 1
            if self.status != 200:
                raise HTTPError(self.status, "the user model is down", "server_error")
            return 200, {"id": "c", "object": "chat.completion", "created": 0, "model": "u",
                         "choices": [{"index": 0, "finish_reason": "stop",
                                      "message": {"role": "assistant", "content": self.reply}}]}
        raise HTTPError(404, "no route", "not_found")


def _endpoint_user(srv):
    return EvalUserParams(kind="openai", openai=OpenAIEndpoint(base_url=f"{srv.root}/v1", model="u", max_retries=0),
                          timeout_s=10.0)


def test_failing_users_make_cells_invalid_not_zero(world, tmp_path):
    with _FixedUser("As an AI language model, I cannot pretend to be a human user.") as refuser, \
            _FixedUser(status=500) as broken, \
            _FixedUser("<think>they ask about money</think>Sure, that sounds reasonable to me.") as chatty:
        users = {"scripted": EvalUserParams(kind="scripted"), "refuser": _endpoint_user(refuser),
                 "broken": _endpoint_user(broken), "chatty": _endpoint_user(chatty)}
        cfg = _cfg(world, {"asker": str(world["tmp"] / "asker"), "mute": str(world["tmp"] / "mute")}, users,
                   gyms=("travel", "function", "persuade"))
        s = run_agent_eval(cfg, tmp_path / "out", tmp_path / "cache")
    cells = s["cells"]
    assert refuser.calls >= 1 and broken.calls >= 1 and chatty.calls >= 1
    for user, reason in (("refuser", "refusal"), ("broken", "user_error")):
        for gym in ("travel", "persuade"):
            c = cells["asker"][user][gym]
            assert (c["score"], c["status"], c["valid"], c["invalid"]) == (None, "invalid", 0, 1)
            assert c["invalid_reasons"] == {reason: 1} and c["pass_at_k"] is None
        # the asker's travel/persuade cells are invalid -> those gyms are left out for both agents
        assert s["per_user"][user]["excluded_gyms"] == {"travel": ["asker"], "persuade": ["asker"]}
        assert s["per_user"][user]["gyms_used"] == ["function"]
        assert s["per_user"][user]["mean"] == {a: cells[a][user]["function"]["score"] for a in ("asker", "mute")}
    # a chatty user is fine in TravelGym but gives PersuadeGym no stance: invalid user_error, not a 0 reward
    assert cells["asker"]["chatty"]["travel"]["status"] == "ok"
    assert cells["asker"]["chatty"]["persuade"]["invalid_reasons"] == {"user_error": 1}
    assert cells["asker"]["scripted"]["persuade"]["status"] == "ok"
    assert s["per_user"]["scripted"]["excluded_gyms"] == {}
    recs = _strip(tmp_path / "out" / "rollouts.jsonl")
    chat_travel = next(r for r in recs if (r["agent"], r["user"], r["gym"]) == ("asker", "chatty", "travel"))
    assert "they ask about money" not in json.dumps(chat_travel["messages"])   # the shim hid the reasoning
    assert chat_travel["privileged_turns"] >= 1
    assert s["counts"]["invalid"] == 5 and s["counts"]["invalid_cells"] == 5
    assert s["overall"]["mean"]["asker"] is not None


def test_transient_failures_are_retried_on_rerun_final_ones_are_served(world, tmp_path):
    """An endpoint that answers 500 (transient) fails its cells; once it recovers, a rerun retries exactly
    those rollouts. A refusal is final: the rerun serves it from the cache without calling the user."""
    with _FixedUser(status=500) as flaky, \
            _FixedUser("As an AI language model, I cannot pretend to be a human user.") as refuser:
        users = {"flaky": _endpoint_user(flaky), "refuser": _endpoint_user(refuser)}
        cfg = _cfg(world, {"asker": str(world["tmp"] / "asker")}, users, gyms=("travel",))
        out, cache = tmp_path / "out", tmp_path / "cache"
        s1 = run_agent_eval(cfg, out, cache)
        assert s1["cells"]["asker"]["flaky"]["travel"]["invalid_reasons"] == {"user_error": 1}
        assert s1["cells"]["asker"]["refuser"]["travel"]["invalid_reasons"] == {"refusal": 1}
        recs = {r["user"]: r for r in _strip(out / "rollouts.jsonl")}
        assert recs["flaky"]["invalid_transient"] is True and recs["refuser"]["invalid_transient"] is False

        flaky.status, flaky.reply = 200, "Somewhere cheap, under 100 a night please."   # the endpoint recovers
        refusals = refuser.calls
        s2 = run_agent_eval(cfg, out, cache)
        assert (s2["counts"]["from_cache"], s2["counts"]["run"]) == (1, 1)
        assert s2["cells"]["asker"]["flaky"]["travel"]["status"] == "ok"
        assert s2["cells"]["asker"]["refuser"]["travel"]["invalid_reasons"] == {"refusal": 1}
        assert refuser.calls == refusals


# ----------------------------------------------------------------------------------- training user
def test_training_user_is_refused(world, tmp_path):
    sim = str(world["tmp"] / "mute")
    user = {"sim": EvalUserParams(kind="simulator", model_path=sim)}
    with pytest.raises(ValueError, match="training user"):
        _cfg(world, {"asker": str(world["tmp"] / "asker")}, user, training_user=sim)
    ok = _cfg(world, {"asker": str(world["tmp"] / "asker")}, user)
    with pytest.raises(TrainingUserError, match="training user"):   # the code guards too (validator bypassed)
        run_agent_eval(ok.model_copy(update={"training_user": sim + "/"}), tmp_path / "o", tmp_path / "c")
    copy = tmp_path / "copy_of_training_user"
    shutil.copytree(sim, copy)                                      # same weights elsewhere: still refused
    with pytest.raises(TrainingUserError):
        run_agent_eval(ok.model_copy(update={"training_user": str(copy)}), tmp_path / "o", tmp_path / "c")
    assert not list((tmp_path / "c").glob("*.json"))                # nothing ran


# ----------------------------------------------------------------------------------- scripted user
def _gym(name, index=0):
    tasks = {name: load_tasks(name)}
    row = MODULES[name].build_rows(tasks[name], "val")[index]
    gym = gym_for_row(row, tasks, None, random.Random(0))
    gym.user = ScriptedEvalUser(gym)
    return gym


def test_scripted_user_answers_from_the_hidden_task():
    travel = _gym("travel")
    hidden = [p for p in travel.task["preferences"] if not p.get("stated")]
    kw = hidden[0]["keywords"][0]
    res = travel.step("action", f"Anything about {kw}?")
    assert res.reward == pytest.approx(0.2) and hidden[0]["text"].rstrip(".") in res.observation
    assert travel.step("action", "Do you like purple elephants?").observation == "I don't mind about that."

    persuade = _gym("persuade")
    t = persuade.task
    res = persuade.step("action", f"Consider this about {t['reasons'][0]}")
    assert res.reward == pytest.approx(1 / 6)          # one step toward the target, stance line stripped
    assert "Stance" not in res.observation and persuade.user.replies[-1].endswith(
        f"Stance: {t['initial_stance'] + (1 if t['target'] == 'agree' else -1)}")

    tele = _gym("telepathy")
    reply = tele.step("action", f"Is it a {tele.task['category']}?").observation
    assert reply == "Yes." and tele.task["entity"].lower() not in reply.lower()


def test_pass_k_with_greedy_attempts_is_flagged(world, tmp_path):
    cfg = _cfg(world, {"asker": str(world["tmp"] / "asker")}, {"scripted": EvalUserParams(kind="scripted")},
               gyms=("travel",)).model_copy(update={"pass_k": 2})
    with pytest.warns(UserWarning, match="identical"):
        s = run_agent_eval(cfg, tmp_path / "out", tmp_path / "cache")
    assert any("identical" in n for n in s["notes"])
    cell = s["cells"]["asker"]["scripted"]["travel"]
    assert (cell["rollouts"], cell["valid"], cell["pass_at_k"]) == (2, 2, 0.0)   # 1 task, never answered
    recs = _strip(tmp_path / "out" / "rollouts.jsonl")
    assert [r["attempt"] for r in recs] == [0, 1] and recs[0]["messages"] == recs[1]["messages"]
    first_task = sorted({r["task_id"] for r in _rows_of(world, "travel")}, key=lambda t: int(t.rsplit("-", 1)[1]))[0]
    assert recs[0]["task_id"] == first_task                                    # first by (natural) task id


def _rows_of(world, gym):
    return [r for r in pl.read_parquet(world["data"]).to_dicts() if r["gym"] == gym]


def test_each_user_plays_its_own_number_of_tasks(world, tmp_path):
    """``users.<u>.tasks_per_gym`` overrides the section's: the cheap scripted user plays every task, another user
    a prefix of the same ordered list (so the users share their first tasks); the summary says who played how
    many, and only the tasks past the longest list count as skipped."""
    n_travel = len({r["task_id"] for r in _rows_of(world, "travel")})
    assert n_travel >= 2
    users = {"scripted": EvalUserParams(kind="scripted"), "few": EvalUserParams(kind="scripted", tasks_per_gym=1)}
    cfg = _cfg(world, {"asker": str(world["tmp"] / "asker")}, users, gyms=("travel",)).model_copy(
        update={"tasks_per_gym": None})
    assert (cfg.user_tasks_per_gym("scripted"), cfg.user_tasks_per_gym("few"), cfg.max_tasks_per_gym()) == \
        (None, 1, None)
    s = run_agent_eval(cfg, tmp_path / "out", tmp_path / "cache")
    assert s["settings"]["tasks_by_user"] == {"scripted": {"travel": n_travel}, "few": {"travel": 1}}
    assert "over_tasks_per_gym" not in s["skipped_rows"]
    recs = _strip(tmp_path / "out" / "rollouts.jsonl")
    by_user = {u: [r["task_id"] for r in recs if r["user"] == u] for u in users}
    assert len(by_user["scripted"]) == n_travel and by_user["few"] == by_user["scripted"][:1]
    assert s["cells"]["asker"]["few"]["travel"]["rollouts"] == 1
    # the section's count caps every user without its own; the longest list decides what is skipped
    capped = cfg.model_copy(update={"tasks_per_gym": 1})
    assert (capped.user_tasks_per_gym("scripted"), capped.max_tasks_per_gym()) == (1, 1)
    s2 = run_agent_eval(capped, tmp_path / "out2", tmp_path / "cache")
    assert s2["settings"]["tasks_by_user"] == {"scripted": {"travel": 1}, "few": {"travel": 1}}
    assert s2["skipped_rows"]["over_tasks_per_gym"] == n_travel - 1 and s2["counts"]["run"] == 0   # all cached
