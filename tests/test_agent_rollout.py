"""Agent rollouts: tool-call parsing, appended (never re-tokenised) token streams with the response
mask on agent tokens only, drift check, per-turn rewards, failures as invalid (SPEC §3.1–3.2)."""
from __future__ import annotations

import random

import pytest

from mimesis_lab.config import ModelParams
from mimesis_lab.envs.gyms.base import Gym, ScriptedUser, StepResult, UserSideError
from mimesis_lab.models import build_tiny_model
from mimesis_lab.rollout.agent_rollout import check_drift, parse_tool_call, run_agent_episodes
from mimesis_lab.rollout.backends import Generation, SamplingParams, TransformersBackend

CFG = ModelParams(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=16, max_position_embeddings=1024)


class Guess(Gym):
    """Test gym: the answer is 'blue'; `action` asks the user; `search` raises; 'slow' sleeps."""

    name, env_name = "guess_test", "GuessTestGym"

    def step(self, choice, content):
        self.steps += 1
        if choice == "answer":
            ok = content.strip().lower() == "blue"
            return StepResult("Correct!" if ok else "Wrong.", 1.0 if ok else 0.0, ok or self.steps >= 3)
        if choice == "action":
            return StepResult(f"User: {self.ask_user(content)}", 0.1, False)
        if content == "slow":
            import time
            time.sleep(0.5)
        raise RuntimeError("search index offline")

    def user_system_prompt(self):
        return "You are thinking of the colour blue."


ROW = {"data_source": "interact_guess_test", "prompt": [{"role": "system", "content": "Guess the colour."},
                                                       {"role": "user", "content": "Which colour?"}],
       "reward_model": {"id": "g1", "ground_truth": "blue"}}


class Scripted:
    """Backend double: returns the given texts (encoded with the real tokenizer) in order."""

    def __init__(self, tok, texts):
        self.tok, self.texts = tok, list(texts)

    def generate_ids(self, prompts, params):
        out = []
        for p in prompts:
            ids = self.tok.encode(self.texts.pop(0), add_special_tokens=False) + [self.tok.eos_token_id]
            out.append(Generation(list(p), ids, [-0.5] * len(ids), self.tok.decode(ids), "stop"))
        return out


@pytest.fixture(scope="module")
def tok():
    from mimesis_lab.tokenizer import train_tokenizer

    return train_tokenizer(["Guess the colour. Which colour? [answer] blue red green. User: it is not red. "
                            "<tool_call>{\"name\": \"interact_with_env\"}</tool_call> Reward: 0.1"] * 30,
                           vocab_size=400, min_frequency=1)


def test_parse_tool_call_forms():
    assert parse_tool_call('<tool_call>{"name": "interact_with_env", "arguments": {"choice": "answer", '
                           '"content": " blue "}}</tool_call>') == ("answer", "blue")
    assert parse_tool_call("<think>hmm</think>[search] hotels in Rome") == ("search", "hotels in Rome")
    assert parse_tool_call("[ACTION] is it warm?<|im_end|>") == ("action", "is it warm?")
    assert "JSON" in parse_tool_call("<tool_call>{nope}</tool_call>")
    assert "only tool" in parse_tool_call('<tool_call>{"name": "other", "arguments": {}}</tool_call>')
    assert "no tool call" in parse_tool_call("I think it is blue")


def test_stream_mask_rewards_and_no_retokenisation(tok):
    user = ScriptedUser(lambda m: "not red")
    gym = Guess({"id": "g1"}, user=user)
    texts = ["[action] is it red?", "I guess blue", "[answer] blue"]
    (tr,) = run_agent_episodes([ROW], [gym], [("g", "t0")], Scripted(tok, texts), tok,
                               SamplingParams(max_new_tokens=16), check_every_turn=True)
    assert tr.invalid is None and tr.done
    assert tr.turn_rewards == [0.1, 0.0, 1.0] and tr.total_reward == pytest.approx(1.1)
    assert tr.turns[1].parse_error and "Invalid tool call" in tr.turns[1].feedback
    ids, pos = tr.ids, tr.response_positions()
    # the mask covers exactly the sampled ids, in order; env ids are never in it
    assert [ids[p] for p in pos] == [t for turn in tr.turns for t in turn.token_ids]
    assert len(pos) == sum(tr.turn_lengths)
    env = set(range(len(ids))) - set(pos) - set(range(len(tr.prompt_ids)))
    assert all(ids[p] not in (None,) for p in env) and len(env) == sum(len(t.env_ids) for t in tr.turns)
    # the agent sees the tool feedback with the reward (reference behaviour, switchable)
    assert "Reward: 0.1" in tok.decode(tr.turns[0].env_ids) and "User: not red" in tok.decode(tr.turns[0].env_ids)
    assert check_drift(tok, tr) is None
    # the user side got the agent's message in the user slot and its hidden task as system prompt
    assert user.calls[0][0]["content"].startswith("You are thinking") and user.calls[0][1]["role"] == "user"


def test_show_reward_off(tok):
    (tr,) = run_agent_episodes([ROW], [Guess({}, user=ScriptedUser(lambda m: "no"))], [("g", "t")],
                               Scripted(tok, ["[action] red?", "[answer] blue"]), tok,
                               SamplingParams(max_new_tokens=8), show_reward=False)
    assert "Reward" not in tok.decode(tr.turns[0].env_ids)


def test_failures_are_invalid_not_zero(tok):
    def refuse(m):
        return ""

    gyms = [Guess({}, user=ScriptedUser(refuse)), Guess({}), Guess({})]
    out = run_agent_episodes([ROW] * 3, gyms, [("g", f"t{i}") for i in range(3)],
                             Scripted(tok, ["[action] red?", "[search] x", "[search] slow"]), tok,
                             SamplingParams(max_new_tokens=8), step_timeout_s=0.2)
    assert [t.invalid for t in out] == ["user_error", "env_error", "timeout"]
    assert "search index offline" in out[1].invalid_detail


def test_drift_is_detected(tok):
    (tr,) = run_agent_episodes([ROW], [Guess({}, user=ScriptedUser(lambda m: "no"))], [("g", "t")],
                               Scripted(tok, ["[action] red?", "[answer] blue"]), tok, SamplingParams(max_new_tokens=8))
    tr.messages[2]["content"] = tr.messages[2]["content"] + " (edited)"
    assert "differs" in check_drift(tok, tr)


def test_real_model_batched_rollout(tok):
    model = build_tiny_model(CFG, len(tok), tok.pad_token_id, tok.eos_token_id).eval()
    backend = TransformersBackend(model, tok, batch_size=4)
    gyms = [Guess({}, user=ScriptedUser(lambda m: "no"), rng=random.Random(i)) for i in range(4)]
    out = run_agent_episodes([ROW] * 4, gyms, [("g", f"t{i}") for i in range(4)], backend, tok,
                             SamplingParams(max_new_tokens=12, seed=1, stop_token_ids=None), max_turns=3)
    for tr in out:
        assert tr.invalid in (None, "env_error")     # a random agent may call [search] (the test gym raises)
        if tr.invalid is None:
            assert len(tr.turns) == 3 and check_drift(tok, tr) is None
            assert all(len(t.logprobs) == len(t.token_ids) for t in tr.turns)


def test_agent_rows_carry_multiturn_advantages(tok):
    from mimesis_lab.rl.advantages import multiturn_grpo
    from mimesis_lab.rl.agent_batch import agent_step_metrics, build_agent_rows
    from mimesis_lab.rl.policy import pad_update_rows

    scripts = [["[action] red?", "[answer] blue"], ["[answer] red", "[answer] green", "[answer] pink"]]
    trajs = []
    for k, texts in enumerate(scripts):
        trajs += run_agent_episodes([ROW], [Guess({}, user=ScriptedUser(lambda m: "no"))], [("g", f"t{k}")],
                                    Scripted(tok, texts), tok, SamplingParams(max_new_tokens=8))
    bad = run_agent_episodes([ROW], [Guess({})], [("g", "t9")], Scripted(tok, ["[search] x"]), tok,
                             SamplingParams(max_new_tokens=8))
    rows, stats = build_agent_rows(trajs + bad, gamma=0.8)
    want = multiturn_grpo([t.turn_rewards for t in trajs], [t.turn_lengths for t in trajs], ["g", "g"], gamma=0.8)
    assert [list(r.adv) for r in rows] == want and stats["trajectories_in_update"] == 2
    b = pad_update_rows(rows, tok.pad_token_id)
    assert b["adv"].shape == b["mask"].shape and int(b["mask"].sum()) == sum(r.n_response for r in rows)
    # env tokens between the turns are context: mask 0
    r0 = rows[0]
    env_pos = set(range(len(trajs[0].prompt_ids), len(r0.input_ids))) - set(r0.positions)
    assert env_pos and all(b["mask"][0, p - 1] == 0 for p in env_pos)
    m = agent_step_metrics(trajs + bad)
    assert m["rollouts"] == 3 and m["invalid/env_error"] == 1 and m["reward/mean"] == pytest.approx(0.55)
    zero_rows, zstats = build_agent_rows(trajs + bad, invalid_policy="zero")
    assert zstats["trajectories_in_update"] == 3


class _SlowUser:
    """A user side that takes ``delay`` seconds per reply and records how many replies overlap."""

    def __init__(self, shared, delay=0.3):
        self.shared, self.delay, self.replies = shared, delay, []

    def respond(self, messages):
        import threading
        import time

        from mimesis_lab.envs.gyms.base import UserReply

        with self.shared["lock"]:
            self.shared["now"] += 1
            self.shared["peak"] = max(self.shared["peak"], self.shared["now"])
        time.sleep(self.delay)
        with self.shared["lock"]:
            self.shared["now"] -= 1
        self.replies.append("no")
        return UserReply("no")


def test_a_rounds_gym_steps_reach_the_user_side_together(tok):
    """The gym steps of one round run concurrently: 8 users taking 0.3 s each answer in about 0.3 s a
    round, not 2.4 s; results are still applied per episode, in order."""
    import threading
    import time

    shared = {"lock": threading.Lock(), "now": 0, "peak": 0}
    users = [_SlowUser(shared) for _ in range(8)]
    gyms = [Guess({}, user=u) for u in users]
    t0 = time.perf_counter()
    out = run_agent_episodes([ROW] * 8, gyms, [("g", f"t{i}") for i in range(8)],
                             Scripted(tok, ["[action] red?"] * 8 + ["[answer] blue"] * 8), tok,
                             SamplingParams(max_new_tokens=8), users=users)
    wall = time.perf_counter() - t0
    assert shared["peak"] == 8 and wall < 1.6, (shared["peak"], wall)
    assert all(t.invalid is None and t.turn_rewards == [0.1, 1.0] for t in out)
    assert [t.turns[0].user_replies for t in out] == [1] * 8

    # step_workers bounds the threads; a step waiting for a free thread is not charged for the wait
    shared.update(now=0, peak=0)
    users = [_SlowUser(shared, delay=0.15) for _ in range(4)]
    out = run_agent_episodes([ROW] * 4, [Guess({}, user=u) for u in users], [("g", f"u{i}") for i in range(4)],
                             Scripted(tok, ["[action] red?"] * 4 + ["[answer] blue"] * 4), tok,
                             SamplingParams(max_new_tokens=8), step_workers=2, step_timeout_s=0.4)
    assert shared["peak"] == 2 and all(t.invalid is None for t in out), [t.invalid_detail for t in out]
    with pytest.raises(ValueError):
        run_agent_episodes([ROW], [Guess({})], [("g", "x")], Scripted(tok, []), tok, SamplingParams(), step_workers=0)


def test_run_concurrently_timeouts():
    import time
    from concurrent.futures import ThreadPoolExecutor

    from mimesis_lab.rollout.agent_rollout import _TIMED_OUT, run_concurrently

    def boom():
        raise KeyError("x")

    with ThreadPoolExecutor(2) as pool:
        t0 = time.monotonic()
        out = run_concurrently(pool, [lambda: 1, lambda: time.sleep(0.6), boom], timeout_s=0.2)
        assert out[0] == (1, None) and out[1] == (_TIMED_OUT, None) and isinstance(out[2][1], KeyError)
        assert time.monotonic() - t0 < 0.5
    with ThreadPoolExecutor(1) as pool:       # every thread stuck: a queued call times out too, no hang
        t0 = time.monotonic()
        out = run_concurrently(pool, [lambda: time.sleep(0.5), lambda: 2], timeout_s=0.15)
        assert [o[0] for o in out] == [_TIMED_OUT, _TIMED_OUT] and time.monotonic() - t0 < 0.4
