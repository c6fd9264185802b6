"""Simulator benchmarks (SPEC §4.1): fidelity judge, discriminator, ECE pieces and ``run_sim_eval`` end to end.

The end-to-end runs use real tiny Qwen3 models built from config (a saved "checkpoint" and the random
``base``) on data written in tmp_path in the real split schemas; judges are replaced by failing test
doubles only where the failure paths are tested.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

import httpx
import polars as pl
import pytest

from mimesis_lab.config import JudgeParams, ModelParams, OpenAIEndpoint
from mimesis_lab.config_eval import EvalSimulatorParams, SimEvalParams
from mimesis_lab.envs.base import TaskContext
from mimesis_lab.envs.output_format import parse_reply
from mimesis_lab.evals import fidelity_judge as fj
from mimesis_lab.evals.discriminator import OpenAIDiscriminator, RuleDiscriminator
from mimesis_lab.evals.fidelity_judge import (
    DIMENSIONS, THRESHOLDS, FidelityFailure, FidelityRequest, OpenAIFidelityJudge, RuleFidelityJudge,
)
from mimesis_lab.evals.sim_eval import (
    PROMPTED_INSTRUCTION, FidelityEpisode, SimEvalError, _with_prefix, difficulty_bins, human_replay_success,
    run_sim_eval, task_difficulty,
)
from mimesis_lab.judges.behavior_judge import JudgeFailure, RuleJudge

from .conftest import ROOT

ABCD = ROOT / "data" / "raw" / "abcd"
SP = ("You are a real human user talking to an AI assistant. Write the user's next message. Before each message, "
      "think about why you are sending it inside <think></think>, then write only what the user would type.\n"
      "Task: {task}\nExpectations: {exp}\nUser profile: age: 35-44; gender: Female; education: Doctorate; "
      "occupation: Researcher; frequency: Daily; purposes: Coding, Writing")
CONVS = [
    ("u1", "Interpret the output of a linear model in R", "A correct interpretation",
     ["can you check my interpretation? lm(rt ~ condition) gives 41.87 ms", "how do i report this in APA"],
     ["Your interpretation is correct.", "Report it as b = 41.87, t = 4.48."]),
    ("u2", "Shorten a paper abstract to the word limit", "Under 150 words",
     ["Shorten to under 150 words: sleep loss impairs metacognition.", "you missed the limit, count again"],
     ["Sleep loss impairs metacognition.", "Sorry, it is now 140 words."]),
    ("u3", "Format a results table in LaTeX", "A booktabs table",
     ["latex booktabs table: acc 81.2 / 83.5, bold best", "ECE lower is better. obviously"],
     ["Here is the table.", "You're right, fixed."]),
]


# ----------------------------------------------------------------------------- fixtures
def _tt_row(i: int) -> dict:
    user, task, exp, humans, ais = CONVS[i]
    turns, messages = [], [{"role": "system", "content": SP.format(task=task, exp=exp)}]
    for h, a in zip(humans, ais):
        turns += [{"role": "user", "content": h, "reasons": ["because"], "reactions": []},
                  {"role": "assistant", "content": a, "reasons": [], "reactions": []}]
        messages += [{"role": "assistant", "content": f"<think>because</think>{h}"}, {"role": "user", "content": a}]
    return {"conversation_id": f"{user}_task{i}_conversation1", "user_id": user, "task_id": f"task{i}",
            "model_name": "gpt-4o", "system_prompt": SP.format(task=task, exp=exp), "messages": messages,
            "turns": turns, "n_messages": len(messages), "split": "test"}


def _behavior_row(convo: dict, b: str) -> dict:
    sc = convo["scenario"]
    kw = {"pressure": "is about to board a flight"} if b == "B9" else {}
    return {"task_id": f"{convo['convo_id']}-{b}", "conversation_id": str(convo["convo_id"]),
            "user_id": sc["personal"]["username"], "scenario_key": "k", "scenario": json.dumps(sc),
            "behavior_ids": json.dumps([] if b == "N" else [b]), "kwargs": json.dumps(kw), "flow": sc["flow"],
            "subflow": sc["subflow"], "turn_budget": 8, "data_source": "usersim_behavior", "needs_trace": False,
            "abcd_split": "train", "split": "test"}


@pytest.fixture(scope="module")
def abcd():
    doc = json.loads((ABCD / "abcd_v1.1.json").read_text())
    return {str(c["convo_id"]): c for part in doc.values() for c in part}


@pytest.fixture(scope="module")
def ctx():
    return TaskContext(kb=json.loads((ABCD / "kb.json").read_text()),
                       guidelines=json.loads((ABCD / "guidelines.json").read_text()),
                       options={"usersim_behavior": {"turn_budget": 8}})


@pytest.fixture(scope="module")
def world(tmp_path_factory, abcd):
    """Data parquets in the split schemas and a saved tiny checkpoint (with its tokenizer)."""
    from mimesis_lab.models import build_tiny_model, save_hf
    from mimesis_lab.tokenizer import train_tokenizer

    d = tmp_path_factory.mktemp("sim_eval")
    pl.DataFrame([_tt_row(i) for i in range(3)]).write_parquet(d / "tt.parquet")
    rows = [_behavior_row(abcd["3615"], "N"), _behavior_row(abcd["2149"], "B9")]
    pl.DataFrame(rows).write_parquet(d / "beh.parquet")
    texts = [json.dumps(_tt_row(i)) for i in range(3)] + [json.dumps(r) for r in rows] + [PROMPTED_INSTRUCTION]
    tok = train_tokenizer(texts * 3, vocab_size=400, min_frequency=1)
    mcfg = ModelParams(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                       num_key_value_heads=1, head_dim=16, max_position_embeddings=2048, seed=7)
    model = build_tiny_model(mcfg.model_copy(update={"seed": 3}), len(tok), tok.pad_token_id, tok.eos_token_id)
    save_hf(model, tok, d / "ckpt")
    return {"dir": d, "model_cfg": mcfg, "ckpt": str(d / "ckpt")}


def _cfg(world, sims: dict, n_conv: int = 2, **kw) -> SimEvalParams:
    d = world["dir"]
    simulators = {n: k if isinstance(k, EvalSimulatorParams) else
                  EvalSimulatorParams(kind=k, model_path=world["ckpt"] if k != "base" else None) for n, k in sims.items()}
    base = dict(simulators=simulators, conversations=str(d / "tt.parquet"), behavior_tasks=str(d / "beh.parquet"),
                max_conversations=n_conv, max_behavior_tasks=2, turn_budget=2, max_new_tokens=8, seeds=[0],
                bootstrap=20, output_dir=str(d / "out"))
    return SimEvalParams(**(base | kw))


def _run(world, cfg, tmp_path, **kw):
    # a `base`-only config has no checkpoint folder to borrow the tokenizer from: give the test's own
    # (never the repo's models/tokenizer, which a clean checkout does not have)
    kw.setdefault("tokenizer_path", world["ckpt"])
    return run_sim_eval(cfg, world["model_cfg"], out_dir=tmp_path / "out", kb=ABCD / "kb.json",
                        guidelines=ABCD / "guidelines.json", abcd_raw=ABCD / "abcd_v1.1.json", **kw)


def _no_nan(text: str):
    def bad(c):
        raise AssertionError(f"non-finite constant {c} in JSON")
    return json.loads(text, parse_constant=bad)


# ----------------------------------------------------------------------------- rule fidelity judge
REAL = ["can you check my interpretation? lmer(rt ~ condition + (1|subject)) gives 41.87",
        "how do i report this in APA"]


def _req(sim, real=REAL):
    return FidelityRequest("c1", SP.format(task="Interpret the output of a linear mixed-effects model in R",
                                           exp="A correct interpretation and an APA-style reporting sentence"),
                           list(real), list(sim), ["It is correct.", "Like this."])


def test_rule_judge_identical_conversations_match_everywhere():
    v = RuleFidelityJudge().judge(_req(REAL))
    assert v.matches == {d: 1 for d in DIMENSIONS}
    assert v.parse_failures == 0 and v.features["info_agreement"] == 1.0


def test_rule_judge_clearly_different_user_mismatches():
    sim = ["Certainly! I'd be happy to help you with that. As a nurse I think the weather is lovely today and "
           "I would like to talk about gardening and flowers for a while, thank you so much!"]
    v = RuleFidelityJudge().judge(_req(sim))
    assert v.matches["persona"] == 0           # assistant-like phrasing + occupation contradiction + off task
    assert v.matches["style"] == 0             # far longer turns, polite, capitalised
    assert v.matches["technical_competency"] == 0
    assert v.matches["information_flow"] == 0  # the task's facts are never stated
    assert v.matches["pacing"] == 0            # one turn instead of two


def test_rule_judge_thresholds_are_documented_and_used():
    for key in THRESHOLDS:
        assert key in fj.__doc__
    loose = RuleFidelityJudge({"pacing_turn_tol": 5, "pacing_length_ratio_min": 0.0})
    assert loose.judge(_req(["ok"])).matches["pacing"] == 1
    assert RuleFidelityJudge().judge(_req(["ok"])).matches["pacing"] == 0
    assert isinstance(RuleFidelityJudge().judge(_req([])), FidelityFailure)   # nothing to compare: a failure


def _client(answers: list[str]) -> httpx.Client:
    it = iter(answers)

    def handler(request):
        return httpx.Response(200, json={"choices": [{"message": {"role": "assistant", "content": next(it)}}]})
    return httpx.Client(transport=httpx.MockTransport(handler))


def test_openai_fidelity_judge_counts_parse_failures_and_retries():
    ep = OpenAIEndpoint(model="judge", max_retries=1)
    good = json.dumps({**{d: True for d in DIMENSIONS}, "pacing": False, "rationale": "close"})
    v = OpenAIFidelityJudge(ep, _client(["not json", good]), backoff_s=0).judge(_req(REAL))
    assert v.matches["persona"] == 1 and v.matches["pacing"] == 0 and v.parse_failures == 1
    f = OpenAIFidelityJudge(ep, _client(["{}", "[1]"]), backoff_s=0).judge(_req(REAL))
    assert isinstance(f, FidelityFailure) and f.parse_failures == 2


# ----------------------------------------------------------------------------- discriminator
def _synthetic(n: int, seed: int):
    r = random.Random(seed)
    human = [[f"fix this {r.randint(1, 99)}", "ok thx"] for _ in range(n)]
    sim = [["Certainly! Here is a thorough and complete overview of everything you asked for, with many details "
            f"and examples number {r.randint(1, 99)}!", "Wonderful! Thank you so much for your kind help!"]
           for _ in range(n)]
    return human, sim


def test_discriminator_separable_sets_are_recognised():
    human, sim = _synthetic(6, 0)
    groups = list(range(6))
    res = RuleDiscriminator().classify(human, sim, groups, groups)
    assert res.accuracy == pytest.approx(100.0) and res.n_scored == 12 and res.n_failed == 0


def test_discriminator_identical_sets_are_at_chance():
    human, _ = _synthetic(6, 1)
    groups = list(range(6))
    res = RuleDiscriminator().classify(human, [list(h) for h in human], groups, groups)
    assert res.accuracy == pytest.approx(50.0)


def test_discriminator_never_scores_a_conversation_it_was_fit_on():
    seen = []

    class Spy(RuleDiscriminator):
        @staticmethod
        def _fit(train):
            seen.append({x[2] for x in train})
            return RuleDiscriminator._fit(train)

    human, sim = _synthetic(4, 2)
    res = Spy().classify(human, sim, ["a", "b", "c", "d"], ["a", "b", "c", "d"])
    assert len(seen) == 4
    for p in res.predictions:
        fold = seen[["a", "b", "c", "d"].index(p["group"])]
        assert p["group"] not in fold
    one = RuleDiscriminator().classify(human[:1], sim[:1], ["a"], ["a"])   # no training data: failures, no score
    assert one.accuracy is None and one.n_failed == 2


def test_openai_discriminator_excludes_failures():
    ep = OpenAIEndpoint(model="judge", max_retries=0)
    res = OpenAIDiscriminator(ep, _client(['{"label": "human"}', "nonsense"]), backoff_s=0).classify([["hi"]], [["yo"]])
    assert res.n_scored == 1 and res.n_failed == 1 and res.parse_failures == 1 and res.accuracy == 100.0


# ----------------------------------------------------------------------------- episodes and ECE pieces
def test_fidelity_episode_replays_the_assistant_and_stops(ctx):
    row = {"conversation_id": "c", "system_prompt": "S", "human_turns": ["a", "b", "c"], "ai_replies": ["x", "y", "z"]}
    ep = FidelityEpisode(row, ctx, random.Random(0), turn_budget=2)
    assert ep.cap == 2 and ep.messages() == [{"role": "system", "content": "S"}]
    assert ep.observe(parse_reply("<think>r</think>hello"), "hello") is False
    assert ep.messages()[-1] == {"role": "user", "content": "x"}            # the simulator speaks in the assistant slot
    assert ep.observe(parse_reply("<think>r</think>more"), "more") is True   # budget reached
    assert [t["role"] for t in ep.real_conversation()] == ["user", "assistant", "user"]
    ep2 = FidelityEpisode(row, ctx, random.Random(0), turn_budget=5)
    assert ep2.observe(parse_reply("ok thanks, goodbye"), "ok thanks, goodbye") is True
    pre = _with_prefix(FidelityEpisode(row, ctx, random.Random(0), 2), PROMPTED_INSTRUCTION)
    assert pre.messages()[0]["content"].startswith("You are role-playing the USER (not the assistant)")


def test_fidelity_episode_starts_with_the_recorded_opening(ctx):
    row = {"conversation_id": "c", "system_prompt": "S", "opening": ["hello, how can I help?"],
           "human_turns": ["a", "b"], "ai_replies": ["x", "y"]}
    ep = FidelityEpisode(row, ctx, random.Random(0), turn_budget=2)
    assert ep.messages() == [{"role": "system", "content": "S"}, {"role": "user", "content": "hello, how can I help?"}]
    assert ep.observe(parse_reply("<think>r</think>hi"), "hi") is False
    assert ep.messages()[-1] == {"role": "user", "content": "x"}            # the reply recorded after turn 1
    ep.observe(parse_reply("<think>r</think>more"), "more")
    assert [t["role"] for t in ep.real_conversation()] == [t["role"] for t in ep.sim_conversation()] == [
        "assistant", "user", "assistant", "user"]
    assert ep.real_conversation()[0] == ep.sim_conversation()[0] == {"role": "assistant",
                                                                      "content": "hello, how can I help?"}


def test_difficulty_and_bins(ctx):
    assert difficulty_bins([2, 3, 5, 5], 3) == [0, 1, 2, 2]
    assert difficulty_bins([4, 4], 3) == [0, 0]
    assert task_difficulty({"subflow": "recover_username"}, ctx.kb) == 2
    assert task_difficulty({"subflow": "unknown_flow"}, ctx.kb) == 0


def test_human_replay_success_uses_the_episode_protocol(abcd, ctx):
    row = _behavior_row(abcd["3615"], "N")
    assert human_replay_success(row, abcd["3615"]["original"], ctx) is True
    short = TaskContext(kb=ctx.kb, guidelines=ctx.guidelines, options={"usersim_behavior": {"turn_budget": 1}})
    assert human_replay_success(row, abcd["3615"]["original"], short) is False   # the last turn is never answered


# ----------------------------------------------------------------------------- end to end
SHAPE = {"fi", "fi_ci", "fi_per_dim", "d1", "d2", "d3", "d4", "ece", "usi5", "turing_accuracy", "turing_distance",
         "behavior", "soul", "counts", "model"}


def test_run_sim_eval_end_to_end(world, tmp_path):
    cfg = _cfg(world, {"trained": "checkpoint", "prompted": "prompted", "base": "base"})
    s = _run(world, cfg, tmp_path)
    assert {"simulators", "judge", "assistant", "discriminator", "note", "seeds"} <= set(s)
    assert "not comparable" in s["note"] and s["seeds"] == [0]
    assert list(s["simulators"]) == ["trained", "prompted", "base"]
    for name, e in s["simulators"].items():
        assert SHAPE <= set(e), name
        assert 0.0 <= e["fi"] <= 100.0
        assert set(e["fi_per_dim"]) == set(DIMENSIONS)
        assert e["fi_ci"] is None or e["fi_ci"][0] <= e["fi"] <= e["fi_ci"][1]
        assert set(e["behavior"]) == {"reward", "reward_se", "exhibit", "placement", "naturalness", "on_task",
                                      "announced", "cooperativeness"}
        assert {"mean", "se", "per_task"} <= set(e["soul"]) and e["soul"]["se"] is None   # one seed: no s.e.
        c = e["counts"]
        assert c["conversations"] == 2 and c["behavior_episodes"] == 2
        fid = c["fidelity_judged"] + sum(c["invalid_by_kind"]["fidelity"].values()) \
            + c["judge_failures_by_kind"].get("fidelity", 0)
        beh = c["behavior_judged"] + sum(c["invalid_by_kind"]["behavior"].values()) \
            + c["judge_failures_by_kind"].get("behavior", 0)
        assert fid == c["conversations"] and beh == c["behavior_episodes"]
        assert sum(c["invalid"].values()) == sum(sum(v.values()) for v in c["invalid_by_kind"].values())
        if e["turing_accuracy"] is not None:
            assert e["turing_distance"] == pytest.approx(abs(e["turing_accuracy"] - 50))
    assert s["simulators"]["trained"]["model"]["path"] == world["ckpt"]
    assert s["simulators"]["base"]["model"]["kind"] == "base"
    out = tmp_path / "out"
    assert _no_nan((out / "summary.json").read_text()) == s
    recs = [_no_nan(line) for line in (out / "trained" / "records.jsonl").read_text().splitlines()]
    kinds = {r["type"] for r in recs}
    assert {"rollout", "fidelity_judgement", "turing"} <= kinds
    assert sum(r["type"] == "rollout" and r["kind"] == "fidelity" for r in recs) == 2


class _Flaky:
    """Test double: fails the first ``n_fail`` judgements, then defers to ``inner``."""

    identity = "stub"

    def __init__(self, inner, failure, n_fail):
        self.inner, self.failure, self.n_fail, self.calls = inner, failure, n_fail, 0

    def judge(self, req):
        self.calls += 1
        return self.failure if self.calls <= self.n_fail else self.inner.judge(req)


def test_all_failed_fidelity_judgements_raise(world, tmp_path):
    cfg = _cfg(world, {"trained": "checkpoint"})
    stub = _Flaky(None, FidelityFailure("judge_failure", "stub"), 10 ** 6)
    with pytest.raises(SimEvalError, match=r"'trained'.*every fidelity judgement failed"):
        _run(world, cfg, tmp_path, fidelity_judge=stub)
    assert (tmp_path / "out" / "trained" / "records.jsonl").is_file()      # the evidence is still written


def test_all_failed_behaviour_judgements_raise(world, tmp_path):
    cfg = _cfg(world, {"base": "base"})
    stub = _Flaky(None, JudgeFailure("judge_failure", "stub"), 10 ** 6)
    with pytest.raises(SimEvalError, match=r"'base'.*every behaviour judgement failed"):
        _run(world, cfg, tmp_path, behavior_judge=stub)


def test_partial_failures_are_counted_and_excluded(world, tmp_path):
    cfg = _cfg(world, {"trained": "checkpoint"}, n_conv=3)
    fstub = _Flaky(RuleFidelityJudge(), FidelityFailure("judge_failure", "stub"), 1)
    bstub = _Flaky(RuleJudge(), JudgeFailure("judge_failure", "stub"), 1)
    e = _run(world, cfg, tmp_path, fidelity_judge=fstub, behavior_judge=bstub)["simulators"]["trained"]
    c = e["counts"]
    assert c["judge_failures_by_kind"] == {"fidelity": 1, "behavior": 1} and c["judge_failures"] == 2
    assert c["fidelity_judged"] == fstub.calls - 1 and c["behavior_judged"] == bstub.calls - 1
    recs = [json.loads(x) for x in (tmp_path / "out" / "trained" / "records.jsonl").read_text().splitlines()]
    judged = [r for r in recs if r["type"] == "fidelity_judgement" and "matches" in r]
    assert len(judged) == c["fidelity_judged"]
    fi = sum(sum(r["matches"].values()) for r in judged) / (5 * len(judged)) * 100
    assert e["fi"] == pytest.approx(fi)                                    # failures excluded, not scored 0
    assert any(r.get("failure") == "judge_failure" for r in recs if r["type"] == "fidelity_judgement")


def test_openai_judge_config_builds_the_llm_judges():
    cfg = JudgeParams(kind="openai", openai=OpenAIEndpoint(model="j", base_url="http://127.0.0.1:9/v1"))
    judge = fj.make_fidelity_judge(cfg)
    assert isinstance(judge, OpenAIFidelityJudge) and "j@http://127.0.0.1:9/v1" in judge.identity
    judge.close()


def test_missing_data_is_a_clear_error(world, tmp_path):
    cfg = _cfg(world, {"base": "base"}, conversations=str(Path(tmp_path) / "nope.parquet"))
    with pytest.raises(SimEvalError, match="nope.parquet"):
        _run(world, cfg, tmp_path)


class _FakeChat:
    """A chat-only backend (what ``OpenAIBackend.generate`` returns), failing every prompt about abstracts."""

    def __init__(self, **_):
        self.calls = 0

    def generate(self, prompts, params):
        from mimesis_lab.rollout.backends import Generation

        self.calls += 1
        return [Generation.failed("HTTP 500") if "abstract" in p[0]["content"] else
                Generation([], [], [], "<think>hm</think>can you check my table? thanks", "stop") for p in prompts]


def test_openai_simulator_failures_are_invalid_not_zero(world, tmp_path, monkeypatch):
    import mimesis_lab.rollout.backends as backends

    fake = _FakeChat()
    monkeypatch.setattr(backends, "make_backend", lambda kind, **kw: fake)
    ep = OpenAIEndpoint(model="sim", base_url="http://127.0.0.1:9/v1", max_retries=0)
    cfg = _cfg(world, {"remote": EvalSimulatorParams(kind="openai", openai=ep)}, n_conv=3)
    e = _run(world, cfg, tmp_path)["simulators"]["remote"]
    c = e["counts"]
    assert fake.calls >= 1 and e["model"] == {"kind": "openai", "model": "sim", "base_url": "http://127.0.0.1:9/v1"}
    assert c["invalid_by_kind"]["fidelity"] == {"generation_error": 1} and c["fidelity_judged"] == 2
    assert 0.0 <= e["fi"] <= 100.0


def test_every_rollout_failing_raises(world, tmp_path, monkeypatch):
    import mimesis_lab.rollout.backends as backends
    from mimesis_lab.rollout.backends import Generation

    class Down:
        def generate(self, prompts, params):
            return [Generation.failed("connection refused") for _ in prompts]

    monkeypatch.setattr(backends, "make_backend", lambda kind, **kw: Down())
    ep = OpenAIEndpoint(model="sim", base_url="http://127.0.0.1:9/v1", max_retries=0)
    cfg = _cfg(world, {"down": EvalSimulatorParams(kind="openai", openai=ep)})
    with pytest.raises(SimEvalError, match=r"'down'.*generation_error"):
        _run(world, cfg, tmp_path)
