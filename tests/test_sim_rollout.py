"""Batched simulator rollouts: segments, response masks, validity (SPEC §2.3, §6)."""
from __future__ import annotations

import random

import pytest

from mimesis_lab.config import ModelParams
from mimesis_lab.envs.base import SimEpisode, TaskContext, TaskScore
from mimesis_lab.models import build_tiny_model
from mimesis_lab.rollout.backends import Generation, SamplingParams, TransformersBackend
from mimesis_lab.rollout.sim_rollout import is_refusal, render_prompt, run_episodes, score_rollouts

CFG = ModelParams(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=16, max_position_embeddings=512)


class Echo(SimEpisode):
    """Test-only task: a scripted partner answers 'noted' for ``turns`` simulator turns; score = 0.5."""

    data_source = "test_echo"

    def __init__(self, row, ctx, rng, turns=2):
        super().__init__(row, ctx, rng)
        self.turns = turns
        self.history = [{"role": "user", "content": "How can I help you?"}]

    def messages(self):
        return [{"role": "system", "content": "You are a customer."}, *self.history]

    def observe(self, parsed, public):
        self.public_log.append({"role": "user", "content": public})
        self.private_log.append({"role": "user", "reasoning": parsed.reasoning, "content": public})
        self.history += [{"role": "assistant", "content": public}, {"role": "user", "content": "noted"}]
        self.done = len(self.private_log) >= self.turns
        return self.done

    def score(self, judge):
        return judge(self) if judge else TaskScore(raw=0.5)


class Scripted:
    """Backend double returning fixed texts in order (the real backends are tested elsewhere)."""

    def __init__(self, texts):
        self.texts = list(texts)

    def generate_ids(self, prompt_ids, params):
        out = []
        for p in prompt_ids:
            t = self.texts.pop(0)
            out.append(Generation.failed(t[6:], p) if t.startswith("ERROR:") else
                       Generation(list(p), [7, 8], [-1.0, -2.0], t, "stop"))
        return out


@pytest.fixture(scope="module")
def tok():
    from mimesis_lab.tokenizer import train_tokenizer

    return train_tokenizer(["hello world, how can I help you with your order today? noted, customer."] * 30,
                           vocab_size=300, min_frequency=1)


def eps(n, turns=2):
    return [Echo({"task_id": f"t{i}"}, TaskContext(), random.Random(i), turns=turns) for i in range(n)]


def ids(n):
    return [(f"g{i // 2}", f"r{i}") for i in range(n)]


def test_real_backend_segments_match_prompts_and_logprobs(tok):
    model = build_tiny_model(CFG, len(tok), tok.pad_token_id, tok.eos_token_id).eval()
    backend = TransformersBackend(model, tok, batch_size=4)
    episodes = eps(4)
    out = run_episodes(episodes, ids(4), backend, tok, SamplingParams(max_new_tokens=6, seed=3, stop_token_ids=[]),
                       require_think=False)
    for r, e in zip(out, episodes):
        if r.invalid:      # a random model may emit nothing public; that must be recorded, never hidden
            assert r.invalid in ("empty_reply", "refusal") and r.invalid_detail
            continue
        assert len(r.segments) == 2 and e.done
        # the segment's prompt is exactly the rendering the simulator saw at that turn
        first = render_prompt(tok, [{"role": "system", "content": "You are a customer."},
                                    {"role": "user", "content": "How can I help you?"}])
        assert r.segments[0].prompt_ids == first
        assert all(len(s.token_ids) == len(s.logprobs) == 6 for s in r.segments)
        assert r.segments[1].prompt_ids[:len(first)] == first and len(r.segments[1].prompt_ids) > len(first)
        # max_new_tokens reached mid-reply: judged on what it says, the truncation is logged
        assert r.segments[0].finish_reason == "length"


def test_validity_reasons_are_recorded():
    texts = ["<think>go</think>hello", "ERROR:request timed out after 60s", "   ",
             "As an AI language model I cannot do that", "no think block here", "ERROR:boom",
             # second round, for the survivors (r0, r4)
             "<think>a</think>thanks", "<think>b</think>bye"]
    episodes = eps(6)
    out = run_episodes(episodes, ids(6), Scripted(texts), _FakeTok(), SamplingParams(max_new_tokens=4))
    assert [r.invalid for r in out] == [None, "timeout", "empty_reply", "refusal", None, "generation_error"]
    assert out[0].format_failures == 0 and out[4].format_failures == 1
    assert out[0].private_log[0]["reasoning"] == "go" and out[0].public_log[0]["content"] == "hello"
    assert out[4].public_log[0]["content"] == "no think block here"
    score_rollouts(out, episodes, None)
    assert out[0].update_reward == 0.5 and out[4].raw == 0.5 and out[4].update_reward == 0.0
    assert out[1].update_reward is None


def test_judge_failure_makes_the_rollout_invalid():
    episodes = eps(2, turns=1)
    out = run_episodes(episodes, ids(2), Scripted(["<think>a</think>hi", "<think>b</think>yo"]), _FakeTok(),
                       SamplingParams(max_new_tokens=4))
    score_rollouts(out, episodes, lambda ep: TaskScore.failed("judge_failure", "not JSON")
                   if ep.task_id == "t1" else TaskScore(raw=1.0))
    assert out[0].invalid is None and out[1].invalid == "judge_failure" and out[1].invalid_detail == "not JSON"


def test_context_overflow():
    out = run_episodes(eps(1), ids(1), Scripted([]), _FakeTok(), SamplingParams(max_new_tokens=4),
                       max_prompt_tokens=3)
    assert out[0].invalid == "context_overflow" and not out[0].segments


def test_refusal_detector():
    assert is_refusal("I'm sorry, but I can't help with that.") and is_refusal("As an AI, I don't shop")
    assert not is_refusal("I can't find my order, and I'm sorry to bother you")


class _FakeTok:
    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=True):
        return [1] * (2 + len(messages))


def test_reasoning_only_reply_is_a_format_failure_not_invalid():
    """An unclosed <think> (nothing public) ends the episode as the policy's format failure: valid,
    update reward 0 (a negative signal), unscored if no public turn happened."""
    episodes = eps(2)
    out = run_episodes(episodes, ids(2), Scripted(["<think>still thinking", "<think>a</think>hi",
                                                   "<think>never closed"]), _FakeTok(),
                       SamplingParams(max_new_tokens=4))
    score_rollouts(out, episodes, None)
    assert [r.invalid for r in out] == [None, None]
    assert out[0].ended_by_format_failure and out[0].raw is None and out[0].update_reward == 0.0
    assert out[1].ended_by_format_failure and out[1].raw == 0.5 and out[1].update_reward == 0.0
    from mimesis_lab.rl.sim_batch import build_update_rows, step_metrics

    rows, stats = build_update_rows(out)      # one row per rollout, its segments in it
    assert stats["segments_in_update"] == 3 and len(rows) == 2 and all(set(r.adv) == {0.0} for r in rows)
    m = step_metrics(out)
    assert m["rollouts_valid"] == 2 and m["reward/raw_mean"] == 0.5 and m["reward/update_mean"] == 0.0
